"""scripts/measure_corpus.py on tiny corpora: it writes its results file with every figure, and
refuses at once when the disk cannot hold the corpora asked for."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import run_patiently

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "measure_corpus.py"


def _env() -> dict[str, str]:
    from conftest import cpu_env

    return cpu_env(1)


def test_too_little_disk_is_refused_before_anything_is_written(tmp_path):
    out = tmp_path / "r.json"
    result = run_patiently(
        [sys.executable, str(SCRIPT), "--sizes-gb", "1e6", "--tmp", str(tmp_path), "--out", str(out)],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=120,
    )
    assert result.returncode == 1 and "GB free" in result.stderr and "--sizes-gb" in result.stderr
    assert not out.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.slow  # two training runs, a loader run, a prepare and two more runs: 45 to 100 s here
def test_the_script_records_memory_loader_and_identical_losses(tmp_path):
    out = tmp_path / "r.json"
    command = [sys.executable, str(SCRIPT), "--sizes-gb", "0.01", "0.02", "--steps", "3", "--loader-batches", "3"]
    command += ["--skip-prepare", "--loss-steps", "4", "--tmp", str(tmp_path), "--out", str(out)]
    result = run_patiently(command, capture_output=True, text=True, env=_env(), timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads(out.read_text())
    assert [r["train_tokens"] for r in record["memory"]["runs"]] == [5_000_000, 10_000_000]
    assert all(r["peak_rss_mb"] > 100 for r in record["memory"]["runs"])
    assert record["loader"]["batch_shape"] == [64, 1024] and record["loader"]["tokens_per_s"] > 0
    assert record["loader"]["plan"]["tokens_per_s_per_host"] > 0
    same = record["same_losses"]
    assert same["identical"] and same["losses_shards"] == same["losses_memory"] and "test@4" in same["losses_shards"]
    assert same["train_tokens"]["shards"] == same["train_tokens"]["memory"]
    assert {"start", "end"} <= set(record["load_average"]) and record["environment"]["versions"]["jax"]
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]  # the corpora are deleted
