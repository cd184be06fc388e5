"""Two pure functions behind the model seam: :class:`Model` (``init``, ``apply``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from jaxnet.errors import UserError


@dataclass(frozen=True)
class Model:
    """A model as two pure functions: ``init(rng, *inputs) -> params`` (any pytree of arrays,
    made from a batch of one sample) and ``apply(params, *inputs, train, rng) -> outputs`` (a
    batch in, outputs with the batch as leading axis out; ``rng`` is a key in training, for
    dropout, and None in evaluation)::

        def init(rng, x):
            return {"w": jax.random.normal(rng, (x.shape[-1], 1)) * 0.1, "b": jnp.zeros(1)}

        def apply(params, x, train, rng):
            return (x @ params["w"] + params["b"])[:, 0]

        jaxnet.train(cfg, "runs/linear", model=jaxnet.Model(init, apply), dataset=data, task=task)
    """

    init: Callable[..., Any]
    apply: Callable[..., Any]

    def __post_init__(self) -> None:
        for name in ("init", "apply"):
            given = getattr(self, name)
            if not callable(given):
                raise UserError(f"jaxnet.Model({name}=...) must be a function; got a {type(given).__name__}")


class Functions:
    """A :class:`Model` under the seam's convention: ``params`` are the variables' ``params``; it has
    no model state."""

    is_jaxnet_adapter = True

    def __init__(self, model: Model):
        self.model = model
        self.name = "Model"

    def init(self, rngs: dict[str, Any], *inputs: Any, train: bool = False, **keywords: Any) -> dict[str, Any]:
        """``{"params": init(rngs["params"], *inputs, **keywords)}``."""
        return {"params": self.model.init(rngs["params"], *inputs, **keywords)}

    def apply(
        self,
        variables: dict[str, Any],
        *inputs: Any,
        train: bool,
        rngs: dict | None = None,
        mutable: Any = False,
        **keywords: Any,
    ) -> Any:
        """``apply(params, *inputs, train=train, rng=..., **keywords)``, whose outputs must keep the batch axis."""
        rng = (rngs or {}).get("dropout") if train else None
        outputs = self.model.apply(variables["params"], *inputs, **keywords, train=train, rng=rng)
        rows = np.shape(inputs[0])[0] if inputs else None
        for leaf in jax.tree.leaves(outputs):
            if rows is not None and np.shape(leaf)[:1] != (rows,):
                raise UserError(
                    f"jaxnet.Model: apply returned outputs of shape {list(np.shape(leaf))} for a batch of {rows}; "
                    "return one row per example (the batch as leading axis)"
                )
        return outputs if mutable is False else (outputs, {})
