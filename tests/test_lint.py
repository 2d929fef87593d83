"""The tree stays ruff-clean (the rules are in pyproject.toml).

Only the files git tracks are checked: a user's own untracked module in the checkout (their
pipeline, a scratch script) is theirs, and ``make test`` must not fail on it (issue 52). Outside a
git checkout (an sdist) the whole tree is checked.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO


def tracked_python_files(root: Path = REPO) -> list[str] | None:
    """The ``.py`` files git tracks under ``root``, or None outside a git checkout."""
    if not (root / ".git").exists() or shutil.which("git") is None:
        return None
    r = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--", "*.py"], capture_output=True, timeout=60)
    if r.returncode != 0:
        return None
    return [str(root / name) for name in r.stdout.decode().split("\0") if name and (root / name).exists()]


def test_ruff_clean() -> None:
    ruff = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    if not os.path.exists(ruff):
        pytest.skip("ruff is not installed (pip install -e '.[dev]')")
    files = tracked_python_files()
    r = subprocess.run([ruff, "check", "--force-exclude", *(files if files is not None else [str(REPO)])],
                       capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stdout[-3000:]


def test_an_untracked_user_module_is_not_linted(tmp_path: Path) -> None:
    if shutil.which("git") is None:
        pytest.skip("no git")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "tracked.py").write_text("x = 1\n")
    subprocess.run(["git", "-C", str(tmp_path), "add", "tracked.py"], check=True)
    (tmp_path / "mine.py").write_text("import os, sys\n")  # a user's untracked module with ruff findings
    assert tracked_python_files(tmp_path) == [str(tmp_path / "tracked.py")]
