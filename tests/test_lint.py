"""The tree stays ruff-clean (the rules are in pyproject.toml)."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from tests.conftest import REPO


def test_ruff_clean() -> None:
    ruff = shutil.which("ruff") or str(__import__("pathlib").Path(sys.executable).with_name("ruff"))
    if not __import__("os").path.exists(ruff):
        pytest.skip("ruff is not installed (pip install -e '.[dev]')")
    r = subprocess.run([ruff, "check", str(REPO)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:]
