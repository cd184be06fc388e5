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


def peak_flops(device_kind: str) -> float | None:
    """Dense bf16 peak FLOP/s of one device of this kind, or None if unknown (every CPU)."""
    for name, peak in PEAK_BF16_FLOPS:
        if name.lower() in device_kind.lower():
            return peak
    return None


def mfu(flops_per_step: float, steps_per_s: float, device_kind: str, devices: int = 1) -> float | None:
    """Model FLOP utilisation: achieved FLOP/s over the peak of ``devices`` devices (None if unknown)."""
    peak = peak_flops(device_kind)
    return None if peak is None else flops_per_step * steps_per_s / (peak * devices)


def transformer_forward(
    *, batch: int, seq_len: int, vocab: int, layers: int, width: int, mlp_ratio: int, causal: bool = True
) -> float:
    """Forward FLOPs of :class:`~jaxnet.models.TransformerLanguageModel` on ``batch`` x ``seq_len`` tokens."""
    tokens = batch * seq_len
    projections = 2 * tokens * (3 * width * width + width * width + 2 * mlp_ratio * width * width)
    pairs = seq_len * (seq_len + 1) / 2 if causal else seq_len * seq_len
    attention = 2 * 2 * batch * pairs * width  # scores q.k and the weighted sum of v, over all heads
    logits = 2 * tokens * width * vocab
    return layers * (projections + attention) + logits


def lstm_forward(*, batch: int, seq_len: int, vocab: int, layers: int, width: int) -> float:
    """Forward FLOPs of :class:`~jaxnet.models.LSTMLanguageModel` (input and recurrent products
    of the 4 gates per layer, then the output projection)."""
    tokens = batch * seq_len
    per_layer = 2 * tokens * (width * 4 * width + width * 4 * width)
    return layers * per_layer + 2 * tokens * width * vocab


def _taps(size: int, kernel: int, stride: int) -> int:
    """Kernel positions that land on the input, summed over the outputs of one axis of a 'SAME'
    convolution (positions over the zero padding multiply nothing and are not counted)."""
    out = -(-size // stride)
    pad = max((out - 1) * stride + kernel - size, 0) // 2
    return sum(1 for o in range(out) for t in range(kernel) if 0 <= o * stride + t - pad < size)


def _conv(batch: int, size: int, kernel: int, c_in: int, c_out: int, stride: int = 1) -> float:
    """A square 'SAME' convolution of a ``size`` x ``size`` input."""
    return 2 * batch * _taps(size, kernel, stride) ** 2 * c_in * c_out


def convnet_forward(*, batch: int, height: int, channels: int, features: tuple, hidden: int, classes: int) -> float:
    """Forward FLOPs of :class:`~jaxnet.models.ConvNet` on square ``height`` x ``height`` images."""
    total, size, c_in = 0.0, height, channels
    for c_out in features:
        total += _conv(batch, size, 3, c_in, c_out)
        size, c_in = size // 2, c_out
    flat = size * size * c_in
    return total + 2 * batch * (flat * hidden + hidden * classes)


def resnet_forward(*, batch: int, height: int, channels: int, features: tuple, blocks: tuple, classes: int) -> float:
    """Forward FLOPs of :class:`~jaxnet.models.ResNet` (convolutions, projection shortcuts, classifier)."""
    total, size = _conv(batch, height, 3, channels, features[0]), height
    c_in = features[0]
    for stage, (c_out, count) in enumerate(zip(features, blocks, strict=True)):
        for block in range(count):
            stride = 2 if stage > 0 and block == 0 else 1
            if c_in != c_out or stride > 1:
                total += _conv(batch, size, 1, c_in, c_out, stride)  # projection shortcut
            total += _conv(batch, size, 3, c_in, c_out, stride)
            size = -(-size // stride)
            total += _conv(batch, size, 3, c_out, c_out)
            c_in = c_out
    return total + 2 * batch * c_in * classes


def forward_flops(model: Any, *, batch: int, input_shape: tuple, vocab: int, causal: bool = True) -> float:
    """Forward FLOPs of the model a built-in family's config (e.g. :class:`~jaxnet.models.TransformerConfig`) describes.

    ``input_shape`` is ``(seq_len,)`` for language models and ``(height, width, channels)`` for
    images; ``vocab`` is the vocabulary size or the number of classes.
    """
    if model.name == "transformer":
        return transformer_forward(
            batch=batch,
            seq_len=input_shape[0],
            vocab=vocab,
            layers=model.layers,
            width=model.width,
            mlp_ratio=model.mlp_ratio,
            causal=causal and getattr(model, "causal", True),
        )
    if model.name == "lstm":
        return lstm_forward(batch=batch, seq_len=input_shape[0], vocab=vocab, layers=model.layers, width=model.width)
    height, _, channels = input_shape
    images = {
        "batch": batch,
        "height": height,
        "channels": channels,
        "features": tuple(model.features),
        "classes": vocab,
    }
    if model.name == "convnet":
        return convnet_forward(**images, hidden=model.hidden)
    if model.name == "resnet":
        return resnet_forward(**images, blocks=tuple(model.blocks))
    raise ValueError(f"no FLOP count for model.name={model.name}")


def train_step_flops(model: Any, *, batch: int, input_shape: tuple, vocab: int, causal: bool = True) -> float:
    """FLOPs of one training step: three forward passes (forward, and backward for activations and weights)."""
    return 3 * forward_flops(model, batch=batch, input_shape=input_shape, vocab=vocab, causal=causal)
