"""Run the compiled KFP pipeline on this machine with ``kfp.local.SubprocessRunner``.

:func:`run_local` has the contract of :func:`llmpack.run.direct.run_local`: it compiles the pipeline
to ``WORKDIR/pipeline.yaml``, loads it back and runs that package with kfp.local, every task's own
command a subprocess, never a container. kfp.local keeps process-wide state and its tasks inherit
``os.environ``, so the run happens in a child process (``python -m kfp_pipelines.local``) whose
environment is exactly ``env``; its output goes to ``WORKDIR/logs/kfp.log`` and each task's part to
``WORKDIR/logs/<task>.log``. Waits between retries are capped at :data:`LOCAL_MAX_BACKOFF_S`.

Why, and how attempts are counted and billed: docs/internals/backend-internals.md, "KFP: a local run with
kfp.local".
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from components import yamltext
from components.commands import SAFE_PATH_ENV, end_group, last_error_line, pipeline_values
from components.dsl import Pipeline
from components.errors import InputError, RunFailed
from components.names import check_values
from components.process import lifeline
from components.redaction import redact_text

LOCAL_MAX_BACKOFF_S = 1.0
LOG_NAME = "kfp.log"
PACKAGE_NAME = "pipeline.yaml"
ROOT_NAME = "kfp-root"

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_EXECUTING = re.compile(r"Executing task '([^']+)'")
_FINISHED = re.compile(r"Task '([^']+)' finished with status (\w+)")
_INNER_FAILED = re.compile(r"Inner task failed: '([^']+)'")
_EXECUTOR_INPUT = re.compile(r"Got executor_input:\s*$")
# kfp.local warns, for every task, of what it cannot honour locally: the resources and the image
# (a Python environment runs it). Both are known and documented here; ignored in this child only.
_LOCAL_NOOP_WARNINGS = (
    (UserWarning, r"Task '.*': settings \[.*\] have no effect in the current local runner"),
    (RuntimeWarning, r"You may be attemping to run a task that uses custom or non-Python base image"),
)
_KFP_LOGGER_LINE = re.compile(r"^\d\d:\d\d:\d\d\.\d{3} - [A-Z]+ - ")


def run_local(pipe: Pipeline, values: Mapping[str, Any], workdir: Path, env: Mapping[str, str],
              log: IO[str] | None = None) -> dict[str, Path]:
    """Run the pipeline with kfp.local; returns the artifact directories as ``{"task.output": path}``."""
    from kfp_pipelines.compiler import compile_pipeline

    workdir = Path(workdir).resolve()
    logs = workdir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    package = compile_pipeline(pipe, workdir / PACKAGE_NAME)
    root = workdir / ROOT_NAME
    args_path = workdir / "kfp-arguments.json"
    args_path.write_text(json.dumps(_arguments(pipe, values), indent=2, sort_keys=True) + "\n", encoding="utf-8")

    cmd = [sys.executable, "-P", "-m", "kfp_pipelines.local", str(package), "--pipeline-root", str(root),
           "--arguments", str(args_path)]
    rc, statuses, inner_failed = _run_child(cmd, env=env, logs=logs)

    failed = [task for task, status in statuses.items() if status != "SUCCESS"]
    if rc != 0 or failed:
        step = inner_failed or (failed[-1] if failed else "")
        if step:
            task_log = logs / f"{step}.log"
            text = task_log.read_text(encoding="utf-8", errors="replace") if task_log.exists() else ""
            raise RunFailed(step, last_error_line(_step_output(text)))
        kfp_log = (logs / LOG_NAME).read_text(encoding="utf-8", errors="replace")
        raise RunFailed("kfp", f"kfp.local exited with code {rc}: {last_error_line(kfp_log)}")

    artifacts = _artifact_dirs(pipe, root)
    if log is not None:
        print(f"kfp: {len(pipe.tasks)} step{'' if len(pipe.tasks) == 1 else 's'} done in {workdir}", file=log)
    return artifacts


def _step_output(text: str) -> str:
    """A task's log without kfp.local's own lines: what the task's process printed."""
    return "\n".join(line for line in text.splitlines() if not _KFP_LOGGER_LINE.match(line))


