"""A step process starts up without the collector's full passes, and settles when its model is loaded."""

from __future__ import annotations

import gc
import json
import os
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from components.process import startup
from tests.conftest import run_step

PROBE = '''
import gc, json
from pathlib import Path
from components.dsl import Dataset, Output, step
from components.reporting import emit


def _state():
    return {"thresholds": list(gc.get_threshold()), "frozen": gc.get_freeze_count()}


@step(name="probe-model")
def probe_model(out: Output[Dataset]) -> None:
    """What the collector looks like before and after the step says its model is loaded."""
    before = _state()
    emit("model_loaded")
    (Path(out.path) / "gc.json").write_text(json.dumps({"before": before, "after": _state()}))


@step(name="probe-plain")
def probe_plain(out: Output[Dataset]) -> None:
    """A step with no model: paused for all of it."""
    (Path(out.path) / "gc.json").write_text(json.dumps({"during": _state()}))


@step(name="probe-threads")
def probe_threads(out: Output[Dataset]) -> None:
    """The thread settings the step's libraries read from the environment."""
    import os
    names = ("OMP_WAIT_POLICY", "OMP_DYNAMIC", "MKL_DYNAMIC")
    (Path(out.path) / "gc.json").write_text(json.dumps({n: os.environ.get(n) for n in names}))
'''


@pytest.fixture()
def restored() -> Iterator[None]:
    """Leave this test process's collector as it was."""
    thresholds = gc.get_threshold()
    yield
    if startup.paused():
        startup.settle()
    gc.unfreeze()
    gc.set_threshold(*thresholds)


def test_pause_then_settle_restores_the_thresholds_and_freezes(restored: None) -> None:
    before = gc.get_threshold()
    startup.pause_full_collections()
    assert startup.paused()
    assert gc.get_threshold() == startup._START_UP_THRESHOLDS
    startup.pause_full_collections()  # a second pause keeps the first saved thresholds
    frozen = gc.get_freeze_count()
    startup.settle()
    assert not startup.paused()
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() > frozen
    startup.settle()  # again: harmless
    assert gc.get_threshold() == before


@pytest.fixture(scope="module")
def probe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("probe")
    (root / "llmpack_gc_probe.py").write_text(textwrap.dedent(PROBE), encoding="utf-8")
    return root


def _run(probe_dir: Path, name: str, **user: str) -> dict:
    out = probe_dir / name / "-".join(user)
    env = {**{k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_DYNAMIC", "MKL_DYNAMIC")},
           "LLMPACK_MLFLOW_LOGGING": "0", **user,
           "PYTHONPATH": f"{probe_dir}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    r = run_step(f"llmpack_gc_probe:{name}", f"--output=out={out}", cwd=probe_dir, env=env)
    assert r.returncode == 0, r.stderr
    return json.loads((out / "gc.json").read_text())


def test_a_step_process_is_paused_until_its_model_is_loaded(probe_dir: Path) -> None:
    seen = _run(probe_dir, "probe_model")
    assert tuple(seen["before"]["thresholds"]) == startup._START_UP_THRESHOLDS
    assert tuple(seen["after"]["thresholds"]) == gc.get_threshold()  # CPython's defaults again
    assert seen["after"]["frozen"] > seen["before"]["frozen"]


def test_a_step_with_no_model_is_paused_while_it_runs(probe_dir: Path) -> None:
    seen = _run(probe_dir, "probe_plain")
    assert tuple(seen["during"]["thresholds"]) == startup._START_UP_THRESHOLDS


def test_a_step_process_waits_passively_and_keeps_its_thread_count_unless_the_user_says_otherwise(
        probe_dir: Path) -> None:
    """Idle OpenMP threads sleep (a thread per core trained 2.7-9x slower spinning on a shared CPU,
    docs/internals/decisions.md) and the libraries never pick fewer threads per call (byte-identical weights)."""
    assert _run(probe_dir, "probe_threads") == {"OMP_WAIT_POLICY": "PASSIVE", "OMP_DYNAMIC": "FALSE",
                                                "MKL_DYNAMIC": "FALSE"}
    assert _run(probe_dir, "probe_threads", OMP_WAIT_POLICY="ACTIVE")["OMP_WAIT_POLICY"] == "ACTIVE"
