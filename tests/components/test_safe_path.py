"""Step processes start with a safe ``sys.path``: a ``tokenize.py`` in the working directory is never imported.

``python -m`` puts the working directory first on ``sys.path``, and every step process imports the
standard library's ``tokenize`` (``traceback`` -> ``linecache`` -> ``tokenize``): a file of that name
where ``llmpack run`` was started ran in each of them. Every process a local run starts now begins
with ``PYTHONSAFEPATH=1`` (``-P`` where we build the command line; components/commands.py), and the
variable reaches what those start in turn: torchrun and its ranks, parked fused members, kfp.local's
executors. Issue 46, item 11; docs/internals/step-process.md, "Safe path".
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

MARKER = "PLANTED-RAN"
# what a stranger leaves in a shared directory: it records every process that imported it, and breaks nothing
PLANTED = (f"import os\nopen(os.path.join(os.getcwd(), {MARKER!r}), 'a').write(f'{{os.getpid()}}\\n')\n"
           "import importlib.util as _u, sysconfig as _s, sys as _y\n"  # then the real module, so runs go on
           "_p = _u.spec_from_file_location('tokenize', _s.get_path('stdlib') + '/tokenize.py')\n"
           "_m = _u.module_from_spec(_p); _y.modules['tokenize'] = _m; _p.loader.exec_module(_m)\n")


@pytest.fixture
def planted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory holding a hostile ``tokenize.py``, made the current one."""
    (tmp_path / "tokenize.py").write_text(PLANTED, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # the checkout under test, as an installed llmpack would be
    monkeypatch.delenv("PYTHONSAFEPATH", raising=False)
    return tmp_path


def _ran(where: Path) -> int:
    marker = where / MARKER
    return len(marker.read_text().splitlines()) if marker.exists() else 0


def test_the_planted_module_would_run_without_a_safe_path(planted: Path) -> None:
    """The control: a plain ``python -m components.run`` from that directory does import it."""
    r = subprocess.run([sys.executable, "-m", "components.run", "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert _ran(planted) == 1


def test_every_local_spawner_starts_its_process_with_a_safe_path(planted: Path) -> None:
    """run_logged (direct, Argo's local runner, ``mlflow run``, the closing task), kfp.local's child, a parked
    fused member and torchrun with its ranks: each runs a step process from the planted directory."""
    from components.commands import run_logged
    from components.process import torchrun, warm_ahead
    from kfp_pipelines.local import _run_child

    step = ["-m", "components.run", "--help"]  # imports what every step imports, then exits 0
    rc, last = run_logged([sys.executable, *step], env=dict(os.environ), log_path=planted / "logs" / "a.log")
    assert rc == 0, last
    rc, _, _ = _run_child([sys.executable, *step], env=dict(os.environ), logs=planted / "logs")
    assert rc == 0
    parked = warm_ahead.Parked.start(0, "t", ["--help"])
    assert parked.proc.wait(timeout=120) == 0
    assert torchrun.launch(2, ["--help"], attempt=0) == 0  # torchrun itself and both ranks
    assert _ran(planted) == 0


@pytest.mark.slow  # a whole local run (30 s to 100 s)
def test_llmpack_run_from_a_directory_with_a_planted_tokenize_never_imports_it(planted: Path) -> None:
    """The issue's case: ``llmpack run`` (the console script: no ``-m``) where a stranger left ``tokenize.py``."""
    r = subprocess.run([sys.executable, "-P", "-m", "llmpack", "run", "--max-steps", "1", "--param", "builtin_size=20",
                        "--json", "--tracking-uri", f"sqlite:///{planted / 'm.db'}"],
                       capture_output=True, text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout)["status"] == "succeeded"
    assert _ran(planted) == 0