def _arguments(pipe: Pipeline, values: Mapping[str, Any]) -> dict[str, Any]:
    """The pipeline arguments, each of its parameter's type (an int given for a float is a float)."""
    full = pipeline_values(pipe, values)
    out: dict[str, Any] = {}
    for name, param in pipe.all_params.items():
        value = full[name]
        if param.type is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        out[name] = value
    return out


def _run_child(cmd: Sequence[str], *, env: Mapping[str, str], logs: Path) -> tuple[int, dict[str, str], str]:
    """Run the kfp.local child; split its output into kfp.log and one log per task."""
    task_files: dict[str, IO[str]] = {}
    child_env = {**env, "PYTHONUNBUFFERED": "1", **SAFE_PATH_ENV}  # its executors too: nothing from the cwd
    try:
        with (logs / LOG_NAME).open("a", encoding="utf-8") as main_log:
            main_log.write(f"$ {' '.join(cmd)}\n")
            main_log.flush()
            # Its own process group, so an interrupt of ours ends kfp.local's executors too.
            with subprocess.Popen(list(cmd), env=child_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True, encoding="utf-8", errors="replace", bufsize=1,
                                  start_new_session=True, preexec_fn=lifeline.preexec()) as proc:
                try:
                    statuses, inner_failed = _split_output(proc, main_log, logs, task_files)
                except BaseException:
                    end_group(proc)
                    raise
                rc = proc.wait()
    finally:
        for fh in task_files.values():
            fh.close()
    return rc, statuses, inner_failed


def _split_output(proc: subprocess.Popen[str], main_log: IO[str], logs: Path,
                  task_files: dict[str, IO[str]]) -> tuple[dict[str, str], str]:
    """Copy the child's output to kfp.log and each task's lines to ``<task>.log``, line by line through the one
    redaction path (round 24: a step's own raw write of a secret stayed in both); collect task statuses."""
    from components.redaction import redact_text, secrets_in

    known = secrets_in()
    statuses: dict[str, str] = {}
    inner_failed = ""
    current: IO[str] | None = None
    in_json = False  # inside the executor's "Got executor_input:" dump (kept in kfp.log, not in the task's log)
    assert proc.stdout is not None
    for raw in proc.stdout:
        line = redact_text(_ANSI.sub("", raw).rstrip("\n"), known) + "\n"
        main_log.write(line)
        main_log.flush()
        if in_json:
            in_json = not line.startswith("    }")  # the dump ends with its closing brace, indented as it began
            continue
        if _EXECUTOR_INPUT.search(line):
            in_json = True
            if current is not None:
                # its own line (trial 10: the pattern's \s*$ took the line end, and the step's error line was
                # joined to this one)
                current.write(_EXECUTOR_INPUT.sub("Got executor_input (in kfp.log)", line.rstrip("\n")) + "\n")
            continue
        started = _EXECUTING.search(line)
        if started:
            name = started.group(1)
            if name not in task_files:
                task_files[name] = (logs / f"{name}.log").open("a", encoding="utf-8")
            current = task_files[name]
        if current is not None:
            current.write(line)
            current.flush()
        finished = _FINISHED.search(line)
        if finished:
            statuses[finished.group(1)] = finished.group(2)
            current = None
        inner = _INNER_FAILED.search(line)
        if inner:
            inner_failed = inner.group(1)
    return statuses, inner_failed


def _artifact_dirs(pipe: Pipeline, root: Path) -> dict[str, Path]:
    """Where kfp.local put each output: ``ROOT/<pipeline>-<timestamp>/<task>/<output>``."""
    runs = sorted(p for p in root.glob(f"{pipe.name}-*") if p.is_dir())
    if len(runs) != 1:
        raise RunFailed("kfp", f"expected one kfp.local run under {root}, found {len(runs)}")
    artifacts: dict[str, Path] = {}
    for task in pipe.task_order():
        for name in task.step.outputs:
            path = runs[0] / task.name / name
            if not path.is_dir():
                raise RunFailed(task.name, f"output {name!r} missing at {path}")
            artifacts[f"{task.name}.{name}"] = path
    return artifacts


