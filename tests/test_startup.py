"""The jaxnet command starts with glibc's malloc asking for huge pages (a fresh process, before
JAX loads); a user's own choice of the tunable stays, and only the command re-executes itself."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import cpu_env

from jaxnet import _startup


@pytest.mark.parametrize(
    "before, after",
    [
        ({}, "glibc.malloc.hugetlb=1"),
        ({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}, "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"),
        ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, None),  # the user's own choice stays
    ],
)
def test_the_command_asks_malloc_for_huge_pages_unless_told_otherwise(before, after):
    env = _startup.environment({"PATH": "/bin", **before})
    assert (env and env["GLIBC_TUNABLES"]) == after
    if env:
        assert env["PATH"] == "/bin"


@pytest.mark.parametrize(
    "argv, command",
    [
        (["/venv/bin/python", "/venv/bin/jaxnet", "train", "x"], True),
        (["python", "-X", "dev", "-m", "jaxnet", "list"], True),
        (["python", "-m", "pytest", "tests"], False),
        (["python", "my_training.py"], False),
        (["python", "jaxnet.py"], False),
    ],
)
def test_only_the_jaxnet_command_re_executes_itself(argv, command):
    assert _startup._is_jaxnet_command(argv) == command


def test_the_command_runs_with_the_setting_and_a_program_importing_jaxnet_without_it(tmp_path):
    env = {k: v for k, v in cpu_env().items() if k != "GLIBC_TUNABLES"}
    probe = "import os; print('tunables=' + os.environ.get('GLIBC_TUNABLES', 'none'))"
    experiment = tmp_path / "probe.py"  # prints what the command's process sees, then stops it
    experiment.write_text(f"def get_config(variant):\n    {probe}\n    raise SystemExit(0)\n")
    command = subprocess.run(
        [sys.executable, "-m", "jaxnet", "train", str(experiment)], env=env, capture_output=True, text=True
    )
    assert command.stdout.splitlines() == ["tunables=glibc.malloc.hugetlb=1"], command.stderr[-2000:]
    library = subprocess.run([sys.executable, "-c", f"import jaxnet; {probe}"], env=env, capture_output=True, text=True)
    assert library.stdout.splitlines() == ["tunables=none"], library.stderr[-2000:]
