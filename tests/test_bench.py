"""``jaxnet bench``: its smoke mode end to end, its results file, and its errors."""

from __future__ import annotations

import json

import pytest
from conftest import patient

from jaxnet import bench, flops
from jaxnet.bench import torch_peers
from jaxnet.cli import main


def test_smoke_prints_the_table_and_writes_every_figure(tmp_path, capsys):
    out = tmp_path / "results"
    # one round: the record's form is what is checked here (each round is a full set of measurements)
    assert main(["bench", "lstm", "transformer", "--smoke", "--rounds", "1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "runner/hand (>=0.97)" in printed and "results written to" in printed
    (path,) = out.glob("cpu-*-smoke.json")
    record = json.loads(path.read_text())
    assert record["kind"] == "benchmark" and record["smoke"] and record["rounds"] == 1
    assert record["environment"]["versions"]["jax"] and record["environment"]["platform"] == "cpu"
    assert len(record["load_average"]["start"]) == len(record["load_average"]["end"]) == 3
    expected = {"runner", "handwritten", "pipeline", "resident"} | ({"torch"} if torch_peers.available() else set())
    for name, case in record["cases"].items():
        assert set(case["steps_per_s"]) == expected, name
        for rates in case["steps_per_s"].values():
            assert len(rates) == 1 and all(r > 0 for r in rates)
        assert set(case["ratios"]) >= {"runner/handwritten", "pipeline/resident"}
        runner = case["median_steps_per_s"]["runner"]
        assert case["ratios"]["runner/handwritten"] == pytest.approx(
            runner / case["median_steps_per_s"]["handwritten"], rel=1e-2
        )
        assert case["tokens_per_s"] == pytest.approx(runner * case["batch_size"] * case["seq_len"], rel=1e-3)
        assert 0 < case["compile_time_s"] < patient(60)
        assert case["memory_bytes"]["params"] > 0 and case["memory_bytes"]["activations"] > 0
        assert case["mfu"] is None and case["peak_flops"] is None  # a CPU has no peak in the table
        assert case["dtype"] == "float32"
        roof = case["roofline"]  # XLA's figures for the compiled step, timed on resident batches
        assert roof["flops_per_step"] >= roof["flops_model"] > 0 and roof["bytes_per_step"] > 0
        assert roof["intensity"] == pytest.approx(roof["flops_per_step"] / roof["bytes_per_step"], rel=1e-3)
        assert roof["steps_per_s"] == pytest.approx(case["median_steps_per_s"]["resident"], rel=1e-3)
        assert roof["achieved_flops"] == pytest.approx(roof["flops_per_step"] * roof["steps_per_s"], rel=1e-3)
        roof_here = min(roof["peak_flops"], roof["intensity"] * roof["memory_bandwidth"])
        assert roof["attainable_flops"] == pytest.approx(roof_here, rel=1e-3)
        assert roof["fraction"] == pytest.approx(roof["achieved_flops"] / roof_here, rel=1e-3)
        assert roof["bound"] == ("memory-bound" if roof["intensity"] < roof["ridge"] else "compute-bound")
    peaks = record["device_peaks"]
    assert peaks["source"].startswith("measured") and peaks["peak_flops"]["float32"] > 1e8
    for case in record["cases"].values():  # every family against the same peaks
        assert case["roofline"]["memory_bandwidth"] == peaks["memory_bandwidth"]
        assert case["roofline"]["peak_flops"] == peaks["peak_flops"]["float32"]
    assert record["cases"]["lstm"]["roofline"]["loop_trip_counts"]  # the recurrence, counted per time step
    assert (out / f"roofline-{path.stem}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    transformer = record["cases"]["transformer"]
    cfg = bench.case_config(bench.CASES["transformer"], smoke=True)
    vocab_flops = [
        flops.train_step_flops(cfg.model, batch=cfg.train.batch_size, input_shape=(cfg.data.seq_len,), vocab=v)
        for v in range(50, 200)
    ]
    assert transformer["flops_per_step"] in vocab_flops  # counted for the real vocabulary


def test_roofline_alone(tmp_path, capsys, monkeypatch):
    # the Transformer's smoke shape on random characters: no corpus to read
    tiny = bench.Case("tiny", "transformer_shakespeare", synthetic="tokens:65", doc="smoke Transformer")
    monkeypatch.setitem(bench.CASES, "tiny", tiny)
    out = tmp_path / "results"
    assert main(["bench", "tiny", "--roofline", "--smoke", "--rounds", "2", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "FLOP/byte" in printed and "peaks of cpu" in printed
    (path,) = out.glob("roofline-cpu-*-smoke.json")
    record = json.loads(path.read_text())
    assert record["kind"] == "roofline" and list(record["cases"]) == ["tiny"]
    case = record["cases"]["tiny"]
    assert len(case["steps_per_s"]["resident"]) == 2
    assert set(case["steps_per_s"]) == {"resident"}
    # whether XLA keeps a loop (the blockwise loss's, of one block here) depends on its flags: the
    # tests' older fusion emitters keep it, the default ones unroll it; the record says which
    loops = case["roofline"]["loop_trip_counts"]
    assert case["roofline"]["loops"] == ("bodies counted once per iteration" if loops else "none")
    assert case["roofline"]["flops_source"] == "xla" and case["roofline"]["fraction"] > 0
    assert (out / f"{path.stem}.png").is_file()


@pytest.mark.parametrize(
    "args, message",
    [
        (["bench", "vgg"], "unknown family 'vgg'"),
        (["bench", "--only", "runner,tensorflow"], "unknown measurement 'tensorflow'"),
        (["bench", "--rounds", "0"], "--rounds must be at least 1"),
        (["bench", "--compare-devices"], "--compare-devices needs a GPU"),
        (["bench", "--rounds", "x"], "invalid int value"),
        (["bench", "--roofline", "--compare-devices"], "--roofline measures one device"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(tmp_path, capsys, args, message):
    assert main([*args, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err
    assert not (tmp_path / "out").exists()


def test_results_files_name_the_cpu_with_its_family_model_and_vector_instructions():
    """A virtual machine names only the maker's line ("AMD EPYC"), which holds CPUs of different
    speeds: the family, model and widest vector instructions of the first processor tell them apart."""
    from jaxnet import observe

    def cpuinfo(family: str, model: str, flags: str) -> str:
        one = f"processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: {family}\nmodel\t\t: {model}\n"
        return one + f"model name\t: AMD EPYC\nflags\t\t: fpu sse2 {flags}\n\n" + one.replace(": 0", ": 1")

    assert observe.cpu_model(cpuinfo("25", "17", "avx2 avx512f")) == "AMD EPYC (family 25, model 17, AVX-512)"
    assert observe.cpu_model(cpuinfo("25", "1", "avx avx2")) == "AMD EPYC (family 25, model 1, AVX2)"
    assert observe.cpu_model("model name\t: Some CPU\n") == "Some CPU"
    assert observe.cpu_model("").strip()  # no model name: the platform's word, never empty


@pytest.mark.parametrize("name, code", [("SIGTERM", 143), ("SIGINT", 130)])
def test_a_runner_stopped_by_a_signal_stops_the_bench_with_a_message(monkeypatch, capsys, name, code):
    """A time limit's SIGTERM stops the runner cleanly (a checkpoint, a summary): the bench says so
    in one line and stops too, with the shell's code for the signal, rather than failing later on a
    short metrics log."""
    import sys

    import jaxnet.train  # noqa: F401  (the package; the name jaxnet.train is its function)

    def stopped(cfg, workdir, dataset=None):
        return {"interrupted_by": name, "step": 7, "compile_time_s": 0.0}

    monkeypatch.setattr(sys.modules["jaxnet.train"], "train", stopped)
    cfg = bench.case_config(bench.CASES["cnn"], smoke=True)
    with pytest.raises(SystemExit) as stop:
        bench.measure_runner(cfg, None, 2)
    assert stop.value.code == code
    said = capsys.readouterr().err.strip()
    assert "\n" not in said and f"stopped by {name} during the runner's measurement (step 7 of 8)" in said


def test_the_bench_compiles_each_program_once_and_leaves_a_users_cache_alone(tmp_path):
    """Inside the bench JAX's persistent cache is a temporary folder (a later round's runner loads
    the program the first compiled), also after a compile before it; afterwards the process
    compiles without a cache again, with no write into the removed folder; a cache folder the user
    set is kept."""
    import os
    import subprocess
    import sys

    code = (
        "import os, jax, jax.numpy as jnp\n"
        "from jaxnet import bench\n"
        "jax.jit(lambda x: x - 1)(jnp.ones(3)).block_until_ready()  # a compile before the bench\n"
        "with bench._compile_once_per_program():\n"
        "    folder = jax.config.jax_compilation_cache_dir\n"
        "    jax.jit(lambda x: x * 2 + 1)(jnp.ones(3)).block_until_ready()\n"
        "    print(folder, len(os.listdir(folder)))\n"
        "print(jax.config.jax_compilation_cache_dir, os.path.exists(folder))\n"
        "jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.0)  # any write would be tried\n"
        "jax.jit(lambda x: x * 3)(jnp.ones(3)).block_until_ready()\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    inside, after = result.stdout.splitlines()[:2]
    folder, entries = inside.split()
    assert "jaxnet-bench-cache-" in folder and int(entries) >= 1  # the program went into the cache
    assert after == "None False"  # the setting undone, the folder gone
    assert "compilation cache" not in result.stderr  # no write into the removed folder afterwards
    mine = tmp_path / "mine"
    env["JAX_COMPILATION_CACHE_DIR"] = str(mine)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split()[0] == str(mine) and out.split()[2] == str(mine) and out.split()[-1] == "True"
