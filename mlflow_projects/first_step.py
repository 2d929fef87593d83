"""Start the pipeline's first step before ``main`` imports MLflow: its start-up overlaps ``main``'s.

Under ``mlflow run``, ``main`` knows everything the first step's command needs without MLflow (its
parent run ``MLFLOW_RUN_ID``, the parameters, the entry point's command in ``MLproject``), so the
first step starts first, running the command MLflow's local backend would run, and MLflow's
import, store and child run (~2 s) run beside its start-up. The child run's id is handed over
later through the file named by ``LLMPACK_RUN_ID_FILE`` (:mod:`components.process.handoff`),
before the step uploads its records. While the set-up is not done, each step that succeeds is
followed at once by the next (:func:`run_ahead`, the set-up in :class:`InBackground`).

How the command is computed, when a first step starts the usual way instead, and when running
ahead stops: docs/internals/backend-internals.md, "MLflow: the first step before MLflow"; the driver:
docs/internals/decisions.md, "The MLflow path's driver".
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from components import settings

RUN_ID_FILE_NAME = ".llmpack-step-run-id"


def entry_point_command(project_dir: Path, entry_point: str, params: Mapping[str, str]) -> str | None:
    """The entry point's command as MLflow's local backend computes it, or None to leave it to MLflow."""
    from components import yamltext

    mlproject = project_dir / "MLproject"
    try:
        doc = yamltext.load_file(mlproject, str(mlproject))
        spec = doc["entry_points"][entry_point]
        command, declared = spec["command"], spec.get("parameters") or {}
    except Exception:  # noqa: BLE001 - anything unusual: MLflow itself says what is wrong, later
        return None
    values: dict[str, str] = {}
    for name, decl in declared.items():
        kind, default = (decl, None) if isinstance(decl, str) else (decl.get("type", "string"), decl.get("default"))
        value = params.get(name, default)
        if kind == "path" and value is not None and "://" not in str(value) and os.path.exists(str(value)):
            value = os.path.abspath(str(value))  # what MLflow makes of a local path that exists
        elif kind in ("path", "uri") or value is None:
            return None  # to download, to check or missing: MLflow does it, or says what is wrong
        values[name] = shlex.quote(str(value))
    extra = [f"--{shlex.quote(k)} {shlex.quote(str(v))}" for k, v in params.items() if k not in declared]
    try:
        return " ".join([command.format(**values), *extra])
    except (KeyError, IndexError, ValueError):
        return None


@dataclass(kw_only=True)
class FirstStep:
    """The first step's process, started early; :meth:`hand_run_id` tells it its run, :meth:`wait` ends it."""

    proc: subprocess.Popen[bytes]
    run_id_file: Path
    log_path: Path
    log_start: int
    pump: threading.Thread = field(repr=False)

    def hand_run_id(self, run_id: str) -> None:
        """The child run exists and the parent is marked: tell the step (atomically)."""
        tmp = self.run_id_file.with_name(self.run_id_file.name + ".tmp")
        tmp.write_text(run_id, encoding="utf-8")
        os.replace(tmp, self.run_id_file)

    def wait(self) -> int:
        """The step's exit code; interrupted, its whole process group is ended first."""
        try:
            rc = self.proc.wait()
        except BaseException:
            self.end()
            raise
        self.pump.join()
        return rc

    def end(self) -> None:
        end_process_group(self.proc)
        self.pump.join(timeout=5)


def end_process_group(proc: subprocess.Popen[Any], grace_s: float = 15.0) -> None:
    """SIGTERM to the step's process group, SIGKILL after ``grace_s``."""
    import signal

    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=wait_s)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def launch(project_dir: Path, command: str, run_dir: Path, log_path: Path, *, env: Mapping[str, str] | None = None,
           task: str = "") -> FirstStep:
    """Start ``command`` as MLflow's local backend would, its output to the terminal and ``log_path``.

    ``env``: the environment to start it in (default: this process's), taken before MLflow's set-up
    began in its thread; ``task`` names the step's own run-id file."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_start = log_path.stat().st_size if log_path.exists() else 0
    line = f"=== Running command '{command}' (its run is created while it starts) ===\n"
    sys.stderr.write(line)
    with log_path.open("a", encoding="utf-8") as log:
        log.write(line)
    run_id_file = run_dir / (f"{RUN_ID_FILE_NAME}.{task}" if task else RUN_ID_FILE_NAME)
    run_id_file.unlink(missing_ok=True)
    env = {k: v for k, v in (os.environ if env is None else env).items() if k != "MLFLOW_RUN_ID"}
    env[settings.RUN_ID_FILE.name] = str(run_id_file)
    sys.stdout.flush()
    sys.stderr.flush()
    proc = subprocess.Popen(["bash", "-c", command], cwd=str(project_dir), env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    pump = threading.Thread(target=_copy_output, args=(proc, log_path), daemon=True)
    pump.start()
    return FirstStep(proc=proc, run_id_file=run_id_file, log_path=log_path, log_start=log_start, pump=pump)


def _copy_output(proc: subprocess.Popen[bytes], log_path: Path) -> None:
    """The step's output, as it comes (whole lines, redacted), to this process's stdout and the step's log."""
    from mlflow_projects.driver_output import copy_redacted

    assert proc.stdout is not None
    with log_path.open("ab") as log:
        copy_redacted(lambda: proc.stdout.read1(65536), 1, log)  # type: ignore[union-attr]


def tell_step(first: Any, run_id: str) -> None:
    """Hand the child run's id to an early first step (no-op for a step started by MLflow)."""
    if first is not None:
        first.hand_run_id(run_id)


class InBackground(threading.Thread):
    """``fn()`` in a thread (MLflow's import, the store, the record); :meth:`value` joins and returns or raises."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        super().__init__(name="llmpack-mlflow-setup", daemon=True)
        self.fn, self.ready = fn, threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self.fn()
        except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread by value()
            self.error = exc
        finally:
            self.ready.set()

    def value(self) -> Any:
        self.join()
        if self.error is not None:
            raise self.error
        return self.result


def run_ahead(started: dict[int, FirstStep], count: int, start: Callable[[int], FirstStep | None],
              ready: threading.Event, interrupted: Callable[[], bool]) -> None:
    """While ``ready`` is not set: each step of ``started`` that ends with exit code 0 is followed by the
    next (``start(n)``, None where it cannot start early). Stops at a failure, a signal, the last
    step, or the set-up done; the steps still running are the caller's."""
    n = 0
    while n in started and n + 1 < count:
        step = started[n]
        while step.proc.poll() is None and not ready.wait(0.01):
            pass
        if ready.is_set() or step.proc.returncode != 0 or interrupted():
            return
        nxt = start(n + 1)
        if nxt is None:
            return
        started[n + 1] = nxt
        n += 1
