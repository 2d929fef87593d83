"""The MLflow driver starts the first step before it imports MLflow: same command, same record.

``mlflow_projects.first_step`` computes the first entry point's command itself (MLflow is not
imported yet): it must be the very command MLflow's local backend runs. The step is handed its
child run once the parent is marked as the pipeline's record, and waits for it before uploading
(``components.process.handoff``), so its records land on the one record, never a second one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from components.dsl import pipeline
from mlflow_projects import compiler, driver, main_signals
from mlflow_projects.first_step import entry_point_command

MLFLOW_DIR = Path(compiler.__file__).resolve().parent
PROJECTS = [MLFLOW_DIR / compiler.LOCAL_DIR, MLFLOW_DIR / "finetune-k8s"]


@pytest.mark.parametrize("project", PROJECTS, ids=lambda p: p.name)
def test_the_early_command_is_the_one_mlflow_runs(project: Path, tmp_path: Path):
    from mlflow.projects.utils import get_entry_point_command, load_project

    spec = json.loads((project / driver.SPEC_FILE).read_text())
    values = {p["name"]: str(p["default"]) for p in spec["params"]}
    values.update(data="a b'c $HOME \"q\"", pipeline_run="run-1")
    loaded = load_project(str(project))
    for task in spec["tasks"]:
        params = driver.step_parameters(task, values, tmp_path / "run dir")
        for src in task["inputs"].values():  # MLflow checks that a path parameter exists
            (tmp_path / "run dir" / src["task"] / src["output"]).mkdir(parents=True, exist_ok=True)
        for given in (params, {**params, "undeclared": "x y"}):
            mine = entry_point_command(project, task["entry_point"], given)
            theirs = " ".join(get_entry_point_command(loaded, task["entry_point"], given, None))
            assert mine == theirs, task["name"]


def test_an_entry_point_mlflow_must_resolve_is_left_to_mlflow(tmp_path: Path):
    (tmp_path / "MLproject").write_text(
        "name: p\nentry_points:\n  a:\n    parameters:\n      f: {type: path}\n    command: cat {f}\n"
        "  b:\n    parameters:\n      n: {type: int}\n    command: echo {n}\n")
    assert entry_point_command(tmp_path, "a", {"f": "s3://b/x"}) is None  # a remote path: MLflow downloads it
    assert entry_point_command(tmp_path, "a", {"f": "nowhere"}) is None  # missing: MLflow says so
    assert entry_point_command(tmp_path, "a", {"f": str(tmp_path)}) == f"cat {tmp_path}"
    assert entry_point_command(tmp_path, "b", {}) is None  # no value, no default: MLflow says so
    assert entry_point_command(tmp_path, "b", {"n": "3"}) == "echo 3"
    assert entry_point_command(tmp_path, "missing", {}) is None


def test_a_step_waits_for_its_run_before_uploading(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from components.process import handoff

    run_file = tmp_path / "run-id"
    monkeypatch.setenv("LLMPACK_RUN_ID_FILE", str(run_file))
    monkeypatch.setenv("LLMPACK_TRACKING_MAX_WAIT_S", "30")
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    timer = threading.Timer(0.3, lambda: run_file.write_text("abc123"))
    t0 = time.monotonic()
    timer.start()
    assert handoff.await_run_id() == "abc123"
    assert time.monotonic() - t0 >= 0.25
    assert os.environ["MLFLOW_RUN_ID"] == "abc123"


def test_without_a_handed_run_the_wait_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from components.process import handoff

    monkeypatch.setenv("LLMPACK_RUN_ID_FILE", str(tmp_path / "never"))
    monkeypatch.setenv("LLMPACK_TRACKING_MAX_WAIT_S", "0.2")
    t0 = time.monotonic()
    assert handoff.await_run_id() is None
    assert 0.15 <= time.monotonic() - t0 < 5
    monkeypatch.delenv("LLMPACK_RUN_ID_FILE")
    assert handoff.await_run_id() is None  # not asked: no wait at all


STEPS = '''
from pathlib import Path

from components.dsl import Dataset, Input, Output, step


@step(name="first-make")
def first_make(out: Output[Dataset], text: str = "hello") -> None:
    """Write the text."""
    (Path(out.path) / "data.txt").write_text(text)


@step(name="first-shout")
def first_shout(data: Input[Dataset], out: Output[Dataset]) -> None:
    """Upper-case it."""
    (Path(out.path) / "data.txt").write_text((Path(data.path) / "data.txt").read_text().upper())
'''


def _steps_module(tmp_path: Path, name: str, source: str) -> Any:
    """Steps written to ``tmp_path/<name>.py``: the step processes import it by name (PYTHONPATH), this one
    from its file."""
    import importlib.util

    (tmp_path / f"{name}.py").write_text(source, encoding="utf-8")
    spec = importlib.util.spec_from_file_location(name, tmp_path / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _plain_env(tmp_path: Path, tracking_uri: str, **extra: str) -> dict[str, str]:
    """A plain ``mlflow run``'s environment: no llmpack client, the steps beside it importable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "LLMPACK_"))}
    env.update(PYTHONPATH=os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH", "")) if p),
               PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
               MLFLOW_TRACKING_URI=tracking_uri, **extra)
    return env


