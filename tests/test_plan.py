"""``jaxnet plan``: the real train step compiled for GPUs on this CPU-only machine (deviceless).

Needs the CUDA plugin wheels (``planner.INSTALL``; scripts/test installs them into .venv/jaxnet-plan,
which tests/conftest.py puts on this process's path); without them every test here is skipped with
that reason.
"""

from __future__ import annotations

import importlib.machinery
import json
import math
import sys
from pathlib import Path

import pytest
from conftest import cpu_env, fails, needs_fashion_mnist, run_patiently

from jaxnet import cli, config, plan_search, planner
from jaxnet.bench import roofline

pytestmark = pytest.mark.skipif(
    planner.plugin_missing() is not None,
    reason=f"the CUDA plugin wheels are not installed ({planner.plugin_missing()}): {planner.INSTALL}",
)

_PLANS: dict[tuple, dict] = {}


def plan_of(spec: str, *overrides: str, gpus: int | None = None, target: str = "h100", **kw) -> dict:
    """The plan of ``spec`` with ``overrides``, computed once per test process."""
    key = (spec, overrides, gpus, target, tuple(sorted(kw.items())))
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
        # NVLink one way: half the data sheets' 900 GB/s (Hopper) or 600 GB/s (A100); one NIC per GPU
        assert t.number("nvlink_bandwidth") == {"a100": 300e9}.get(name, 450e9)
        assert t.number("network_bandwidth") == {"a100": 200e9 / 8}.get(name, 400e9 / 8)
        assert t.number("gpus_per_node") == 8 and "NVLink" in t.source and "ConnectX" in t.source


@pytest.mark.parametrize("spec", ["transformer_shakespeare:smoke", "bert_shakespeare:smoke"])
def test_transformers_compile_to_cudnn_attention_and_bf16_matmuls(spec):
    """auto resolves for the GPU: bfloat16 compute, cuDNN's fused attention forward and backward in
    each of the 2 blocks, every matrix product in bf16; the attention FLOPs XLA cannot count are
    added by formula, and the total is within 15 % of jaxnet.flops' count."""
    p = plan_of(spec)
    assert p["compute_dtype"] == "bfloat16"
    assert p["kernels"]["cudnn_attention"] == {"forward": 2, "backward": 2}
    a = p["attention"]  # unpacked rows: the causal kernel, no mask as a bias (packed: tests/test_prepare_chat.py)
    assert (a["kernel"], a["bias"], a["packed"], a["model_attention"]) == ("cudnn", False, False, "cudnn")
    assert a["cudnn_calls"] == ["__cudnn$fmhaSoftmax", "__cudnn$fmhaSoftmaxBackward"]
    assert set(p["kernels"]["matmul_dtypes"]) == {"bf16"}
    assert p["kernels"]["gemm_fusions"]["triton"] > 0
    assert p["fits"] and p["memory"]["device"] == 85520809984
    f = p["flops_per_step"]
    assert f["cudnn_attention_by_formula"] > 0
    assert 1.0 <= f["ratio_xla_to_flops_py"] < 1.15 and f["source"].startswith("xla")
    bounds = [p["prediction"][f"{b}_s"] for b in ("compute", "memory", "launch")]
    assert p["prediction"]["predicted_step_s"] == max(bounds)


def test_attention_flops_by_formula_match_flops_py():
    """transformer_shakespeare:smoke (batch 8, context 32, width 32, 2 causal layers): cuDNN's
    attention counted from the compiled calls' shapes equals jaxnet.flops' causal attention term
    times 3 (forward + backward)."""
    p = plan_of("transformer_shakespeare:smoke")
    pairs = 32 * 33 / 2
    assert p["flops_per_step"]["cudnn_attention_by_formula"] == 3 * 2 * (2 * 2 * 8 * pairs * 32)


def test_fp8_compiles_the_projections_to_float8_gemms_and_counts_them_at_the_float8_peak():
    """transformer_shakespeare:smoke with model.matmul=fp8 on an H100: each of the 2 blocks' four
    products (queries/keys/values together, attention's output, the MLP's two) is a float8 GEMM
    forward (e4m3 x e4m3) and two backward (an e5m2 gradient with an e4m3 operand, either first as
    XLA orders them): 24 float8 GEMMs; the tied output layer's 3 products stay bf16. Their FLOPs are
    those of the projections, 3 x 2 x 256 tokens x 2 x (32 x 96 + 32 x 32 + 2 x 32 x 128), taken
    at the float8 peak (the data sheet's, about twice the bf16 one) in the compute bound."""
    p = plan_of("transformer_shakespeare:smoke", "model.matmul=fp8")
    dtypes = p["kernels"]["matmul_dtypes"]
    assert set(dtypes) == {"bf16", "f8e4m3fn", "f8e5m2"} and dtypes["bf16"] == 3
    assert dtypes["f8e4m3fn"] + dtypes["f8e5m2"] == 24 and min(dtypes["f8e4m3fn"], dtypes["f8e5m2"]) >= 8
    f = p["flops_per_step"]
    assert f["fp8"] == 3 * 2 * 256 * 2 * (32 * 96 + 32 * 32 + 2 * 32 * 128)
    assert set(f["matmuls_by_dtype"]) == {"bf16", "f8e4m3fn", "f8e5m2"}
    pred = p["prediction"]
    assert pred["peak_fp8_flops"] == 1979e12 and pred["peak_flops"] == 989e12  # the data sheet: 3,958 and 1,979 sparse
    expected = (f["per_device"] - f["fp8"]) / pred["peak_flops"] + f["fp8"] / pred["peak_fp8_flops"]
    assert pred["compute_s"] == pytest.approx(expected)
    share = f["fp8"] / f["per_device"]  # MFU against each precision's peak in its share of the FLOPs
    assert pred["mfu_peak_flops"] == pytest.approx(1 / ((1 - share) / 989e12 + share / 1979e12))
    assert pred["mfu_bound"] == pytest.approx(f["jaxnet_flops_py"] / pred["predicted_step_s"] / pred["mfu_peak_flops"])
    plain = plan_of("transformer_shakespeare:smoke")
    assert plain["flops_per_step"]["fp8"] == 0 and plain["prediction"]["peak_fp8_flops"] is None
    assert plain["prediction"]["mfu_peak_flops"] == 989e12


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
    assert p["mesh"] == {"data": 2, "fsdp": 2, "expert": 1, "context": 1, "tensor": 2}
    collectives = p["kernels"]["collectives"]
    assert collectives["all-reduce"]["count"] > 0 and collectives["all-gather"]["count"] > 0
    assert all(c["bytes"] > 0 for c in collectives.values())
    assert p["memory"]["params"] < 0.5 * one["memory"]["params"]
    assert one["kernels"]["collectives"] == {}


