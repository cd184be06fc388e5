"""The jaxnet command starts with glibc's malloc asking for huge pages, or with mimalloc preloaded
when ``JAXNET_MALLOC=mimalloc`` asks for it (a fresh process, before JAX loads); a user's own
choice of either stays, and only the command re-executes itself."""

from __future__ import annotations

import json
import re
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


LIB = "/site/cmeel.prefix/lib/libmimalloc.so.3"
MIMALLOC = {"LD_PRELOAD": LIB, "MIMALLOC_ALLOW_LARGE_OS_PAGES": "1", "MIMALLOC_PURGE_DELAY": "-1"}


@pytest.mark.parametrize(
    "before, preload",
    [
        ({}, {}),  # glibc's malloc, the default
        ({"JAXNET_MALLOC": "glibc"}, {}),
        ({"JAXNET_MALLOC": " MiMalloc"}, MIMALLOC),  # 2 MiB pages, freed memory kept
        (
            {"JAXNET_MALLOC": "mimalloc", "LD_PRELOAD": "/usr/lib/libjemalloc.so.2"},
            {"LD_PRELOAD": "/usr/lib/libjemalloc.so.2"},
        ),
        (
            {"JAXNET_MALLOC": "mimalloc", "LD_PRELOAD": "/opt/libtrace.so"},
            {**MIMALLOC, "LD_PRELOAD": f"{LIB}:/opt/libtrace.so"},
        ),
        ({"JAXNET_MALLOC": "mimalloc", "MIMALLOC_PURGE_DELAY": "100"}, {**MIMALLOC, "MIMALLOC_PURGE_DELAY": "100"}),
    ],
)
def test_jaxnet_malloc_mimalloc_preloads_it_with_its_settings(before, preload, monkeypatch):
    monkeypatch.setattr(_startup, "mimalloc_library", lambda: LIB)
    env = _startup.environment({"PATH": "/bin", **before})
    assert env["GLIBC_TUNABLES"] == "glibc.malloc.hugetlb=1" and env["PATH"] == "/bin"
    keys = ("LD_PRELOAD", "MIMALLOC_ALLOW_LARGE_OS_PAGES", "MIMALLOC_PURGE_DELAY")
    assert {k: env[k] for k in keys if k in env} == preload
    assert _startup.environment(env) is None  # the re-executed process changes nothing


@pytest.mark.parametrize(
    "value, library, message",
    [
        ("jemalloc", LIB, "JAXNET_MALLOC='jemalloc' is not an allocator jaxnet knows: use glibc or mimalloc"),
        ("mimalloc", None, "JAXNET_MALLOC=mimalloc needs the cmeel-mimalloc wheel: pip install 'jaxnet[mimalloc]'"),
    ],
)
def test_a_malloc_jaxnet_cannot_give_is_refused(value, library, message, monkeypatch):
    monkeypatch.setattr(_startup, "mimalloc_library", lambda: library)
    monkeypatch.setattr(_startup.sys, "platform", "linux")
    with pytest.raises(ValueError) as e:
        _startup.environment({"JAXNET_MALLOC": value})
    assert str(e.value) == message


def test_the_mimalloc_wheel_is_found_where_it_is_installed():
    library = _startup.mimalloc_library()
    if library is None:
        pytest.skip("cmeel-mimalloc is not installed (pip install 'jaxnet[mimalloc]')")
    assert re.search(r"libmimalloc\.so\.\d+$", library) and open(library, "rb").read(4) == b"\x7fELF"


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


def test_the_command_runs_with_the_settings_and_a_program_importing_jaxnet_without_them(tmp_path):
    unset = ("GLIBC_TUNABLES", "LD_PRELOAD", "JAXNET_MALLOC")
    env = {k: v for k, v in cpu_env().items() if k not in unset}
    probe = (
        "import os; print('tunables=' + os.environ.get('GLIBC_TUNABLES', 'none'), "
        "'mimalloc=' + str('libmimalloc' in open('/proc/self/maps').read()))"
    )
    experiment = tmp_path / "probe.py"  # prints what the command's process sees, then stops it
    experiment.write_text(f"def get_config(variant):\n    {probe}\n    raise SystemExit(0)\n")
    train = [sys.executable, "-m", "jaxnet", "train", str(experiment)]
    command = subprocess.run(train, env=env, capture_output=True, text=True)
    assert command.stdout.splitlines() == ["tunables=glibc.malloc.hugetlb=1 mimalloc=False"], command.stderr[-2000:]
    library = subprocess.run([sys.executable, "-c", f"import jaxnet; {probe}"], env=env, capture_output=True, text=True)
    assert library.stdout.splitlines() == ["tunables=none mimalloc=False"], library.stderr[-2000:]
    if _startup.mimalloc_library() is not None:
        chosen = subprocess.run(train, env={**env, "JAXNET_MALLOC": "mimalloc"}, capture_output=True, text=True)
        assert chosen.stdout.splitlines() == ["tunables=glibc.malloc.hugetlb=1 mimalloc=True"], chosen.stderr[-2000:]


def test_an_unknown_allocator_is_refused_in_one_line():
    env = {**cpu_env(), "JAXNET_MALLOC": " JeMalloc"}
    result = subprocess.run([sys.executable, "-m", "jaxnet", "list"], env=env, capture_output=True, text=True)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip().splitlines() == [
        "jaxnet: error: JAXNET_MALLOC=' JeMalloc' is not an allocator jaxnet knows: use glibc or mimalloc"
    ]


def test_training_under_mimalloc_gives_the_same_losses_bit_for_bit(tmp_path):
    """The allocator moves no number: the same short run under glibc's malloc and under mimalloc."""
    if _startup.mimalloc_library() is None:
        pytest.skip("cmeel-mimalloc is not installed (pip install 'jaxnet[mimalloc]')")
    losses = {}
    for malloc in ("glibc", "mimalloc"):
        env = {**{k: v for k, v in cpu_env().items() if k != "LD_PRELOAD"}, "JAXNET_MALLOC": malloc}
        overrides = ["train.steps=10", "train.log_every=5", "train.eval_every=10", "train.checkpoint_every=10"]
        command = [sys.executable, "-m", "jaxnet", "train", "transformer_shakespeare:smoke", *overrides]
        result = subprocess.run(
            [*command, "--workdir", str(tmp_path / malloc)], env=env, capture_output=True, text=True
        )
        assert result.returncode == 0, result.stderr[-2000:]
        rows = (tmp_path / malloc / "metrics.jsonl").read_text().splitlines()
        losses[malloc] = [(r["step"], r["split"], r["loss"]) for r in map(json.loads, rows)]
    assert len(losses["glibc"]) == 4 and losses["glibc"] == losses["mimalloc"]