@pytest.mark.slow
def test_plain_mlflow_run_starts_the_first_step_first_and_keeps_one_record(tmp_path: Path, fresh_tracking_uri: str):
    """``mlflow run`` with no llmpack client, the steps uploading their own records."""
    from mlflow.tracking import MlflowClient

    from components.record.telemetry import EVENTS_FILE, read_records

    mod = _steps_module(tmp_path, "first_steps", STEPS)

    @pipeline(name="first")
    def first(text: str = "hello"):
        made = mod.first_make(text=text)
        mod.first_shout(data=made.outputs["out"])

    project = compiler.write_local_project(first(), tmp_path / "project")
    env = _plain_env(tmp_path, fresh_tracking_uri)
    proc = subprocess.run([str(Path(sys.executable).with_name("mlflow")), "run", str(project), "-e", "main",
                           "--env-manager", "local", "-P", f"artifacts_dir={tmp_path / 'art'}", "-P", "text=x y"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    (run_dir,) = (tmp_path / "art").iterdir()
    assert (run_dir / "first-shout" / "out" / "data.txt").read_text() == "X Y"

    mc = MlflowClient(fresh_tracking_uri)
    runs = mc.search_runs([e.experiment_id for e in mc.search_experiments()])
    # one record (in the llmpack experiment), and the run `mlflow run` made in Default linked to it
    (parent,) = [r for r in runs if r.data.tags.get("llmpack.record") == "pipeline"]
    (shell,) = [r for r in runs if "mlflow.parentRunId" not in r.data.tags and r is not parent]
    assert shell.data.tags["llmpack.record_run_id"] == parent.info.run_id
    children = {r.data.tags["llmpack.step"]: r
                for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id}
    assert sorted(children) == ["first-make", "first-shout"]
    assert all(r.info.status == "FINISHED" for r in runs)
    # The first step's process started before its run existed: MLflow's set-up ran beside its start-up ...
    records = read_records([run_dir / "first-make" / "out" / EVENTS_FILE])
    started = {r.name: r.value for r in records if r.kind == "event"}
    assert started["process_started"] < children["first-make"].info.start_time / 1000
    # ... and its records still landed on the pipeline's one record.
    assert {r.mlflow_key for r in records} <= set(parent.data.metrics)
    assert (run_dir / "logs" / "first-make.log").read_text().strip()
    assert [a.path for a in mc.list_artifacts(children["first-make"].info.run_id, "logs")] == ["logs/first-make.log"]


def test_a_signal_during_the_set_up_is_held_then_raised(monkeypatch: pytest.MonkeyPatch):
    """The set-up (first step started, MLflow importing) is not cut in the middle; the signal comes right after."""
    import signal

    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    monkeypatch.setattr(main_signals, "SIGNAL_RECEIVED", [])
    try:
        main_signals.raise_on_signals()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)  # delivered, noted, not raised
        assert main_signals.SIGNAL_RECEIVED == [signal.SIGTERM]
        with pytest.raises(KeyboardInterrupt):
            main_signals.release_signals()
        with pytest.raises(KeyboardInterrupt):  # after the set-up: at once
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
        main_signals.HOLDING[0] = False


SLOW_FIRST = '''
import os
import time
from pathlib import Path

from components.dsl import Dataset, Output, step


@step(name="first-wait")
def first_wait(out: Output[Dataset]) -> None:
    """Say it started, then take long."""
    Path(os.environ["FIRST_MARK"]).write_text(str(os.getpid()))
    time.sleep(120)
'''


def _main_of(pid: int) -> int | None:
    """The ``main.py`` process above ``pid``."""
    while pid > 1:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if any(part.endswith(b"main.py") for part in cmdline):
            return pid
        pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    return None


@pytest.mark.slow
def test_sigterm_as_the_first_step_starts_ends_it_and_the_record(tmp_path: Path, fresh_tracking_uri: str):
    """SIGTERM to ``main`` while its set-up may still run beside the first step: 143, KILLED, nothing left running."""
    import signal

    from mlflow.tracking import MlflowClient

    mod = _steps_module(tmp_path, "slow_first", SLOW_FIRST)

    @pipeline(name="slow")
    def slow():
        mod.first_wait()

    project = compiler.write_local_project(slow(), tmp_path / "project")
    mark = tmp_path / "started"
    env = _plain_env(tmp_path, fresh_tracking_uri, FIRST_MARK=str(mark))
    proc = subprocess.Popen([str(Path(sys.executable).with_name("mlflow")), "run", str(project), "-e", "main",
                             "--env-manager", "local", "-P", f"artifacts_dir={tmp_path / 'art'}"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while not mark.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert mark.exists(), proc.communicate()[1][-3000:]
    step_pid = int(mark.read_text())
    main_pid = _main_of(step_pid)
    assert main_pid is not None
    os.kill(main_pid, signal.SIGTERM)
    _out, err = proc.communicate(timeout=300)
    assert "Traceback" not in err, err[-3000:]
    assert proc.returncode != 0
    assert not Path(f"/proc/{step_pid}").exists(), "the first step outlived main"
    (run_dir,) = (tmp_path / "art").iterdir()
    assert json.loads((run_dir / driver.STATUS_FILE).read_text())["status"] == "KILLED"
    mc = MlflowClient(fresh_tracking_uri)
    runs = mc.search_runs([e.experiment_id for e in mc.search_experiments()])
    assert runs and not [r for r in runs if r.info.status == "RUNNING"]
    (rec,) = [r for r in runs if r.data.tags.get("llmpack.record") == "pipeline"]
    # main ends it KILLED; plain `mlflow run` then marks its own run FAILED, as main exited non-zero
    assert rec.info.status in ("KILLED", "FAILED")
    assert rec.data.tags["llmpack.status"] == "killed"  # what main's closing block derived


def _started(tmp_path: Path, code: int, n: int) -> Any:
    from mlflow_projects.first_step import launch

    return launch(tmp_path, f"exit {code}", tmp_path, tmp_path / "logs" / f"s{n}.log", task=f"s{n}")


@pytest.mark.parametrize(("codes", "ready", "ran"), [
    ((0, 0, 0), False, [0, 1, 2]),  # the set-up still running: each step done with 0 is followed by the next
    ((0, 3, 0), False, [0, 1]),     # a failed step stops running ahead: its retry waits for its run
    ((0, 0, 0), True, [0]),         # the set-up done: the steps start after their runs exist, as before
])
def test_steps_run_ahead_of_the_record_only_while_the_set_up_runs(tmp_path: Path, codes: tuple[int, ...], ready: bool,
                                                                    ran: list[int]) -> None:
    from mlflow_projects.first_step import run_ahead

    done = threading.Event()
    if ready:
        done.set()
    started = {0: _started(tmp_path, codes[0], 0)}
    run_ahead(started, len(codes), lambda n: _started(tmp_path, codes[n], n), done, lambda: False)
    assert sorted(started) == ran
    assert [started[n].wait() for n in ran] == [codes[n] for n in ran]
    stopped = {0: _started(tmp_path, 0, 0)}
    run_ahead(stopped, 3, lambda n: _started(tmp_path, 0, n), threading.Event(), lambda: True)  # a signal noted
    assert sorted(stopped) == [0] and stopped[0].wait() == 0
