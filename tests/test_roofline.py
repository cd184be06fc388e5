"""The roofline of ``jaxnet bench``: FLOPs and bytes from XLA against hand counts, verdicts, peaks, plot."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from jaxnet.bench import roofline

# A device made up for the hand computations: ridge point at 10 FLOP per byte
PEAKS = {
    "device": "made up",
    "platform": "none",
    "peak_flops": {"float32": 1e12},
    "memory_bandwidth": 1e11,
    "source": "made up",
}


def matmul(m: int, k: int, n: int):
    return jax.jit(lambda a, b: a @ b).lower(jnp.ones((m, k)), jnp.ones((k, n))).compile()


def test_matmul_flops_and_bytes_match_a_hand_count():
    m, k, n = 64, 128, 32
    cost = roofline.step_cost(matmul(m, k, n))
    assert cost["flops"] == 2 * m * k * n  # a multiply and an add per term
    assert cost["bytes"] == 4 * (m * k + k * n + m * n)  # read both float32 operands, write the product
    assert cost["loops"] == "none" and cost["loop_trip_counts"] == []


def chained_products(outer: int, inner: int):
    """``h @ w`` applied ``outer * inner`` times, as a scan inside a scan."""

    def fn(h, w):
        def body(c, _):
            return jax.lax.scan(lambda c2, _: (c2 @ w, None), c, None, length=inner)[0], None

        return jax.lax.scan(body, h, None, length=outer)[0]

    return jax.jit(fn).lower(jnp.ones((8, 64)), jnp.ones((64, 64))).compile()


@pytest.mark.parametrize("outer, inner, trips", [(10, 1, [10]), (3, 4, [3, 4])])
def test_loop_bodies_count_once_per_iteration(outer, inner, trips):
    compiled = chained_products(outer, inner)
    products = outer * inner
    hand = products * 2 * 8 * 64 * 64
    cost = roofline.step_cost(compiled)
    assert hand <= cost["flops"] <= 1.001 * hand  # the products, and the loop counters' additions
    assert cost["bytes"] >= products * 4 * (8 * 64 + 64 * 64 + 8 * 64)  # each product reads h and w, writes h
    assert sorted(cost["loop_trip_counts"]) == trips  # a loop of one step is no loop
    if roofline.xla_counts_loop_bodies_once():  # what the correction is for
        assert roofline.xla_cost(compiled)["flops"] < hand / 2


@pytest.mark.parametrize(
    "n, steps_per_s, bound, attainable, fraction",
    [
        # 2 n^3 FLOPs over 12 n^2 bytes: intensity n / 6
        (12, 1e11 / (2 * 12**3), "memory-bound", 2e11, 0.5),  # intensity 2 < ridge 10: 2 * 1e11 B/s
        (600, 0.25e12 / (2 * 600**3), "compute-bound", 1e12, 0.25),  # intensity 100 > ridge 10
    ],
)
def test_verdict_and_fraction_of_the_roofline_by_hand(n, steps_per_s, bound, attainable, fraction):
    r = roofline.case_roofline(matmul(n, n, n), model_flops=0.0, steps_per_s=steps_per_s, dtype="float32", peaks=PEAKS)
    assert r["flops_source"] == "xla" and r["flops_per_step"] == 2 * n**3 and r["bytes_per_step"] == 12 * n**2
    assert r["intensity"] == pytest.approx(n / 6, rel=1e-3) and r["ridge"] == 10
    assert r["bound"] == bound
    assert r["attainable_flops"] == pytest.approx(attainable, rel=1e-3)
    assert r["fraction"] == pytest.approx(fraction, rel=1e-3)
    assert r["achieved_flops"] == pytest.approx(fraction * attainable, rel=1e-3)


def test_an_analytic_count_above_xlas_is_used_and_said():
    """XLA sees no FLOPs inside kernels it calls (cuDNN's); the analytic count is then the larger lower bound."""
    r = roofline.case_roofline(matmul(12, 12, 12), model_flops=34560.0, steps_per_s=1.0, dtype="float32", peaks=PEAKS)
    assert r["flops_per_step"] == 34560 and r["flops_xla"] == 3456 and r["flops_source"].startswith("analytic")
    assert r["intensity"] == pytest.approx(20.0) and r["bound"] == "compute-bound"


def test_unknown_peaks_give_intensity_without_a_verdict():
    r = roofline.point(100.0, 50.0, 2.0, None, None)
    assert r == {"intensity": 2.0}


def test_merged_records_are_placed_against_one_set_of_peaks():
    r = roofline.case_roofline(matmul(12, 12, 12), 0.0, 1e11 / 3456, "float32", PEAKS)
    faster = {**PEAKS, "memory_bandwidth": 2e11}  # ridge 5: still memory-bound, roof twice as high
    moved = roofline.replace_peaks({"dtype": "float32", "roofline": r}, faster)
    assert moved["ridge"] == 5 and moved["memory_bandwidth"] == 2e11
    assert moved["fraction"] == pytest.approx(0.25, rel=1e-3) and moved["flops_per_step"] == r["flops_per_step"]


def test_gpu_peaks_come_from_the_table_by_device_kind():
    bandwidth = roofline.MEMORY_BANDWIDTH
    assert roofline._lookup(bandwidth, "NVIDIA H100 80GB HBM3") == 3.35e12
    assert roofline._lookup(bandwidth, "NVIDIA H100 PCIe") == 2.0e12
    assert roofline._lookup(bandwidth, "NVIDIA H200") == 4.8e12
    assert roofline._lookup(bandwidth, "NVIDIA A100-SXM4-80GB") == 2.039e12
    assert roofline._lookup(bandwidth, "NVIDIA A100-SXM4-40GB") == 1.555e12
    assert roofline._lookup(bandwidth, "cpu") is None
    assert roofline._lookup(roofline.PEAK_F32_FLOPS, "NVIDIA H100 80GB HBM3") == 494.7e12


def test_cpu_peaks_are_measured():
    flops = roofline.measure_matmul_flops(n=256, seconds=0.05)
    bandwidth = roofline.measure_copy_bandwidth(megabytes=16, seconds=0.05)
    assert 1e8 < flops < 1e14 and 1e8 < bandwidth < 1e13  # (tests/test_bench.py checks device_peaks on a CPU)


def test_cpu_peaks_keep_the_best_measurement(monkeypatch):
    """Another process's load lowers a measurement and never raises one: the best one stands."""
    monkeypatch.setattr(roofline, "_MEASURED", {})
    flops, bandwidth = iter([5e10, 2e10, 8e10]), iter([1e10, 3e10, 2e10])
    monkeypatch.setattr(roofline, "measure_matmul_flops", lambda dtype: next(flops))
    monkeypatch.setattr(roofline, "measure_copy_bandwidth", lambda: next(bandwidth))
    assert roofline.device_peaks(("float32",))["peak_flops"] == {"float32": 5e10}
    roofline.remeasure(("float32",))
    peaks = roofline.device_peaks(("float32",))
    assert peaks["peak_flops"] == {"float32": 5e10} and peaks["memory_bandwidth"] == 3e10
    roofline.remeasure(("float32",))
    peaks = roofline.device_peaks(("float32",))
    assert peaks["peak_flops"] == {"float32": 8e10} and peaks["memory_bandwidth"] == 3e10


def test_plot_writes_a_png(tmp_path):
    cases = {
        "a": {"dtype": "float32", "roofline": roofline.case_roofline(matmul(12, 12, 12), 0.0, 1e7, "float32", PEAKS)},
        "b": {"dtype": "float32", "roofline": roofline.case_roofline(matmul(60, 60, 60), 0.0, 1e5, "float32", PEAKS)},
    }
    path = tmp_path / "roofline.png"
    roofline.plot(cases, PEAKS, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = roofline.table(cases, PEAKS)
    assert "memory-bound" in text and "compute-bound" in text and "made up" in text
