"""How a task becomes a command line: shared by every backend so all of them run the same thing.

    python -m components.run <module:function> --input NAME=DIR --output NAME=DIR --param NAME=VALUE
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from components import bounded
from components.dsl import Pipeline, PipelineParamRef, Task, iter_param_args
from components.errors import InputError
from components.process import lifeline

STEP_MODULE = "components.run"
#: Every process a local run starts begins with a safe ``sys.path`` (``python -P``, Python >= 3.11): the working
#: directory is not on it, so a ``tokenize.py`` there is never imported. The variable reaches what those processes
#: start in turn (torchrun's ranks, kfp.local's executors, ``mlflow run``'s entry point); ``--pipeline`` puts its
#: own directory on ``PYTHONPATH`` explicitly (llmpack.run.user_pipeline). docs/internals/step-process.md, "Safe path".
SAFE_PATH_ENV = {"PYTHONSAFEPATH": "1"}


def format_value(value: Any) -> str:
    """Parameter value as text, exact for floats (repr round-trips), lower-case for bools."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def parse_pairs(items: Sequence[str], flag: str, shape: str = "NAME=VALUE") -> dict[str, str]:
    """``NAME=VALUE`` command-line items as a dict; an item without ``=`` is one InputError naming ``flag``."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise InputError(f"{flag} {item!r}: expected {shape}")
        out[key] = value
    return out


def task_params(task: Task, values: Mapping[str, Any]) -> dict[str, Any]:
    """The task's parameters with pipeline parameters replaced by ``values``."""
    out = {}
    for key, arg in iter_param_args(task):
        out[key] = values[arg.name] if isinstance(arg, PipelineParamRef) else arg
    return out


def step_args(
    task: Task,
    *,
    inputs: Mapping[str, str],
    outputs: Mapping[str, str],
    params: Mapping[str, Any],
) -> list[str]:
    """Arguments after ``python``: ``-m components.run REF --input ... --output ... --param ...``."""
    args = ["-m", STEP_MODULE, task.step.ref]
    args += [f"--input={k}={v}" for k, v in inputs.items()]
    args += [f"--output={k}={v}" for k, v in outputs.items()]
    args += [f"--param={k}={format_value(v)}" for k, v in params.items()]
    return args


def pipeline_values(pipe: Pipeline, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Every pipeline parameter (user and telemetry) with its default unless overridden."""
    return {name: overrides.get(name, p.default) for name, p in pipe.all_params.items()}


def run_logged(cmd: Sequence[str], *, env: Mapping[str, str], log_path: Path,
               cwd: str | Path | None = None) -> tuple[int, str]:
    """Run a command with its output appended to ``log_path``, line by line through the one redaction path (a
    library's own print or traceback, MLflow's CLI's with the tracking URI whole: round 21); returns (exit code,
    last error line)."""
    import threading

    from components.redaction import redact_text, secrets_in

    log_path.parent.mkdir(parents=True, exist_ok=True)
    known = secrets_in()  # this process's (its argv's tracking URI, its environment's tokens), once
    with os.fdopen(bounded.open_append(log_path), "a", encoding="utf-8") as log:  # never through a planted link
        log.write(redact_text(f"$ {' '.join(cmd)}", known) + "\n")
        log.flush()
        proc = subprocess.Popen(list(cmd), env={**env, **SAFE_PATH_ENV}, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, cwd=cwd, start_new_session=True,
                                preexec_fn=lifeline.preexec())  # dies with us, however we die

        def copy() -> None:
            assert proc.stdout is not None
            for raw in iter(proc.stdout.readline, b""):
                log.write(redact_text(raw.decode("utf-8", errors="replace").rstrip("\n"), known) + "\n")
                log.flush()

        copier = threading.Thread(target=copy, daemon=True)
        copier.start()
        rc = wait_or_end_group(proc)
        copier.join(timeout=30)  # the group's last writers gone: the pipe ends
        if not copier.is_alive() and proc.stdout is not None:
            proc.stdout.close()
    return rc, last_error_line(log_path.read_text(encoding="utf-8", errors="replace"))


def wait_passing_signals(proc: subprocess.Popen[Any], pass_on: Sequence[int]) -> tuple[int, int | None]:
    """Wait for ``proc`` while SIGTERM and SIGINT that reach this process are caught, not raised.

    Those in ``pass_on`` are sent on to ``proc``; the others are left to it (a process group's
    Ctrl-C reaches it anyway). Returns ``proc``'s exit code and the first signal caught (or None).
    """
    got: list[int] = []

    def catch(signum: int, _frame: Any) -> None:
        got.append(signum)
        if signum in pass_on and proc.poll() is None:
            proc.send_signal(signum)

    previous = {sig: signal.signal(sig, catch) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        while True:
            try:
                rc = proc.wait()
                break
            except KeyboardInterrupt:  # a handler set elsewhere raised: keep waiting
                continue
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return rc, (got[0] if got else None)


def wait_or_end_group(proc: subprocess.Popen[Any], grace_s: float = 15.0) -> int:
    """Wait for a child started with ``start_new_session=True``; if we are interrupted, end its whole group.

    The child leads its own process group, so an interrupt of ours (Ctrl-C, SIGTERM, a timeout)
    reaches every process it started too (``mlflow run``'s driver, kfp.local's executors): first
    SIGINT, so each closes its records as KILLED, then SIGKILL for whatever is left after
    ``grace_s``. Nothing keeps running, or holding a GPU, after the client is gone.
    """
    try:
        return proc.wait()
    except BaseException:
        end_group(proc, grace_s)
        raise


def end_group(proc: subprocess.Popen[Any], grace_s: float = 15.0) -> None:
    """SIGINT to the child's process group, then SIGKILL after ``grace_s`` (see :func:`wait_or_end_group`)."""
    for sig, wait_s in ((signal.SIGINT, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue
        except BaseException:  # a second Ctrl-C while waiting: go straight to SIGKILL
            continue


#: the line a step prints after the traceback of a crash whose message has several lines: its type and first line
CRASH_MARK = "llmpack: crashed:"


def last_error_line(text: str) -> str:
    """The most telling line of a failed step's output: its ``llmpack: error:`` line, else its crash line (a
    multi-line exception's type and first line), else the last one."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for mark in ("llmpack: error:", CRASH_MARK):
        for line in reversed(lines):
            if mark in line:
                return line.split(mark, 1)[1].strip()
    return lines[-1] if lines else "no output"
