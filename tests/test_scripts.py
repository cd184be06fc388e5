"""The committed results and the README agree: every README figure comes from a results file."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_patiently

ROOT = Path(__file__).resolve().parents[1]


def test_readme_results_table_is_generated_from_the_results_files():
    result = subprocess.run([sys.executable, "scripts/update_docs.py", "--check"], cwd=ROOT)
    assert result.returncode == 0, "README.md is out of date: run python scripts/update_docs.py"


def test_ci_runs_the_readme_test_command():
    assert "./scripts/test" in (ROOT / ".ci" / "run").read_text()
    assert "./scripts/test" in (ROOT / "README.md").read_text()


def test_the_scripts_share_one_environment_stamp_and_switching_installs_nothing(tmp_path):
    """scripts/test (test, docs and reference extras) then scripts/docs (test and docs) then
    scripts/test again: one install, the first; a change of the dependencies installs again."""
    import os
    import shutil

    root = tmp_path / "clone"
    (root / "scripts").mkdir(parents=True)
    for name in ("pyproject.toml", "constraints.txt", "requirements-data.txt", "requirements-plan.txt"):
        shutil.copy(ROOT / name, root / name)
    shutil.copy(ROOT / "scripts" / "_env.sh", root / "scripts" / "_env.sh")
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    log = tmp_path / "pip.log"
    (venv / "bin" / "python").write_text(f'#!/bin/sh\necho "$@" >> {log}\n')  # a pip that records its calls
    (venv / "bin" / "python").chmod(0o755)

    def source(reference: str) -> list[str]:
        env = {**os.environ, "JAXNET_VENV": str(venv), "JAXNET_REFERENCE": reference, "JAXNET_PLAN": "0"}
        result = run_patiently(["bash", "-c", f"source {root}/scripts/_env.sh"], env=env, capture_output=True,
                                text=True, timeout=60)  # fmt: skip
        assert result.returncode == 0, result.stderr
        calls = log.read_text().splitlines() if log.exists() else []
        log.unlink(missing_ok=True)
        return [c for c in calls if c.startswith("-m pip install")]

    first = source("1")
    assert len(first) == 2 and first[0].endswith(f"editable_mode=compat -e {root}[docs,reference,test]")
    assert source("0") == [] and source("1") == []  # docs after test, test after docs: nothing installed
    (root / "constraints.txt").write_text((root / "constraints.txt").read_text() + "\n")
    again = source("0")
    assert len(again) == 2 and again[0].endswith(f"-e {root}[docs,test]")


def test_a_clone_named_jaxnet_imports_from_its_parent_directory(tmp_path):
    """The scripts' editable install puts the clone on Python's path, so from the parent of a clone
    named ``jaxnet`` the package is the clone's, not its directory taken for a namespace package."""
    if any(name.startswith("__editable___jaxnet") for name in sys.modules):  # the hook's .pth imports it
        pytest.skip("jaxnet was installed with setuptools' import hook, not by scripts/_env.sh")
    (tmp_path / "jaxnet").symlink_to(ROOT)
    code = "import jaxnet, jaxnet.train; print(jaxnet.__file__)"
    result = run_patiently([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(ROOT / "jaxnet" / "__init__.py")
