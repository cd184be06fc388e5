"""``jaxnet plan``: the real train step compiled for GPUs on this CPU-only machine (deviceless).

Needs the CUDA plugin wheels (``planner.INSTALL``; scripts/test installs them into .venv/jaxnet-plan,
which tests/conftest.py puts on this process's path); without them every test here is skipped with
that reason.
"""

from __future__ import annotations

import importlib.machinery
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import cpu_env, needs_fashion_mnist

from jaxnet import cli, config, planner
from jaxnet.bench import roofline

pytestmark = pytest.mark.skipif(
    planner.plugin_missing() is not None,
    reason=f"the CUDA plugin wheels are not installed ({planner.plugin_missing()}): {planner.INSTALL}",
)

_PLANS: dict[tuple, dict] = {}


def plan_of(spec: str, *overrides: str, gpus: int | None = None, target: str = "h100", **kw) -> dict:
    """The plan of ``spec`` with ``overrides``, computed once per test process."""
    key = (spec, overrides, gpus, target, tuple(sorted(kw)))
    if key not in _PLANS:
        _PLANS[key] = planner.plan(config.load_experiment(spec, list(overrides)), target, gpus, **kw)
    return _PLANS[key]


def test_target_files_agree_with_the_peak_tables():
    """Every shipped target names a device kind the FLOP and bandwidth tables know, with the same
    bandwidth, and its memory in the data sheets' range."""
    assert planner.targets() == ["a100", "h100", "h200"]
    for name in planner.targets():
        t = planner.load_target(name)
        assert t.peak_flops("bfloat16") in (312e12, 989e12)
        assert t.bandwidth == roofline._lookup(roofline.MEMORY_BANDWIDTH, t.device_kind)
        assert 80e9 <= t.memory_bytes <= 152e9
        assert "datasheet" in t.source


@pytest.mark.parametrize("spec", ["transformer_shakespeare:smoke", "bert_shakespeare:smoke"])
def test_transformers_compile_to_cudnn_attention_and_bf16_matmuls(spec):
    """auto resolves for the GPU: bfloat16 compute, cuDNN's fused attention forward and backward in
    each of the 2 blocks, every matrix product in bf16; the attention FLOPs XLA cannot count are
    added by formula, and the total is within 15 % of jaxnet.flops' count."""
    p = plan_of(spec)
    assert p["compute_dtype"] == "bfloat16"
    assert p["kernels"]["cudnn_attention"] == {"forward": 2, "backward": 2}
    assert set(p["kernels"]["matmul_dtypes"]) == {"bf16"}
    assert p["kernels"]["gemm_fusions"]["triton"] > 0
    assert p["fits"] and p["memory"]["device"] == 85520809984
    f = p["flops_per_step"]
    assert f["cudnn_attention_by_formula"] > 0
    assert 1.0 <= f["ratio_xla_to_flops_py"] < 1.15 and f["source"].startswith("xla")
    assert p["prediction"]["predicted_step_s"] == max(p["prediction"]["compute_s"], p["prediction"]["memory_s"])


def test_attention_flops_by_formula_match_flops_py():
    """transformer_shakespeare:smoke (batch 8, context 32, width 32, 2 causal layers): cuDNN's
    attention counted from the compiled calls' shapes equals jaxnet.flops' causal attention term
    times 3 (forward + backward)."""
    p = plan_of("transformer_shakespeare:smoke")
    pairs = 32 * 33 / 2
    assert p["flops_per_step"]["cudnn_attention_by_formula"] == 3 * 2 * (2 * 2 * 8 * pairs * 32)


def test_lstm_plans_on_its_scan_path_and_says_why():
    p = plan_of("lstm_shakespeare:smoke")
    assert "cannot be traced without a GPU" in p["caveats"][0] and "lax.scan" in p["caveats"][0]
    assert p["kernels"]["while_loops"] >= 1
    assert p["kernels"]["cudnn_attention"] == {"forward": 0, "backward": 0}
    assert p["fits"]


@needs_fashion_mnist
def test_cnn_compiles_for_one_h100():
    p = plan_of("cnn_fashion_mnist:smoke")
    assert p["gpus"] == 1 and p["fits"] and p["compile_s"] > 0
    assert p["kernels"]["matmul_dtypes"].get("bf16 (cuDNN convolution)", 0) > 0
    assert p["flops_per_step"]["source"].startswith("jaxnet.flops")  # XLA cannot count inside cuDNN's calls


