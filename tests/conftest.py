"""Shared fixtures: a clean LLMPACK_* environment, MLflow sqlite stores, a tokenized dataset and its finetune,
helpers to run the CLI."""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from standins.loopback import LoopbackCluster

REPO = Path(__file__).resolve().parents[1]

# A suite started as a background job (`make test &`, nohup) inherits SIGINT *ignored*, and so would
# every process it starts: Python then never raises KeyboardInterrupt, and the Ctrl-C tests
# (tests/llmpack/run/test_interrupts.py, tests/components/test_record.py) would wait on a CLI that cannot hear them. A
# handled signal is reset to its default in a child at exec, so handling it here gives every
# child the disposition a terminal's Ctrl-C meets.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# One math thread per process, for the suite and every process it starts (set before torch is
# imported). The suite runs tests side by side (`make test`: pytest-xdist) and many start torch
# processes; on a 2-core machine, torch's default of a thread per core then oversubscribes the
# cores and OpenMP's spin-waits make a 6-step CPU finetune take ~15 s instead of ~0.4 s. A value
# already in the environment is kept.
for _threads in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_threads, "1")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto`` (``make test``): two workers per core, at most 8.

    Many tests spend most of their time waiting on the processes and stand-in servers they start,
    so a second worker per core fills the waits: on the 2-core machine the quick suite took 4:00
    with four workers, 5:16 with two. Past 8 the longest test file (each runs on one worker, with
    ``--dist loadfile``) bounds the time, and more workers add only memory.
    ``PYTEST_XDIST_AUTO_NUM_WORKERS`` still decides when set.
    """
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # pytest-xdist's own hook reads it
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return min(2 * cores, 8)


def setting_names() -> tuple[str, ...]:
    """Every ``LLMPACK_*`` variable the pack reads: the settings registry, once every backend has declared its own."""
    from components.settings import REGISTRY
    from llmpack.backends import BACKENDS, backend

    for name in BACKENDS:  # a backend declares its settings when imported (as llmpack.configuration.render does)
        backend(name)
    return tuple(sorted(REGISTRY))


def clear_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Remove every registered setting from the environment (what the developer's shell leaks in)."""
    for name in setting_names():
        monkeypatch.delenv(name, raising=False)


#: Where this test process's provenance key lives (made on first use): never the user's own key file.
#: Pods a test plays as processes get it too (their ``base_env``), as a cluster's pods share one key.
#: pytest imports this file as ``conftest`` and tests import it again as ``tests.conftest``: the second import
#: must find the first one's key file (``_LLMPACK_TESTS_KEY_FILE``, this process's and its children's), or the
#: steps a module fixture starts sign with a key the test then does not verify with.
SESSION_SIGNING_KEY_FILE = Path(os.environ.get("_LLMPACK_TESTS_KEY_FILE")
                                or Path(tempfile.mkdtemp(prefix="llmpack-signing-")) / "signing.key")
os.environ["_LLMPACK_TESTS_KEY_FILE"] = str(SESSION_SIGNING_KEY_FILE)
# Set for the whole process too, not only per test: module- and session-scoped fixtures run before the
# autouse one below, and the steps they start must sign with this key, never the user's.
os.environ.pop("LLMPACK_SIGNING_KEY", None)
os.environ["LLMPACK_SIGNING_KEY_FILE"] = str(SESSION_SIGNING_KEY_FILE)


@pytest.fixture(scope="session")
def _session_signing_key_file() -> Path:
    return SESSION_SIGNING_KEY_FILE


@pytest.fixture(autouse=True)
def _clean_settings(monkeypatch: pytest.MonkeyPatch, _session_signing_key_file: Path) -> None:
    """No test sees an ``LLMPACK_*`` setting it did not set itself.

    Autouse and in this conftest, so it runs before every fixture a test asks for: what a test or
    its fixtures set on purpose (``LLMPACK_MLFLOW_LOGGING=0`` for a step...) is set after it. The
    provenance key file is the session's own (components/provenance.py), so no test writes the
    user's ``~/.config/llmpack/signing.key``.
    """
    clear_settings(monkeypatch)
    monkeypatch.setenv("LLMPACK_SIGNING_KEY_FILE", str(_session_signing_key_file))