# --------------------------------------------------------------------------- the child process


class _CappedTime:
    """``time`` for kfp.local's retry loop, with each sleep capped at LOCAL_MAX_BACKOFF_S."""

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)

    @staticmethod
    def sleep(seconds: float) -> None:
        time.sleep(min(seconds, LOCAL_MAX_BACKOFF_S))


def _read_arguments(path: Path) -> dict[str, Any]:
    """``--arguments``: a JSON object of pipeline arguments, or one line saying what is wrong."""
    try:
        arguments = json.loads(yamltext.read_text(path, f"--arguments {path}"))
    except json.JSONDecodeError as exc:
        raise InputError(f"--arguments {path}: line {exc.lineno} column {exc.colno}: "
                         f"not valid JSON ({exc.msg})") from None
    except RecursionError:
        raise InputError(f"--arguments {path}: JSON nested too deeply") from None
    if not isinstance(arguments, dict):
        raise InputError(f"--arguments {path}: expected a JSON object of pipeline arguments")
    return arguments


def _load_package(path: Path, components: Any) -> Any:
    """The compiled pipeline package as a kfp component; anything that is not one is one line (exit 2).

    kfp's loader answers a foreign YAML with a KeyError or a protobuf ParseError and a traceback,
    so the document's kind is checked here first and the loader's own complaint cut to one line.
    """
    text = yamltext.read_text(path, f"package {path}")
    first = next(iter(yamltext.safe_load(text, f"package {path}", documents=True)), None)
    if not isinstance(first, dict) or "pipelineInfo" not in first or "root" not in first:
        kind = first.get("kind") if isinstance(first, dict) else None
        what = f"it is a {kind}" if isinstance(kind, str) else "no pipelineInfo and root"
        raise InputError(f"package {path}: not a compiled KFP pipeline ({what})")
    try:
        return components.load_component_from_file(str(path))
    except Exception as exc:  # noqa: BLE001 - kfp's loader raises many types for a broken spec: one line
        detail = str(exc).splitlines()[0] if str(exc) else ""
        raise InputError(f"package {path}: kfp cannot load it ({type(exc).__name__}: {detail})") from None


def quiet_local_noops() -> None:
    """kfp.local's per-task warnings of settings it cannot honour locally, ignored in this child process only
    (the module doc says what kfp.local ignores; the warnings repeated it for every task)."""
    import warnings

    for category, message in _LOCAL_NOOP_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category)


def end_group_on_term() -> None:
    """On SIGTERM (an interrupt, or the client's death: :mod:`components.process.lifeline`), end this
    process's whole group: kfp.local starts each task under ``sh -ec``, which does not pass it on."""
    import signal

    def end(signum: int, _frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        os.killpg(os.getpgrp(), signal.SIGTERM)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, end)


def _child(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kfp_pipelines.local",
                                     description="Run a compiled KFP pipeline package with kfp.local.")
    parser.add_argument("package", help="compiled pipeline YAML")
    parser.add_argument("--pipeline-root", required=True)
    parser.add_argument("--arguments", required=True, help="JSON file: the pipeline arguments")
    args = parser.parse_args(argv)
    lifeline.at_start()
    end_group_on_term()
    quiet_local_noops()

    import kfp.local
    from kfp import components

    try:
        from kfp.local.orchestrator import task_executor

        if hasattr(task_executor, "time"):
            task_executor.time = _CappedTime()  # type: ignore[assignment]
    except ImportError:  # an older kfp: retries without the local cap
        pass

    try:
        arguments = _read_arguments(Path(args.arguments))
        check_values(arguments, f"--arguments {args.arguments}:")  # run ids and model names, before any task
        pipeline = _load_package(Path(args.package), components)
    except InputError as exc:
        print(redact_text(f"llmpack: error: {exc}"), file=sys.stderr)
        return exc.exit_code
    kfp.local.init(runner=kfp.local.SubprocessRunner(use_venv=False), pipeline_root=args.pipeline_root,
                   raise_on_error=True)
    try:
        pipeline(**arguments)
    except RuntimeError as exc:
        print(f"kfp.local: {exc}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(_child())