def test_context_parallelisms_traffic_is_in_the_communication_bound_as_the_shapes_predict():
    """A ring over 4 H100s (mesh.context=4, attention recomputed by model.remat=full): the compiled
    step's collective-permutes carry exactly the bytes context_traffic predicts from the model's
    shapes (the keys and values round the ring in both passes, their gradients, the reordering), and
    their time is in the communication bound."""
    p = plan_of(
        "llama_shakespeare:smoke",
        "mesh.data=1",
        "mesh.context=4",
        "data.seq_len=64",
        "model.context_attention=ring",
        "model.remat=full",
        gpus=4,
    )
    c = p["context"]
    assert (c["ways"], c["attention"], c["tokens_per_device"], c["attention_forwards"]) == (4, "ring", 64, 2)
    permutes = p["communication"]["by_kind"]["collective-permute"]
    assert c["compiled"]["collective-permute"]["bytes"] == permutes["bytes"] == c["predicted_bytes"] > 0
    assert p["prediction"]["communication_s"] >= permutes["seconds"] > 0
    assert p["processes"]["context_within_host"] and p["memory"]["params"] > 0


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
    done = run_patiently([*command, "--out", str(out)], env=cpu_env(), capture_output=True, text=True, timeout=300)
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
    done = run_patiently([sys.executable, "-c", script], env=cpu_env(), capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.splitlines() == [
        "[CpuDevice(id=0)]",
        f"JAX was imported without the CUDA plugin wheels on its path; start Python with "
        f"PYTHONPATH={planner.plan_dir()} JAX_PLATFORMS=cpu (or use the jaxnet plan command)",
    ]


# ---------------------------------------------------------------------------------------------
# The launch floor, the goal, the input rate, calibration


def independent_kernel_count(text: str) -> tuple[int, int]:
    """Kernels per run of a compiled GPU module, read from its text with nothing of jaxnet's:
    computations are the blocks between a header line ending in ``{`` and a line ``}``; in the
    entry and in what it runs, each fusion, custom call, copy and collective start is one kernel; a
    ``while`` runs its body ``known_trip_count`` times (and its condition never), or, with no known
    trip count, once with its condition. Returns (kernels, loops of unknown trip count)."""
    blocks: dict[str, list[str]] = {}
    entry = name = None
    for line in text.split("\n"):
        if line.endswith("{") and not line.startswith(" ") and "(" in line:
            head = line.split(" (")[0].split()
            name = head[-1]
            if head[0] == "ENTRY":
                entry = name
            blocks[name] = []
        elif line == "}":
            name = None
        elif name is not None:
            blocks[name].append(line)
    launching = (
        "fusion",
        "custom-call",
        "copy",
        "copy-start",
        "all-reduce-start",
        "all-gather-start",
        "reduce-scatter",
        "all-to-all",
        "collective-permute-start",
        "all-reduce",
        "all-gather",
    )

    def opcode(line: str) -> str:
        rhs = line.split(" = ", 1)[1]
        depth = 0
        for i, ch in enumerate(rhs):  # skip the result type, which may be a tuple with spaces inside
            depth += ch in "({["
            depth -= ch in ")}]"
            if ch == " " and depth == 0:
                return rhs[i + 1 :].split("(", 1)[0]
        return ""

    def count(block: str) -> tuple[int, int]:
        kernels = unknown = 0
        for line in blocks[block]:
            if " = " not in line:
                continue
            op = opcode(line)
            if op == "while":
                cond = line.split("condition=")[1].split(",")[0]
                body = line.split("body=")[1].split(",")[0]
                k, u = count(body)
                if '"known_trip_count":{"n":"' in line:
                    n = int(line.split('"known_trip_count":{"n":"')[1].split('"')[0])
                    kernels, unknown = kernels + n * k, unknown + u
                else:
                    c, v = count(cond)
                    kernels, unknown = kernels + k + c, unknown + u + v + 1
            elif op in launching:
                kernels += 1
        return kernels, unknown

    return count(entry)


def compile_for_h100(fn, *args) -> str:
    """``fn`` compiled for one H100 without one: the optimized HLO text."""
    import jax

    device = planner.topology("h100", 1).devices[0]
    sharding = jax.sharding.SingleDeviceSharding(device)
    abstract = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding) for a in args]
    return jax.jit(fn).lower(*abstract).compile().as_text()


