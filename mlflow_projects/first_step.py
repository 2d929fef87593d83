"""Start the pipeline's first step before ``main`` imports MLflow: its start-up overlaps ``main``'s.

Under ``mlflow run``, ``main`` knows everything the first step's command needs without MLflow:
its parent run (``MLFLOW_RUN_ID``, which ``mlflow run`` sets), hence the ``pipeline_run`` id,
the artifact paths, the parameters, and the entry point's command in ``MLproject``. What it
needs MLflow for (importing it, opening the store, tagging the parent, creating the step's
child run) took ~2 s before the first step could start: the first step now starts
first, and those run beside its start-up.

The command is the one MLflow's local backend would run (``EntryPoint.compute_command``:
declared parameters in order, defaults filled, values shell-quoted, undeclared ones appended as
``--name value``; a ``path`` that exists locally made absolute), in ``bash -c`` in its own session, in the project directory, with the same
environment except ``MLFLOW_RUN_ID``: the child run does not exist yet, so the step is told
it later. Once ``main`` has tagged the parent as the pipeline's record and created the child
run, it writes the child's id to the file named by ``LLMPACK_RUN_ID_FILE``
(:mod:`components.process.handoff`); the step reads it before it uploads its records, so its
records never land before the record they belong to is marked (the step would otherwise
open a record of its own). A first entry point with a ``uri`` or a remote ``path`` parameter, or no
``MLFLOW_RUN_ID`` (``main.py`` run by hand), starts its first step the usual way, after MLflow.

**Steps ahead of the record** (:func:`run_ahead`): MLflow's set-up runs in a thread
(:class:`InBackground`) while the first step runs. A first step that is done before it (the
pipeline's ``prepare-data`` takes a tenth of a second) used to leave the second waiting ~1.3 s
for MLflow's import; now, while the set-up is not done, each step that ends with exit code 0 is
followed at once by the next one in DAG order, started the same way (its own run-id file), and
the set-up, once done, creates their child runs in order and hands each its id. A step that
uploads its own records waits for its id before it exits, so under plain ``mlflow run`` this
changes little; under ``llmpack run``/``compare`` the client uploads and the steps go on. A step
that fails, a signal, or an entry point MLflow must resolve stops running ahead: from there each
step starts after its run exists, with its retries, as before.
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
    """The step's output, as it comes, to this process's stdout and the step's log."""
    assert proc.stdout is not None
    with log_path.open("ab") as log:
        for chunk in iter(lambda: proc.stdout.read1(65536), b""):  # type: ignore[union-attr]
            os.write(1, chunk)
            log.write(chunk)
            log.flush()


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
