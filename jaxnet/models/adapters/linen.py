"""A Flax Linen module behind the model seam: its own ``init`` and ``apply``, called as they are."""

from __future__ import annotations

from typing import Any

import flax.linen as nn


class Linen:
    """``module.init`` and ``module.apply`` unchanged: Linen's convention is the seam's."""

    is_jaxnet_adapter = True

    def __init__(self, module: nn.Module):
        self.module = module
        self.name = type(module).__name__

    def init(self, rngs: dict[str, Any], *inputs: Any, train: bool = False, **keywords: Any) -> Any:
        """The module's variables (parameters with their logical-axis boxes, and its collections)."""
        return self.module.init(rngs, *inputs, **keywords, train=train)

    def apply(
        self,
        variables: dict[str, Any],
        *inputs: Any,
        train: bool,
        rngs: dict | None = None,
        mutable: Any = False,
        **keywords: Any,
    ) -> Any:
        """The module's outputs, and with ``mutable`` its updated collections."""
        return self.module.apply(variables, *inputs, **keywords, train=train, rngs=rngs, mutable=mutable)