@pytest.fixture(scope="session")
def mlflow_template_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty MLflow sqlite store made once for the session; ``fresh_tracking_uri`` copies it (read only)."""
    db = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    make = "import sys; from mlflow.tracking import MlflowClient; MlflowClient(sys.argv[1]).search_experiments()"
    # in a process of its own, in the template's folder: MLflow makes ./mlruns where a store is made
    subprocess.run([sys.executable, "-c", make, f"sqlite:///{db}"], cwd=db.parent, check=True, capture_output=True,
                   timeout=300)
    return db


def fresh_store(template: Path, db: Path) -> str:
    """A new sqlite store at ``db``, as MLflow makes one from ``db``'s folder, copied from ``template``: its URI.

    MLflow records the Default experiment's artifact location, ``./mlruns/0`` from where the store
    was made, inside the store: the copy's points beside ``db``, never at the template's folder.
    """
    db.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(template, db)
    with closing(sqlite3.connect(db)) as con, con:
        con.execute("UPDATE experiments SET artifact_location = ? WHERE experiment_id = 0",
                    (str(db.parent / "mlruns" / "0"),))
    return f"sqlite:///{db}"


@pytest.fixture(scope="session")
def tracking_uri(mlflow_template_db: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    """One sqlite MLflow store shared by the session's tests."""
    return fresh_store(mlflow_template_db, tmp_path_factory.mktemp("mlflow") / "mlflow.db")


@pytest.fixture()
def fresh_tracking_uri(mlflow_template_db: Path, tmp_path: Path) -> str:
    """An empty sqlite store of this test's own, ``tmp_path/mlflow.db`` (a copy: making one costs seconds)."""
    return fresh_store(mlflow_template_db, tmp_path / "mlflow.db")


@pytest.fixture()
def step_env(tracking_uri: str) -> dict[str, str]:
    return {**os.environ, "MLFLOW_TRACKING_URI": tracking_uri, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}


def llmpack(*args: str, cwd: Path, env: dict[str, str] | None = None,
            timeout: int = 600) -> subprocess.CompletedProcess[str]:
    """Run the real ``llmpack`` console entry point in a subprocess."""
    return subprocess.run(
        [sys.executable, "-m", "llmpack", *args],
        cwd=cwd,
        env=env or dict(os.environ),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_step(ref: str, *args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "components.run", ref, *args], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=300
    )


@pytest.fixture(scope="session")
def tokens(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Built-in data (600 rows) prepared and tokenized (seq_len 64) once, for the step-level tests; read only."""
    root = tmp_path_factory.mktemp("tok")
    env = {**os.environ, "LLMPACK_MLFLOW_LOGGING": "0"}
    r = run_step("components.steps.prepare_data:prepare_data", f"--output=dataset={root / 'data'}",
                 "--param=builtin_size=600", cwd=root, env=env)
    assert r.returncode == 0, r.stderr
    r = run_step("components.steps.tokenize:tokenize", f"--input=dataset={root / 'data'}",
                 f"--output=tokens={root / 'tok'}", "--param=seq_len=64", cwd=root, env=env)
    assert r.returncode == 0, r.stderr
    return root / "tok"


TUNE = "components.steps.finetune:finetune"
SIX_STEPS = ("--param=max_steps=6", "--param=batch_size=4")


@pytest.fixture(scope="session")
def finetuned(tokens: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The 6-step LoRA finetune of ``tokens`` (batch 4, one process, no MLflow) once, for the step-level tests:
    its model directory; read only."""
    root = tmp_path_factory.mktemp("tuned")
    env = {**os.environ, "LLMPACK_MLFLOW_LOGGING": "0", "HF_HUB_OFFLINE": "1"}
    r = run_step(TUNE, f"--input=tokens={tokens}", f"--output=model={root / 'model'}", *SIX_STEPS, cwd=root, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    return root / "model"


@pytest.fixture()
def loopback_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The environment of a test that talks to the loopback cluster (``standins.loopback.isolate``)."""
    from standins.loopback import isolate

    isolate(monkeypatch, tmp_path)


@pytest.fixture()
def loopback(loopback_env: None, tmp_path: Path, tracking_uri: str) -> Iterator[LoopbackCluster]:
    """The loopback cluster (the three stand-ins made one by the fake cluster), closed after the test."""
    from standins.loopback import LoopbackCluster

    with LoopbackCluster(tmp_path, tracking_uri) as c:
        yield c
