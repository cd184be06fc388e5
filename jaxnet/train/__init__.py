"""Training: the state pytree, the pure steps, and the runner around them."""

from jaxnet.train.loop import Run, evaluate, train
from jaxnet.train.state import TrainState

__all__ = ["Run", "TrainState", "evaluate", "train"]