@pytest.fixture(scope="module")
def looped_program() -> str:
    """A small program with a scan of 5 (known trip count), a while loop of data-dependent length
    (unknown trip count) around a matrix product, and work outside both."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    def fn(x, w, n):
        def step(c, _):
            return jnp.tanh(c @ w) + 1.0, None

        y, _ = jax.lax.scan(step, x, None, length=5)
        z, _ = jax.lax.while_loop(lambda c: c[1] < n, lambda c: (jnp.sin(c[0] @ w) * 2.0, c[1] + 1), (y, 0))
        return jnp.exp(z).sum() + jnp.log1p(y).mean()

    return compile_for_h100(fn, np.zeros((64, 64), np.float32), np.zeros((64, 64), np.float32), np.int32(3))


def test_kernel_count_of_a_compiled_program_matches_an_independent_reading_of_its_text(looped_program):
    """planner.launches on a program with a known-trip-count scan (5) and an unknown-trip-count
    while loop gives the total of a separate parser written here, reports the one loop of unknown
    trip count, and counts the scan's body 5 times: one pass with the scan's length 1 fewer
    launches fewer kernels by exactly the body's count x 4."""
    found = planner.launches(looped_program)
    expected, unknown = independent_kernel_count(looped_program)
    assert found["total"] == expected and expected > 10
    assert found["unknown_trip_loops"] == unknown == 1
    assert "lower bound" in found["note"]
    assert sum(found["by_kind"].values()) == found["total"] and found["by_kind"]["gemm fusions"] >= 2
    once = looped_program.replace('"known_trip_count":{"n":"5"}', '"known_trip_count":{"n":"1"}')
    assert once != looped_program
    body = (expected - independent_kernel_count(once)[0]) // 4
    assert body >= 2 and found["total"] - planner.launches(once)["total"] == 4 * body


def test_kernel_count_of_a_plan_agrees_with_its_calls_and_gemms():
    """transformer_shakespeare:smoke's launches: its 4 cuDNN attention calls and its gemm fusions
    are those kernels() finds by another route, and the prediction's kernels_per_step is the
    total."""
    p = plan_of("transformer_shakespeare:smoke")
    launched = p["kernels"]["launches"]
    assert launched["by_kind"]["cuDNN attention"] == 4
    assert launched["by_kind"]["gemm fusions"] == sum(p["kernels"]["gemm_fusions"].values())
    assert launched["unknown_trip_loops"] == 0 and launched["total"] == p["prediction"]["kernels_per_step"]
    assert 100 < launched["total"] < 400


def test_the_step_is_the_largest_of_the_compute_memory_and_launch_bounds():
    """The smoke Transformer (a few hundred kernels of tiny work) is launch-bound: its launch bound
    is kernels x the target's 3.25 us, above the compute and memory bounds, and is the step; the
    full gpt2_small record's step is its memory bound (the largest of its three)."""
    p = plan_of("transformer_shakespeare:smoke")["prediction"]
    assert p["launch_overhead_s"] == 3.25e-6 == planner.load_target("h100").launch_overhead
    assert p["launch_s"] == pytest.approx(p["kernels_per_step"] * 3.25e-6)
    assert p["bound"] == "launch" and p["predicted_step_s"] == p["launch_s"]
    assert p["launch_s"] > 10 * p["compute_s"] and p["launch_s"] > p["memory_s"]
    assert p["examples_per_s"] == pytest.approx(8 / p["launch_s"])


def test_each_bound_wins_when_it_is_the_largest():
    """step_bound picks the largest of the three, each in turn, and a missing bound counts as 0;
    the smoke Transformer's own compute and memory bounds with a launch cost of 1e-12 s a kernel
    would be compute- or memory-bound."""
    assert planner.step_bound(3.0, 2.0, 1.0) == ("compute", 3.0)
    assert planner.step_bound(1.0, 2.0, 0.5) == ("memory", 2.0)
    assert planner.step_bound(1.0, 2.0, 4.0) == ("launch", 4.0)
    assert planner.step_bound(None, 2.0, None) == ("memory", 2.0)
    assert planner.step_bound(1.0, 2.0, 0.5, 2.5) == ("communication", 2.5)
    p = plan_of("transformer_shakespeare:smoke")["prediction"]
    bound, step = planner.step_bound(p["compute_s"], p["memory_s"], p["kernels_per_step"] * 1e-12)
    assert bound in ("compute", "memory") and step == max(p["compute_s"], p["memory_s"])


