"""Training: the state pytree, the pure steps, and the runner around them."""

from jaxnet.train.evaluation import evaluate
from jaxnet.train.loop import Run, train
from jaxnet.train.state import TrainState

__all__ = ["Run", "TrainState", "evaluate", "train"]
