"""The project passes its linters: ruff over every file, mypy over the typed modules.

Both are configured in pyproject.toml (rule set, per-file exceptions, the files
mypy checks) and listed in requirements.txt, so CI's ``pytest tests/`` runs them.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(tool: str, *args: str) -> subprocess.CompletedProcess:
    if importlib.util.find_spec(tool) is None:
        pytest.fail(f"{tool} is not installed: pip install -r requirements.txt")
    return subprocess.run([sys.executable, "-m", tool, *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_ruff_finds_nothing():
    run = _run("ruff", "check", "--no-cache", "--output-format", "concise", ".")
    assert run.returncode == 0, f"ruff check (pyproject.toml [tool.ruff]):\n{run.stdout}{run.stderr}"


def test_mypy_finds_nothing():
    run = _run("mypy")  # the files of pyproject.toml [tool.mypy]
    assert run.returncode == 0, f"mypy (pyproject.toml [tool.mypy]):\n{run.stdout}{run.stderr}"
