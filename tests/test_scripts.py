"""The committed results and the README agree: every README figure comes from a results file."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_readme_results_table_is_generated_from_the_results_files():
    result = subprocess.run([sys.executable, "scripts/update_docs.py", "--check"], cwd=ROOT)
    assert result.returncode == 0, "README.md is out of date: run python scripts/update_docs.py"


def test_ci_runs_the_readme_test_command():
    assert "./scripts/test" in (ROOT / ".ci" / "run").read_text()
    assert "./scripts/test" in (ROOT / "README.md").read_text()
