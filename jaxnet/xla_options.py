"""The XLA compiler options jaxnet compiles its steps with, per platform.

On a CPU, XLA hands dots, convolutions and reductions to its YNNPACK library by default, and
runs each YNNPACK convolution on one thread: the ConvNet's convolutions, most of its step, left
one of two cores idle. XLA's own (Eigen) convolution uses every core and does the same work
(scripts/profile_conv.py; benchmarks/results/conv-cpu-*.json). :func:`compiler_options` keeps
YNNPACK for dots and reductions and gives convolutions back to XLA, for the programs jaxnet
compiles (train, multi-step and evaluation steps, the sweep's step); anything else a program
jits is untouched. A ``--xla_cpu_experimental_ynn_fusion_type`` in ``$XLA_FLAGS`` is the user's
choice and wins (``XLA_FLAGS=--xla_cpu_experimental_ynn_fusion_type=`` sends every operation
to XLA's own kernels). A jaxlib that lacks the option compiles with its defaults.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import jax
import jax.numpy as jnp

YNN_FUSION_TYPES = "xla_cpu_experimental_ynn_fusion_type"
# XLA's default list (dots, convolutions, reductions) less the convolutions.
CPU_YNN_FUSION_TYPES = "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT,LIBRARY_FUSION_TYPE_REDUCE"


def compiler_options(mesh: Any = None) -> dict[str, str] | None:
    """``compiler_options`` for ``jax.jit`` of a step that runs on ``mesh`` (default: the default
    backend's devices): a dict on a CPU, else None (XLA's defaults). For example::

        step = jax.jit(train_step, compiler_options=compiler_options(mesh))
    """
    platform = jax.default_backend() if mesh is None else mesh.devices.flat[0].platform
    if platform != "cpu" or YNN_FUSION_TYPES in os.environ.get("XLA_FLAGS", ""):
        return None
    return _cpu_options()


@functools.cache
def _cpu_options() -> dict[str, str] | None:
    """The CPU options if this jaxlib takes them (checked once, on a tiny program), else None."""
    options = {YNN_FUSION_TYPES: CPU_YNN_FUSION_TYPES}
    try:
        jax.jit(jnp.sin).lower(jnp.zeros(2, jnp.float32)).compile(compiler_options=options)
    except Exception:  # an unknown option or value: jaxlib raises its runtime error
        return None
    return options