def test_goal_in_tokens_epochs_and_steps_with_its_cost():
    """The smoke Transformer (batch 8 x 32 tokens = 256 a step): 1e6 tokens are ceil(1e6 / 256) =
    3907 steps; its wall time is steps x the expected step, and the bound's steps x the bound;
    GPU-hours wall / 3600 x 1 GPU; at $2.5 an hour that many dollars. Two epochs of its training
    split are ceil(2 x tokens / 256) steps; with no goal, train.steps."""
    p = plan_of("transformer_shakespeare:smoke")
    step, bound = p["prediction"]["expected_step_s"], p["prediction"]["predicted_step_s"]
    assert step > bound
    g = planner.goal(p, tokens=1e6, price=2.5)
    assert g["steps"] == 3907 and g["tokens"] == 3907 * 256 and g["basis"] == "expected"
    assert g["wall_s"] == pytest.approx(3907 * step) and g["wall_days"] == pytest.approx(3907 * step / 86400)
    assert g["gpu_hours"] == pytest.approx(3907 * step / 3600)
    assert g["cost_usd"] == pytest.approx(2.5 * 3907 * step / 3600)
    assert g["bound"]["wall_s"] == pytest.approx(3907 * bound)
    assert g["bound"]["cost_usd"] == pytest.approx(2.5 * 3907 * bound / 3600)
    assert g["label"].startswith("EXPECTED")
    size = p["train_data"]["size"]
    assert p["train_data"]["unit"] == "tokens" and size > 1000
    assert g["epochs"] == pytest.approx(3907 * 256 / size)
    assert planner.goal(p, epochs=2)["steps"] == -(-2 * size // 256)
    default = p["goal"]
    assert default["steps"] == config.load_experiment("transformer_shakespeare:smoke").train.steps
    assert default["cost_usd"] is None
    g = planner.goal(p, tokens=1e9, price=3)
    text = planner.describe({**p, "goal": g})
    line = next(x for x in text.splitlines() if "to reach" in x)
    assert line.startswith(f"  EXPECTED to reach 1,000,000,000 tokens = {g['epochs']:,.3g} epochs of {size:,} tokens: ")
    assert "3,906,250 steps in " in line and f"{g['wall_days']:.3g} days" in line
    dollars = f"${g['cost_usd']:,.0f}" if g["cost_usd"] >= 100 else f"${g['cost_usd']:.2f}"
    assert f"{dollars} at $3 per GPU-hour" in line
    assert f"at the bound {g['bound']['wall_s'] / 86400:.3g} days" in line


def test_input_rate_per_host_from_the_batch_shape():
    """Examples, tokens and bytes per second per host: batch 8 of 32 int32 tokens and targets at
    the predicted step, one host."""
    p = plan_of("transformer_shakespeare:smoke")
    r, step = p["input_rate"], p["prediction"]["predicted_step_s"]
    assert r["hosts"] == 1 and r["tokens_per_example"] == 32 and r["tokens_per_step"] == 256
    assert r["examples_per_s_per_host"] == pytest.approx(8 / step)
    assert r["tokens_per_s_per_host"] == pytest.approx(256 / step)
    assert r["bytes_per_s_per_host"] == pytest.approx(2 * 8 * 32 * 4 / step)
    assert [planner.hosts_for(n) for n in (1, 8, 16, 64)] == [1, 1, 2, 8]


def test_a_python_data_source_of_token_ids_has_a_token_rate():
    """jaxnet.plan with arrays of token ids given from Python (not a text dataset): tokens per
    example are the ids' length, 12, and the rates follow from the batch of 16."""
    import flax.linen as nn
    import numpy as np

    import jaxnet

    class Bag(nn.Module):
        @nn.compact
        def __call__(self, ids, train=False):
            return nn.Dense(3)(nn.Embed(50, 8)(ids).mean(axis=1))

    ids = np.random.default_rng(0).integers(0, 50, size=(64, 12)).astype(np.int32)
    data = jaxnet.data.arrays(train={"ids": ids, "label": np.zeros(64, np.int32)}, num_classes=3)
    cfg = jaxnet.apply_overrides(jaxnet.Config(), ["train.batch_size=16", "data.name=arrays"])
    task = jaxnet.tasks.classification(inputs="ids", target="label")
    p = jaxnet.plan(cfg, "h100", model=Bag(), dataset=data, task=task, tokens=16 * 12 * 10)
    r, step = p["input_rate"], p["prediction"]["predicted_step_s"]
    assert r["tokens_per_example"] == 12 and r["tokens_per_step"] == 192
    assert r["tokens_per_s_per_host"] == pytest.approx(192 / step)
    assert r["examples_per_s_per_host"] == pytest.approx(16 / step)
    assert p["goal"]["steps"] == 10 and p["train_data"] == {**p["train_data"], "size": 64, "unit": "examples"}


def calibration_file(tmp_path: Path, report: dict, measured_step: float, device_kind: str, name: str) -> Path:
    """A plan-vs-measured file as scripts/gpu_check.py's plan part writes it on a GPU."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    import gpu_check

    measured = {"device_kind": device_kind, "batch_size": report["batch_size"], "median_step_s": measured_step}
    record = {
        "kind": "plan-vs-measured",
        "mode": "gpu",
        "device_kind": device_kind,
        "date": "2026-11-30",
        "configs": {name: {"target": "h100", **gpu_check.compare_plan(report, measured)}},
    }
    path = tmp_path / f"plan-vs-measured-{device_kind.split()[1].lower()}.json"
    path.write_text(json.dumps(record))
    return path


def test_calibration_scales_the_step_by_the_measured_ratio(tmp_path):
    """A file whose transformer_shakespeare:smoke step was measured at 2.5 x the prediction: the
    same config's calibrated step is the measured one; another launch-bound config takes the
    ratio 2.5; the goal then uses the calibrated step and says so."""
    p = plan_of("transformer_shakespeare:smoke")
    step = p["prediction"]["predicted_step_s"]
    path = calibration_file(tmp_path, p, 2.5 * step, "NVIDIA H100 80GB HBM3", "transformer_shakespeare:smoke")
    calibration = planner.load_calibration(path, planner.load_target("h100"))
    same = planner.apply_calibration(calibration, p)
    assert same["calibrated_step_s"] == pytest.approx(2.5 * step) and same["ratio"] == pytest.approx(2.5)
    assert same["efficiency"] == pytest.approx(0.4) and "at this batch size" in same["basis"]
    other = {**p, "experiment": "bert_shakespeare", "prediction": {**p["prediction"], "predicted_step_s": 1e-3}}
    scaled = planner.apply_calibration(calibration, other)
    assert scaled["calibrated_step_s"] == pytest.approx(2.5e-3) and "launch-bound" in scaled["basis"]
    calibrated = {**p, "calibration": same}
    g = planner.goal(calibrated, tokens=256 * 100)
    assert g["wall_s"] == pytest.approx(100 * 2.5 * step) and g["label"].startswith("CALIBRATED")


def test_bad_goal_price_and_calibration_are_one_line_and_exit_2(tmp_path, capsys):
    """--tokens 0, a negative price, --tokens with --epochs, a calibration file measured on an H200
    for an H100 plan, a dry run's file: one line on stderr each, exit 2, before any compile."""
    p = plan_of("transformer_shakespeare:smoke")
    h200 = calibration_file(tmp_path, p, 1e-3, "NVIDIA H200", "transformer_shakespeare:smoke")
    dry = tmp_path / "dry.json"
    dry.write_text(json.dumps({**json.loads(h200.read_text()), "mode": "dry-run (CPU)"}))
    base = ["plan", "transformer_shakespeare:smoke", "--target", "h100"]
    cases = {
        "--tokens 0": ("--tokens", "0"),
        "--price -1": ("--price", "-1"),
        "--tokens": ("--tokens", "1e9", "--epochs", "2"),
        "measured on NVIDIA H200, not on the target's NVIDIA H100 80GB HBM3": ("--calibrate", str(h200)),
        "a dry run's file": ("--calibrate", str(dry)),
        "cannot read it": ("--calibrate", str(tmp_path / "absent.json")),
    }
    for expected, extra in cases.items():
        assert cli.main([*base, *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("jaxnet: error: ") and expected in err[0], err
    with pytest.raises(planner.UserError, match="--epochs nan"):
        planner.check_goal(None, float("nan"), None)


# ---------------------------------------------------------------------------------------------
# Communication, the expected step, the published runs, the warnings

# A scheduled module written by hand: an all-gather of 8 x 128 floats with a kernel between its
# start and done (it can overlap), an all-reduce of 1024 floats whose done follows its start, and a
# reduce-scatter of 1024 floats wrapped in an async computation with a kernel under it.
OVERLAP_HLO = """HloModule overlap, is_scheduled=true

%fused_add (p0: f32[1024]) -> f32[1024] {
  %p0 = f32[1024]{0} parameter(0)
  ROOT %add = f32[1024]{0} add(%p0, %p0)
}

%wrapped_rs (p1: f32[1024]) -> f32[128] {
  %p1 = f32[1024]{0} parameter(0)
  ROOT %rs = f32[128]{0} reduce-scatter(%p1), replica_groups={{0,1,2,3,4,5,6,7}}, dimensions={0}
}

ENTRY %main (a: f32[128], b: f32[1024]) -> (f32[1024], f32[1024], f32[128]) {
  %a = f32[128]{0} parameter(0)
  %b = f32[1024]{0} parameter(1)
  %all-gather-start = (f32[128]{0}, f32[1024]{0}) all-gather-start(%a), replica_groups={{0,1,2,3,4,5,6,7}}
  %fusion = f32[1024]{0} fusion(%b), kind=kLoop, calls=%fused_add
  %all-gather-done = f32[1024]{0} all-gather-done(%all-gather-start)
  %all-reduce-start = f32[1024]{0} all-reduce-start(%fusion), replica_groups=[1,8]<=[8], to_apply=%fused_add
  %all-reduce-done = f32[1024]{0} all-reduce-done(%all-reduce-start)
  %rs-start = ((f32[1024]{0}), f32[128]{0}, s32[]) async-start(%b), calls=%wrapped_rs
  %fusion.2 = f32[1024]{0} fusion(%b), kind=kLoop, calls=%fused_add
  %rs-done = f32[128]{0} async-done(%rs-start)
  ROOT %tuple = (f32[1024]{0}, f32[1024]{0}, f32[128]{0}) tuple(%all-gather-done, %all-reduce-done, %rs-done)
}
"""


def test_replica_groups_in_each_form_xla_prints():
    """Explicit lists, every device, the iota form with a transpose, the mesh form with and without
    a device order and with a sub-axis, and a permute's pairs: the groups written out by hand."""
    groups = planner.replica_groups
    assert groups("replica_groups={{0,2},{1,3}}, dimensions={0}", 4) == [[0, 2], [1, 3]]
    assert groups("replica_groups={}, to_apply=%sum", 4) == [[0, 1, 2, 3]]
    assert groups("replica_groups=[2,4]<=[8], dimensions={0}", 8) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert groups("replica_groups=[4,2]<=[2,4]T(1,0), x", 8) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert groups("replica_groups=mesh['axis_0'=2,'axis_1'=4] {'axis_1'}, x", 8) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert groups("replica_groups=mesh['axis_0'=2,'axis_1'=4] {'axis_0'}, x", 8) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    # devices ordered 0,2,4,6,1,3,5,7 ([2,4] of a [4,2] iota transposed) grouped along the first axis
    ordered = "replica_groups=mesh['axis_0'=2,'axis_1'=4], device_ids=([4,2]T(1,0)) {'axis_0'}, x"
    assert groups(ordered, 8) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    # axis 'a' of 8 split 2 x 2 x 2, grouping its middle factor: devices 2 apart within each half
    assert groups("replica_groups=mesh['a'=8] {'a':(2)2}, x", 8) == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert groups("source_target_pairs={{0,1},{1,0}}, x", 2) == [[0, 1], [1, 0]]
    assert groups("replica_groups=unknown-form", 8) is None


def test_link_time_within_a_node_and_across_nodes():
    """Ring factors over NVLink (450 GB/s one way on an H100) within a node; a group of 16 over 2
    nodes of 8 runs the ring of 8 over NVLink and the ring of 2 over each GPU's 50 GB/s link on an
    eighth of the buffer; one GPU per node (groups {i, i+8}) crosses the network with all of it."""
    h100 = planner.load_target("h100")
    one_node, two_nodes = [0] * 8, [0] * 8 + [1] * 8
    seconds = lambda kind, groups, nodes: planner.link_seconds(kind, 1e9, groups, nodes, h100)["seconds"]  # noqa: E731
    assert seconds("all-reduce", [list(range(8))], one_node) == pytest.approx(2 * 7 / 8 * 1e9 / 450e9)
    assert seconds("all-gather", [list(range(8))], one_node) == pytest.approx(7 / 8 * 1e9 / 450e9)
    assert seconds("reduce-scatter", [[0, 1], [2, 3]], one_node) == pytest.approx(1 / 2 * 1e9 / 450e9)
    whole = seconds("all-reduce", [list(range(16))], two_nodes)
    assert whole == pytest.approx(2 * 7 / 8 * 1e9 / 450e9 + 2 * 1 / 2 * 1e9 / (8 * 50e9))
    across = planner.link_seconds("all-reduce", 1e9, [[i, i + 8] for i in range(8)], two_nodes, h100)
    assert across["seconds"] == pytest.approx(1e9 / 50e9) and across["crosses_nodes"]
    assert seconds("collective-permute", [[0, 8]], two_nodes) == pytest.approx(1e9 / 50e9)
    assert seconds("all-to-all", [list(range(16))], two_nodes) == pytest.approx(
        7 / 16 * 1e9 / 450e9 + 8 / 16 * 1e9 / 50e9
    )


def test_communication_says_which_collectives_xla_overlaps():
    """The hand-written module: the all-gather (4 KiB gathered, a kernel between start and done) and
    the wrapped reduce-scatter (4 KiB scattered) can overlap, the all-reduce (4 KiB, done right after
    start) cannot; with the 8 devices on 2 nodes of 4 each is hierarchical (ring of 4 over NVLink,
    ring of 2 over the network on a quarter of the buffer)."""
    h100 = planner.load_target("h100")
    c = planner.communication(OVERLAP_HLO, [0, 0, 0, 0, 1, 1, 1, 1], h100)
    gather = 3 / 4 * 4096 / 450e9 + 1 / 2 * 4096 / (4 * 50e9)
    reduce = 2 * gather
    assert c["by_kind"]["all-gather"] == {
        "count": 1,
        "bytes": 4096,
        "seconds": pytest.approx(gather),
        "crossing_nodes": 1,
        "overlappable": 1,
        "group_sizes": [8],
    }
    assert c["by_kind"]["reduce-scatter"] == {**c["by_kind"]["all-gather"], "seconds": pytest.approx(gather)}
    assert c["by_kind"]["all-reduce"]["bytes"] == 4096 and c["by_kind"]["all-reduce"]["overlappable"] == 0
    assert c["overlappable_s"] == pytest.approx(2 * gather) and c["exposed_s"] == pytest.approx(reduce)
    assert c["seconds"] == pytest.approx(2 * gather + reduce) and c["groups_unparsed"] == 0
    assert c["overlap"].startswith("XLA scheduled 2 of 3 collectives asynchronously")
    assert c["overlap"].endswith("the others hold up the next kernel until they finish")


def test_two_nodes_keep_fsdp_in_the_node_and_send_the_data_all_reduce_across():
    """transformer_shakespeare:smoke on 16 H100s, 2 nodes of 8, mesh data=2 x fsdp=8: the mesh puts
    each data replica on one node, so the parameter all-gathers and gradient reduce-scatters (groups
    of 8) never cross, and every collective that crosses nodes is an all-reduce over the data axis;
    the communication bound is the sum of the kinds' times, and the plan says so in one line. Its
    train.batch_size=24 does not split over the 16 devices: planned at 32, and said."""
    p = plan_of("transformer_shakespeare:smoke", "mesh.data=2", "mesh.fsdp=8", "train.batch_size=24", gpus=16, nodes=2)
    assert p["batch_size"] == 32 and p["batch_devices"] == 16
    (warned,) = [w for w in p["warnings"] if w["kind"] == "batch_not_divisible"]
    assert "train.batch_size=24 does not split evenly over the 16 data-parallel devices" in warned["message"]
    assert "planned at 32, the next size that does (or 16, the one below)" in warned["message"]
    c = p["communication"]
    assert c["nodes"] == 2 and c["gpus_per_node"] == 8 and c["groups_unparsed"] == 0
    assert p["input_rate"]["hosts"] == 2
    for kind in ("all-gather", "reduce-scatter"):
        assert c["by_kind"][kind]["crossing_nodes"] == 0 and c["by_kind"][kind]["group_sizes"] == [8]
        assert c["by_kind"][kind]["seconds"] == pytest.approx(7 / 8 * c["by_kind"][kind]["bytes"] / 450e9)
    crossing = {k for k, e in c["by_kind"].items() if e["crossing_nodes"]}
    assert crossing == {"all-reduce"}
    assert c["seconds"] == pytest.approx(sum(e["seconds"] for e in c["by_kind"].values()))
    assert p["prediction"]["communication_s"] == c["seconds"]
    assert 0 <= c["overlappable_collectives"] <= c["collectives"]
    assert "communication per step" in planner.describe(p) and "across nodes" in planner.describe(p)


def test_nodes_that_do_not_divide_the_gpus_are_one_line_and_exit_2(capsys):
    base = ["plan", "transformer_shakespeare:smoke", "mesh.data=-1", "--target", "h100"]
    for extra, expected in (
        (["--gpus", "16", "--nodes", "3"], "--nodes 3 does not divide --gpus 16"),
        (["--gpus", "8", "--nodes", "0"], "--nodes 0: give a number of nodes of at least 1"),
        (["--gpus", "12"], "--gpus 12: more than 8 GPUs must be a multiple of 8"),
    ):
        assert cli.main([*base, *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and expected in err[0], err


def test_expected_step_is_the_work_over_the_efficiency_plus_what_cannot_overlap():
    """By hand: bounds 0.168 / 0.155 / 0.005 s at efficiency 0.56 make 0.3 s of work; 10 ms of
    communication that cannot overlap add 10 ms; 0.4 s that could overlap add what outlasts the
    work, 0.1 s; a communication bound above all of it is the step. solve_efficiency inverts it."""
    bounds = {"compute_s": 0.168, "memory_s": 0.155, "launch_s": 0.005}
    assert planner.expected_step(bounds, None, 0.56)["expected_step_s"] == pytest.approx(0.3)
    comm = {"seconds": 0.41, "exposed_s": 0.01, "overlappable_s": 0.4}
    e = planner.expected_step(bounds, comm, 0.56)
    assert e["exposed_communication_s"] == pytest.approx(0.01 + 0.1) and e["expected_step_s"] == pytest.approx(0.41)
    assert planner.expected_step(bounds, {**comm, "seconds": 0.9}, 0.56)["expected_step_s"] == 0.9
    assert planner.solve_efficiency(bounds, {"seconds": 0.01, "exposed_s": 0.01, "overlappable_s": 0}, 0.31) == (
        pytest.approx(0.56, abs=1e-5)
    )
    assert math.isnan(planner.solve_efficiency(bounds, None, 0.1))  # faster than its bound
    runs = [(n, {"prediction": bounds}, step) for n, step in (("a", 0.3), ("b", 0.6), ("c", 1.2), ("d", 0.05))]
    fit = planner.fit_efficiency(runs)
    assert fit["efficiency"] == pytest.approx(0.28, abs=1e-5) and fit["per_run"]["d"] is None
    assert fit["fitted_on"] == ["a", "b", "c"]


def newest(pattern: str) -> Path:
    return sorted((Path(__file__).resolve().parents[1] / "benchmarks" / "results").glob(pattern))[-1]


def test_published_runs_are_all_carried_and_the_expected_step_lands_near_each():
    """The committed table: every run of jaxnet/targets/published_runs.json is in it, planned or
    pending with a reason (none dropped); the fitted run's expected step is within 25 % of its
    published step and every validated one (never fitted on) within 35 %; the shipped efficiency is
    the table's fit, and each planned row's expected step follows from its record's bounds with it."""
    runs = json.loads((Path(planner.__file__).parent / "targets" / "published_runs.json").read_text())
    table = json.loads(newest("plan-published-runs-*.json").read_text())
    shipped = planner.load_fit()
    assert [r["id"] for r in table["rows"]] == [r["id"] for r in runs["runs"]]
    assert shipped["efficiency"] == table["fit"]["efficiency"] and shipped["fitted_on"] == table["fit"]["fitted_on"]
    assert table["fit"]["fitted_on"] == [r["id"] for r in runs["runs"] if r["role"] == "fit"]
    for row, run in zip(table["rows"], runs["runs"], strict=True):
        assert all(run["source"][k] for k in ("repo", "path", "commit")) and run["published"]["step_s"] > 0
        if row["status"] == "pending":
            assert row["reason"]
            continue
        assert row["status"] == {"fit": "fitted", "validate": "validated"}[run["role"]]
        limit = 0.25 if row["status"] == "fitted" else 0.35
        assert abs(row["expected_step_s"] / run["published"]["step_s"] - 1) <= limit, row["id"]
        record = json.loads((Path(__file__).resolve().parents[1] / row["record"]).read_text())
        again = planner.expected_step(record["prediction"], record["communication"], shipped["efficiency"])
        assert again["expected_step_s"] == pytest.approx(row["expected_step_s"])
        assert record["prediction"]["expected_step_s"] == pytest.approx(row["expected_step_s"])
    assert sum(r["status"] == "validated" for r in table["rows"]) >= 4


def test_a_plan_carries_the_expected_step_and_the_shipped_efficiency():
    """transformer_shakespeare:smoke: prediction.expected_step_s is expected_step of its own bounds
    and communication at the shipped efficiency, with tokens/s from it, and the text leads with it."""
    p = plan_of("transformer_shakespeare:smoke")
    pr, fit = p["prediction"], planner.load_fit()
    assert pr["efficiency"] == fit["efficiency"] and pr["fitted_on"] == fit["fitted_on"]
    assert pr["expected_step_s"] == planner.expected_step(pr, p["communication"], fit["efficiency"])["expected_step_s"]
    assert pr["expected_tokens_per_s"] == pytest.approx(256 / pr["expected_step_s"])
    lines = planner.describe(p).splitlines()
    spread = fit["spread"]  # how far the expected step fell from the published runs' measured steps
    assert pr["expected_spread"] == spread and spread["low"] < 0 < spread["high"] and spread["runs"] >= 5
    low, high = round(100 * spread["low"]), round(100 * spread["high"])
    assert lines[3].startswith(
        f"  EXPECTED step {1e3 * pr['expected_step_s']:.3g} ms (against {spread['runs']} published runs: "
        f"{low:+d} % .. {high:+d} % of their measured step)"
    )
    assert lines[4].startswith("  PREDICTED step")
    assert p["loss"] == "blockwise" and lines[0].endswith("; the loss blockwise, the whole logits never held")
    flops = p["flops_per_step"]["per_device"]  # in the unit it reads best in, not thousands of G
    assert f"FLOPs per step per device {flops / 1e6:.4g} MFLOP from" in lines[2] and 1e6 <= flops < 1e9


def test_warnings_for_a_small_batch_many_epochs_and_a_launch_bound_step():
    """plan_warnings on a report of GPT-2 124M's shape with gpt2_small's 65,536 tokens a step: an
    eighth of GPT-3's 0.5 M for its 125M model; the same at 262,144 tokens (half of it) says
    nothing; a goal of 10 epochs of a token corpus warns, of 3 does not; a launch-bound step warns
    with how much larger a batch costs about the same."""
    report = {
        "batch_size": 64,
        "parameters": 124_475_904,
        "input_rate": {"tokens_per_step": 65536},
        "train_data": {"unit": "tokens", "size": 1_000_000},
        "goal": {"epochs": 10.0},
        "prediction": {"bound": "memory", "compute_s": 1.0, "memory_s": 2.0, "launch_s": 0.5},
    }
    kinds = lambda r: [w["kind"] for w in planner.plan_warnings(r)]  # noqa: E731
    assert kinds(report) == ["small_batch", "many_epochs"]
    small = planner.plan_warnings(report)[0]["message"]
    assert small.startswith("65,536 tokens a step is 1/8 of the 0.5 M tokens GPT-3 trained its 125 M-parameter")
    assert kinds({**report, "input_rate": {"tokens_per_step": 262144}, "goal": {"epochs": 3.0}}) == []
    assert kinds({**report, "parameters": 10e6, "goal": {}}) == []  # no rule for a model this small
    assert kinds({**report, "train_data": {"unit": "examples", "size": 60000}}) == []  # epochs of images are normal
    launch = {"bound": "launch", "compute_s": 0.01e-3, "memory_s": 0.1e-3, "launch_s": 1e-3}
    launch.update(kernels_per_step=300, launch_overhead_s=3.25e-6)
    warned = planner.plan_warnings({**report, "parameters": None, "goal": {}, "prediction": launch})
    assert [w["kind"] for w in warned] == ["launch_bound"]
    assert "fill only 10 % of the step; a batch about 10x larger" in warned[0]["message"]


def test_a_real_plan_warns_of_many_epochs_and_launches():
    """The smoke Transformer planned for 1e8 tokens (about 22 epochs of its 4.6 M-character
    Shakespeare split) on one H100 (launch-bound): both warnings, and printed; its own goal
    (train.steps=30, a fraction of an epoch) only the launch bound."""
    p = plan_of("transformer_shakespeare:smoke")
    p = {**p, "goal": planner.goal(p, tokens=1e8)}
    assert p["goal"]["epochs"] > 4
    warned = planner.plan_warnings(p)
    assert [w["kind"] for w in warned] == ["many_epochs", "launch_bound"]
    assert [w["kind"] for w in plan_of("transformer_shakespeare:smoke")["warnings"]] == ["launch_bound"]
    text = planner.describe({**p, "warnings": warned})
    assert sum(line.startswith("  WARNING: ") for line in text.splitlines()) == 2


def test_the_input_line_names_the_gpus_each_host_has():
    from types import SimpleNamespace

    import numpy as np

    run = SimpleNamespace(text=True, cfg=SimpleNamespace(data=SimpleNamespace(seq_len=128)))
    batch = {"inputs": np.zeros((2, 128), np.int32)}
    for gpus, want in ((1, "(1 host, 1 GPU each)"), (8, "(1 host, 8 GPUs each)"), (16, "(2 hosts, 8 GPUs each)")):
        rate = planner.input_rate(run, batch, rows=64, gpus=gpus, step_s=0.1)
        line = planner._input_line({"input_rate": rate})
        assert want in line, line
        assert f"{64 / rate['hosts'] / 0.1:,.0f} examples/s" in line


@pytest.mark.parametrize(
    "start, usable, answer",
    [(2, 175, (7, 8)), (1, 105, (None, 1)), (16, 135, (3, 4)), (4, 1e9, (99999990, 99999991)), (3, 130, (3, 4))],
)
def test_largest_multiple_finds_where_a_line_of_memory_crosses_the_limit(start, usable, answer):
    """Memory 100 + 10 k for k multiples of the data-parallel size: the largest k within the limit
    and the next one, found from any start in at most 6 evaluations, four when the line is exact
    however far the crossing (k = 1 does not fit 105: none does)."""
    asked = []

    def memory_at(k: int) -> float:
        asked.append(k)
        return 100 + 10 * k

    assert plan_search.largest_multiple(memory_at, start, usable) == answer
    assert len(asked) == len(set(asked)) <= (4 if answer[0] and answer[0] > 2 * start else 6)


def test_largest_multiple_finds_a_jump_in_memory_within_eight_compiles():
    """Memory that is not a line (XLA rematerialises differently at larger sizes): 28.9 GiB at one
    multiple, 29.7 at two, then 2.7 a multiple more and a jump of 13.6 from 14 on; the line through
    the first two overshoots, and the secant and halving steps still find 13 fits, 14 does not."""

    def memory_at(k: int) -> float:
        return {1: 28.9, 2: 29.7}.get(k, 29.7 + (k - 2) * 2.7 + (13.6 if k >= 14 else 0))

    assert plan_search.largest_multiple(memory_at, 1, 71.7) == (13, 14)


@pytest.mark.slow  # about 10 compiles: minutes on a loaded 2-core CPU
def test_search_finds_the_largest_fitting_batch_of_each_policy_and_ranks_them(tmp_path):
    """--search on a 6 MiB H100: for model.remat none and full, the largest batch that fits with
    10 % headroom fits and the next does not; full recomputes (more FLOPs a token than none); the
    best row has the most expected tokens/s and the runners-up follow in order."""
    target = small_target(tmp_path, 6)
    cfg = config.load_experiment("transformer_shakespeare:smoke")
    found = plan_search.search(cfg, target, 1, policies=("none", "full"))
    rows = {c["remat"]: c for c in found["candidates"]}
    usable = 0.9 * (6 << 20)
    for c in rows.values():
        assert c["fits"] and c["memory"] <= usable
        assert c["next_size"] is None or c["memory_at_next"] > usable
        assert c["tokens_per_s"] == pytest.approx(c["batch_size"] * 32 / c["expected_step_s"])
    assert rows["full"]["recompute_fraction"] > 0.05
    assert [found["best"], *found["runners_up"]] == sorted(rows.values(), key=lambda c: -c["tokens_per_s"])
    assert found["compiles"] == sum(c["compiles"] for c in rows.values()) and found["compile_s"] > 0
    text = plan_search.describe(found)
    assert f"train.batch_size={found['best']['batch_size']}" in text


@pytest.mark.parametrize(
    "args, message",
    [
        (["--policies", "full"], "--policies and --mesh choose what --search tries"),
        (["--search", "--mesh", "fsdp"], "--mesh fsdp: give axis=size pairs"),
        (["--search", "--policies", "none,most"], "'most' is not one of none, full, dots"),
        (["--search", "--max-batch"], "--search finds the batch and policy"),
    ],
)
def test_search_options_refused_in_one_line(args, message, capsys):
    err = fails(["plan", "transformer_shakespeare:smoke", "--target", "h100", *args], capsys)
    assert message in err
