"""Floating-point operations per training step, counted analytically, and model FLOP utilisation.

Only matrix products and convolutions are counted (2 FLOPs per multiply-add, and for a
convolution only the kernel positions that fall on the image, not on its zero padding), as is
usual for MFU: normalisations, activations and the softmax are a few percent at the standard shapes. A
training step costs three forward passes (the backward pass computes gradients with respect to
both activations and weights, each as costly as the forward products).

**Causal attention** is counted as the work that is needed: query ``i`` looks at keys
``0..i``, so a sequence of ``T`` tokens has ``T (T + 1) / 2`` query-key pairs, not ``T**2``.
``causal=False`` counts the full square, which is what an attention kernel that masks rather
than skips computes (and what XLA's own cost analysis reports for it); the tests check that
count against XLA's. A bidirectional model (``model.causal=False``) needs every pair, so its
count is the full square whatever ``causal`` says.

    >>> forward_flops(cfg.model, batch=32, seq_len=128, vocab=84)   # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

# Dense bfloat16 peak of one device, FLOP/s (vendor data sheets; no sparsity). Matched against
# ``jax.Device.device_kind`` by substring, first match wins. CPUs have no entry: their peak
# depends on cores, clocks and vector units, so MFU is not reported for them.
PEAK_BF16_FLOPS: tuple[tuple[str, float], ...] = (
    ("H200", 989e12),
    ("H100 PCIe", 756e12),
    ("H100", 989e12),  # SXM
    ("A100", 312e12),
    ("L4", 121e12),
    ("A10G", 125e12),
    ("V100", 125e12),  # float16 tensor cores
    ("TPU v5p", 459e12),
    ("TPU v5 lite", 197e12),
    ("TPU v4", 275e12),
)


# Dense float8 peak of one device, FLOP/s, where the device has float8 matrix units (vendor data
# sheets, no sparsity: H100 SXM and H200 3,958 TFLOP/s with sparsity, half of it dense; H100 PCIe
# 3,026). Twice the bf16 peak; MFU is still reported against the bf16 peak (what comparisons of
# float8 training runs quote), this one is for a plan's compute bound of float8 products.
PEAK_FP8_FLOPS: tuple[tuple[str, float], ...] = (
    ("H200", 1979e12),
    ("H100 PCIe", 1513e12),
    ("H100", 1979e12),  # SXM
)


def peak_flops(device_kind: str, dtype: str = "bfloat16") -> float | None:
    """Dense peak FLOP/s of one device of this kind for matrix products in ``dtype`` (``bfloat16``,
    or ``float8`` where the device has float8 matrix units), or None if unknown (every CPU).

    >>> peak_flops("NVIDIA H100 80GB HBM3"), peak_flops("NVIDIA H100 80GB HBM3", "float8")
    (989000000000000.0, 1979000000000000.0)
    """
    table = PEAK_FP8_FLOPS if dtype == "float8" else PEAK_BF16_FLOPS
    for name, peak in table:
        if name.lower() in device_kind.lower():
            return peak
    return None


def mfu(flops_per_step: float, steps_per_s: float, device_kind: str, devices: int = 1) -> float | None:
    """Model FLOP utilisation: achieved FLOP/s over the peak of ``devices`` devices (None if unknown)."""
    peak = peak_flops(device_kind)
    return None if peak is None else flops_per_step * steps_per_s / (peak * devices)


def forward_flops(model: Any, *, batch: int, input_shape: tuple, vocab: int, causal: bool = True) -> float:
    """Forward FLOPs of the model a family's config (e.g. :class:`~jaxnet.models.TransformerConfig`)
    describes: the family counts its own (:meth:`~jaxnet.models.base.ModelConfig.forward_flops`).

    ``input_shape`` is ``(seq_len,)`` for language models and ``(height, width, channels)`` for
    images; ``vocab`` is the vocabulary size or the number of classes. A family without a count is
    a ``ValueError``.
    """
    count = model.forward_flops(batch=batch, input_shape=tuple(input_shape), outputs=vocab, causal=causal)
    if count is None:
        raise ValueError(f"no FLOP count for model.name={model.name}")
    return count


def train_step_flops(model: Any, *, batch: int, input_shape: tuple, vocab: int, causal: bool = True) -> float:
    """FLOPs of one training step: three forward passes (forward, and backward for activations and weights)."""
    return 3 * forward_flops(model, batch=batch, input_shape=input_shape, vocab=vocab, causal=causal)