def test_eight_gpus_data_fsdp_tensor_compile_with_collectives():
    """A mesh of 8 H100s (data=2, fsdp=2, tensor=2): the program gathers and reduces; each device
    holds less of the parameters than one GPU does."""
    p = plan_of("transformer_shakespeare:smoke", "mesh.data=2", "mesh.fsdp=2", "mesh.tensor=2", gpus=8)
    one = plan_of("transformer_shakespeare:smoke")
    assert p["mesh"] == {"data": 2, "fsdp": 2, "tensor": 2}
    collectives = p["kernels"]["collectives"]
    assert collectives["all-reduce"]["count"] > 0 and collectives["all-gather"]["count"] > 0
    assert all(c["bytes"] > 0 for c in collectives.values())
    assert p["memory"]["params"] < 0.5 * one["memory"]["params"]
    assert one["kernels"]["collectives"] == {}


def test_fsdp_over_8_gpus_holds_at_most_a_fifth_of_the_arguments():
    """gpt2_small:smoke with fsdp=8: per-device arguments (parameters, optimizer state, batch) at
    most 0.2 of one GPU's, as the full gpt2_small must (the slow test below)."""
    eight = plan_of("gpt2_small:smoke", "mesh.fsdp=8", gpus=8)
    one = plan_of("gpt2_small:smoke")
    assert eight["fits"] and eight["memory"]["arguments"] <= 0.2 * one["memory"]["arguments"]


@pytest.mark.slow
def test_gpt2_small_fits_8_h100s_with_fsdp_and_a_fifth_of_the_arguments():
    eight = plan_of("gpt2_small", "mesh.fsdp=8", gpus=8)
    one = plan_of("gpt2_small")
    assert eight["fits"] and one["kernels"]["cudnn_attention"] == {"forward": 12, "backward": 12}
    assert eight["memory"]["arguments"] <= 0.2 * one["memory"]["arguments"]


def small_target(tmp_path: Path, mebibytes: int) -> str:
    """An H100 with only ``mebibytes`` of memory: the batch search then needs few compiles."""
    text = (Path(planner.__file__).parent / "targets" / "h100.txt").read_text()
    path = tmp_path / "h100-small.txt"
    path.write_text(text.replace("memory_bytes: 85520809984", f"memory_bytes: {mebibytes << 20}"))
    return str(path)


@pytest.mark.slow  # about 8 compiles: 130 s on a loaded 2-core CPU
def test_max_batch_returns_a_size_whose_next_multiple_does_not_fit(tmp_path):
    """On an H100 with 4 MiB, the largest batch that fits within 90 % of it fits, the next multiple
    of the data-parallel size does not, and a plan at double the size says it does not fit."""
    target = small_target(tmp_path, 4)
    p = plan_of("transformer_shakespeare:smoke", target=target, max_batch=True)
    best = p["max_batch_size"]
    assert best["batch_size"] >= 1 and best["next_size"] == best["batch_size"] + 1
    assert best["memory_at"] <= best["usable"] < best["memory_at_next"]
    double = plan_of("transformer_shakespeare:smoke", f"train.batch_size={2 * best['batch_size']}", target=target)
    assert not double["fits"]


@needs_fashion_mnist
def test_too_large_for_80_gb_says_does_not_fit_and_exits_0(tmp_path, capsys):
    """A dense layer of 10 M units after the convolutions (31 G parameters): one line says it does
    not fit with the numbers, the JSON says fits false, exit code 0."""
    out = tmp_path / "plan.json"
    code = cli.main(["plan", "cnn_fashion_mnist:smoke", "model.hidden=10000000", "--target", "h100", "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0
    assert "DOES NOT FIT" in printed and "of 79.6 GiB per device" in printed
    report = json.loads(out.read_text())
    assert report["fits"] is False and report["memory"]["total"] > report["memory"]["usable"]
    assert report["memory"]["params"] > 120e9


def test_plugin_missing_is_one_line_and_exit_2(monkeypatch, capsys):
    monkeypatch.setattr(planner, "plugin_missing", lambda: "jax-cuda12-plugin")
    code = cli.main(["plan", "transformer_shakespeare:smoke", "--target", "h100"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.splitlines() == [
        f"jaxnet: error: jaxnet plan needs the CUDA plugin wheels (jax-cuda12-plugin is missing): {planner.INSTALL}"
    ]


def test_a_users_own_model_data_and_task_plan_too():
    """jaxnet.plan with a Flax module, arrays and a regression task of one's own: 64 x 16 inputs
    through Dense(32) and Dense(1): XLA counts at least the products of the forward pass and of both
    weight gradients, 2 x 2 x 64 x (16 x 32 + 32 x 1) FLOPs, plus the second layer's input gradient
    (the first's is not needed), 2 x 64 x 32; the parameters are 16 x 32 + 32 + 32 + 1 float32s."""
    import flax.linen as nn
    import numpy as np

    import jaxnet

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x, train=False):
            return nn.Dense(1)(nn.relu(nn.Dense(32)(x)))[..., 0]

    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 16)).astype(np.float32)
    data = jaxnet.data.arrays(train={"x": x, "y": np.zeros(256, np.float32)})
    cfg = jaxnet.apply_overrides(jaxnet.Config(), ["train.batch_size=64", "data.name=arrays"])
    p = jaxnet.plan(cfg, "a100", model=MLP(), dataset=data, task=jaxnet.tasks.regression(inputs="x", target="y"))
    assert p["fits"] and p["device_kind"] == "NVIDIA A100-SXM4-80GB" and p["model"] == "MLP"
    assert p["memory"]["params"] == 4 * (16 * 32 + 32 + 32 + 1)
    products = 2 * 2 * 64 * (16 * 32 + 32) + 2 * 64 * 32
    assert products <= p["flops_per_step"]["xla_cost_analysis"] < 1.3 * products
    assert p["flops_per_step"]["jaxnet_flops_py"] is None  # not a built-in family: no analytic count


in_plan_dir = pytest.mark.skipif(
    not (planner.plan_dir() / "jax_cuda12_plugin").is_dir()
    or importlib.machinery.PathFinder.find_spec(
        "jax_cuda12_plugin", [p for p in sys.path if p != str(planner.plan_dir())]
    )
    is not None,
    reason=f"the plan wheels are not only in their own directory {planner.plan_dir()} (installed beside jaxnet?)",
)


@in_plan_dir
def test_the_command_plans_with_the_wheels_of_its_own_directory_and_logs_nothing(tmp_path):
    """A `jaxnet plan` process starts without the plugin (as every jaxnet process does) and plans
    with the wheels of planner.plan_dir(): cuDNN attention compiled, cuDNN's version recorded, and
    not one line on stderr."""
    out = tmp_path / "t.json"
    command = [sys.executable, "-m", "jaxnet", "plan", "transformer_shakespeare:smoke", "--target", "h100"]
    done = subprocess.run([*command, "--out", str(out)], env=cpu_env(), capture_output=True, text=True, timeout=300)
    assert (done.returncode, done.stderr) == (0, "")
    report = json.loads(out.read_text())
    assert report["kernels"]["cudnn_attention"] == {"forward": 2, "backward": 2}
    assert report["versions"]["nvidia-cudnn-cu12"] == "9.28.0.42"


@in_plan_dir
def test_other_jax_processes_do_not_load_the_plugin_and_plan_says_how_to():
    """Any other process (here: jax.devices() then jaxnet.plan from Python) runs without the plugin
    and prints nothing to stderr; jaxnet.plan then says in one line how to start Python."""
    script = (
        "import jax, jaxnet\n"
        "print(jax.devices())\n"
        "try:\n"
        "    jaxnet.plan(jaxnet.load_experiment('transformer_shakespeare:smoke'), 'h100')\n"
        "except jaxnet.UserError as e:\n"
        "    print(e)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], env=cpu_env(), capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.splitlines() == [
        "[CpuDevice(id=0)]",
        f"JAX was imported without the CUDA plugin wheels on its path; start Python with "
        f"PYTHONPATH={planner.plan_dir()} JAX_PLATFORMS=cpu (or use the jaxnet plan command)",
    ]
