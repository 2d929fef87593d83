"""The ``main`` entry point of a generated MLflow project: run the pipeline's steps as child runs.

Every generated project's ``main.py`` is a few-line shim (:data:`mlflow_projects.compiler.MAIN_SHIM`)
that calls :func:`main` with its own directory; what differs between pipelines is the data file
beside it, ``pipeline.json`` (DAG order, artifact wiring, parameter types, retries), written by
:mod:`mlflow_projects.compiler`. The steps need llmpack installed anyway (``python_env.yaml``, the
image), so the driver is imported from it rather than copied into every project.

MLflow's multistep pattern, with run ids passed explicitly (no fluent active-run state):

* the parent run is the one ``mlflow run`` created for ``main`` (``MLFLOW_RUN_ID``), or a new
  one when this file is run by hand;
* for each task, in DAG order, a child run is created with ``mlflow.parentRunId`` and the
  ``llmpack.pipeline_run`` / ``llmpack.orchestrator`` / ``llmpack.step`` tags, then the task's
  entry point runs in it: ``mlflow.projects.run(uri=<this dir>, entry_point=...,
  env_manager="local", run_id=<child>)``, synchronously;
* in a ``docker_env`` project (``finetune-k8s``) MLflow has already put ``main`` inside the
  image (a Kubernetes Job or ``docker run``), where ``mlflow.projects.run`` would try to build
  the image again; there each entry point's command is run in place, as MLflow's local backend
  runs it (same command, same ``MLFLOW_RUN_ID`` environment).

The run ``mlflow run`` created for ``main`` *is* the pipeline run's record (tag
``llmpack.record=pipeline``): the steps log their events to it and, in ``main``'s final block,
:func:`components.record.close` derives the metrics and cost tags and ends it FINISHED, FAILED
or KILLED (SIGINT or SIGTERM of ``main``: exit code 130 or 143). Without a client's
``submitted_at``, the run's own start time is the submit time; an empty ``pipeline_run`` is
``mlflow-<run id>``.

A child that fails is retried per its step spec (unless it failed with an ``llmpack: error:``
line: bad input or a failed quality gate are not transient); then ``main`` fails with the
child's ``llmpack: error:`` line. Each attempt is a child run of its own (tag ``llmpack.attempt``)
and its step is told the attempt in ``LLMPACK_ATTEMPT``, so the attempt's records keep their own
keys on the pipeline's record and every attempt is billed (``components.record.telemetry``). Each step's output is kept in ``<run dir>/logs/<task>.log``
and a summary in ``<run dir>/llmpack-mlflow-run.json``.

Artifacts of a pipeline run live in ``<artifacts_dir>/<pipeline_run>/<task>/<output>``; a
relative ``artifacts_dir`` is resolved against ``base_dir``, a ``path`` parameter that MLflow
turns into the absolute directory ``mlflow run`` was typed in (MLflow runs this file with the
project directory as its working directory).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SPEC_FILE = "pipeline.json"
STATUS_FILE = "llmpack-mlflow-run.json"
ERROR_MARK = "llmpack: error:"
ATTEMPT_ENV = "LLMPACK_ATTEMPT"  # components.record.telemetry.ATTEMPT_ENV (this file imports only MLflow)


class MainError(Exception):
    """Bad input to ``main``: printed as one ``llmpack: error:`` line, exit code 2."""


class StepError(Exception):
    def __init__(self, task: str, message: str) -> None:
        super().__init__(f"step {task!r} failed: {message}")
        self.task = task
        self.message = message


# --------------------------------------------------------------------------- parameters


def parse_args(argv: list[str], spec: Mapping[str, Any]) -> tuple[dict[str, str], str, str]:
    """``--param NAME=VALUE`` for every pipeline parameter, ``--artifacts-dir``, ``--base-dir``."""
    parser = argparse.ArgumentParser(prog="main.py", description=f"Run pipeline {spec['pipeline']!r}.")
    parser.add_argument("--param", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--artifacts-dir", required=True)
    parser.add_argument("--base-dir", default="")
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        # ``mlflow run -P foo=bar`` with an undeclared name arrives here as ``--foo bar``.
        names = [u[2:] for u in unknown if u.startswith("--")] or unknown
        raise MainError(
            f"unknown parameter {names[0]!r}; the main entry point takes "
            f"{', '.join(p['name'] for p in spec['params'])} and artifacts_dir"
        )
    types = {p["name"]: p["type"] for p in spec["params"]}
    values = {p["name"]: p["default"] for p in spec["params"]}
    for item in args.param:
        name, sep, value = item.partition("=")
        if not sep or name not in types:
            raise MainError(f"--param {item!r}: expected NAME=VALUE with NAME one of {', '.join(types)}")
        values[name] = value
    for name, value in values.items():
        check_value(name, value, types[name])
    return values, args.artifacts_dir, args.base_dir


def check_value(name: str, value: str, typ: str) -> None:
    try:
        if typ == "int":
            int(value)
        elif typ == "float":
            float(value)
        elif typ == "bool" and value.lower() not in ("true", "false", "1", "0", "yes", "no", ""):
            raise ValueError(value)
    except ValueError:
        raise MainError(f"parameter {name!r}: {value!r} is not a valid {typ}") from None


def resolve_artifacts_dir(artifacts_dir: str, base_dir: str) -> Path:
    path = Path(artifacts_dir).expanduser()
    if not path.is_absolute():
        if not base_dir:
            raise MainError(f"artifacts_dir {artifacts_dir!r} must be an absolute path")
        path = Path(base_dir) / path
    return Path(os.path.abspath(path))


def absolute_tracking_uri(uri: str, base_dir: str) -> str:
    """``MLFLOW_TRACKING_URI=sqlite:///mlflow.db`` means the directory ``mlflow run`` was typed in,
    not this project directory, which MLflow makes the working directory of main and its steps."""
    if not uri or not base_dir:
        return uri
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        return "sqlite:///" + os.path.abspath(os.path.join(base_dir, uri[len("sqlite:///") :]))
    if "://" not in uri and not os.path.isabs(uri):
        return os.path.abspath(os.path.join(base_dir, uri))
    return uri


def fill_telemetry(values: dict[str, str], parent: Any) -> None:
    """A run started with plain ``mlflow run`` has no llmpack client: take its ids from MLflow.

    ``submitted_at`` stays as given: the summary takes the run's start time as the orchestrator's
    submit time when it is 0 (``llmpack.submit_time_source=orchestrator``).
    """
    if not values.get("pipeline_run"):
        values["pipeline_run"] = f"mlflow-{parent.info.run_id[:12]}"
    if not values.get("run_group"):
        values["run_group"] = values["pipeline_run"]


_SIGNAL_RECEIVED: list[int] = []


def raise_on_signals() -> None:
    """SIGTERM unwinds like Ctrl-C: a KeyboardInterrupt, which mlflow.projects answers by cancelling
    the running step; ``main`` then ends the record KILLED and exits 128 + the signal's number."""
    import signal

    def handler(signum: int, _frame: Any) -> None:
        _SIGNAL_RECEIVED.append(signum)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


def close_record(spec: Mapping[str, Any], values: Mapping[str, str], parent: Any, status: str, run_dir: Path) -> None:
    """The final block: derive the run's metrics and cost, log them on the record, end it."""
    from components import settings
    from components.record import close as record

    records_dir = os.environ.get(settings.RECORDS_DIR.name) or str(run_dir)
    try:
        record.close(values=values, status=status, uses=record.parse_uses(json.dumps(spec.get("uses", []))),
                     orchestrator_run_id=parent.info.run_id, orchestrator_created_at=parent.info.start_time / 1000.0,
                     records_dir=Path(records_dir))
    except Exception as exc:  # noqa: BLE001 - the steps' JSONL keeps everything; the run's own status stands
        print(f"llmpack: warning: could not close the run's record ({type(exc).__name__}: {exc})", file=sys.stderr)


# --------------------------------------------------------------------------- step output


@contextmanager
def tee_output(log_path: Path) -> Iterator[None]:
    """Send this process's stdout and stderr (and its children's) to the terminal and a log."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved_out, saved_err = os.dup(1), os.dup(2)
    read_end, write_end = os.pipe()
    os.dup2(write_end, 1)
    os.dup2(write_end, 2)
    os.close(write_end)

    def pump() -> None:
        with log_path.open("ab") as log:
            while chunk := os.read(read_end, 65536):
                os.write(saved_out, chunk)
                log.write(chunk)
                log.flush()

    thread = threading.Thread(target=pump, daemon=True)
    thread.start()
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved_out, 1)
        os.dup2(saved_err, 2)
        thread.join()
        for fd in (read_end, saved_out, saved_err):
            os.close(fd)


def error_line(text: str) -> str:
    """The step's ``llmpack: error:`` message, else its last line (same rule as every backend)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        if ERROR_MARK in line:
            return line.split(ERROR_MARK, 1)[1].strip()
    return lines[-1] if lines else "no output"


def deliberate(text: str) -> bool:
    """Did the step fail on purpose (bad input, quality gate) rather than crash?"""
    return ERROR_MARK in text


# --------------------------------------------------------------------------- running


def step_parameters(task: Mapping[str, Any], values: Mapping[str, str], run_dir: Path) -> dict[str, str]:
    params: dict[str, str] = {}
    for name, src in task["inputs"].items():
        params[name] = str(run_dir / src["task"] / src["output"])
    for name, output in task["outputs"].items():
        params[name] = str(run_dir / task["name"] / output)
    for name, src in task["params"].items():
        params[name] = values[src["param"]] if "param" in src else src["value"]
    return params


def run_entry_point(
    spec: Mapping[str, Any], entry_point: str, params: dict[str, str], run_id: str, experiment_id: str
) -> None:
    """Run one entry point in the child run ``run_id``; raises ``ExecutionException`` on failure.

    The step runs in a process group of its own (MLflow's local backend starts it with
    ``setsid``; the in-container runner does the same). If ``main`` is interrupted while it
    waits (SIGINT, or SIGTERM, which :func:`raise_on_signals` turns into KeyboardInterrupt),
    the step's whole group is ended (MLflow's ``_wait_for`` cancels it; a training step
    checkpoints on SIGTERM) and its run is marked KILLED: nothing outlives ``main``.
    """
    import mlflow
    from mlflow.exceptions import ExecutionException

    mc = mlflow.MlflowClient()
    try:
        if spec["runner"] == "projects":
            mlflow.projects.run(uri=str(HERE), entry_point=entry_point, parameters=params,
                                experiment_id=experiment_id, backend="local", env_manager="local",
                                run_id=run_id, synchronous=True)
            return
        # In place, inside the project's docker_env image: what MLflow's local backend does, minus docker.
        from mlflow.projects.utils import get_entry_point_command, get_run_env_vars, load_project

        command = " ".join(get_entry_point_command(load_project(str(HERE)), entry_point, params, None))
        print(f"=== Running command '{command}' in run with ID '{run_id}' ===", file=sys.stderr, flush=True)
        env = {**os.environ, **get_run_env_vars(run_id, experiment_id)}
        proc = subprocess.Popen(["bash", "-c", command], cwd=str(HERE), env=env, start_new_session=True)
        try:
            rc = proc.wait()
        except BaseException:
            end_process_group(proc)
            raise
        mc.set_terminated(run_id, "FINISHED" if rc == 0 else "FAILED")
        if rc != 0:
            raise ExecutionException(f"Run (ID '{run_id}') failed")
    except KeyboardInterrupt:
        mc.set_terminated(run_id, "KILLED")
        raise


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


def run_task(
    spec: Mapping[str, Any],
    task: Mapping[str, Any],
    values: Mapping[str, str],
    run_dir: Path,
    parent: Any,
    summary: dict[str, Any],
) -> None:
    import mlflow
    from mlflow.entities import Param, RunTag
    from mlflow.exceptions import ExecutionException
    from mlflow.utils import mlflow_tags as mt

    mc = mlflow.MlflowClient()
    params = step_parameters(task, values, run_dir)
    log_path = run_dir / "logs" / f"{task['name']}.log"
    retry = task["retry"]
    record = summary["steps"].setdefault(task["name"], {"entry_point": task["entry_point"], "attempts": []})
    inherited = {k: v for k, v in parent.data.tags.items() if k in (mt.MLFLOW_USER, mt.MLFLOW_SOURCE_NAME,
                                                                    mt.MLFLOW_GIT_COMMIT, mt.MLFLOW_GIT_REPO_URL)}
    for attempt in range(retry["limit"] + 1):
        tags = {
            **inherited,
            mt.MLFLOW_PARENT_RUN_ID: parent.info.run_id,
            mt.MLFLOW_RUN_NAME: task["name"] if attempt == 0 else f"{task['name']}-retry{attempt}",
            mt.MLFLOW_SOURCE_TYPE: "PROJECT",
            mt.MLFLOW_PROJECT_ENTRY_POINT: task["entry_point"],
            "llmpack.pipeline_run": values["pipeline_run"],
            "llmpack.orchestrator": values["orchestrator"],
            "llmpack.step": task["name"],
            "llmpack.attempt": str(attempt),
        }
        child = mc.create_run(parent.info.experiment_id, tags=tags)
        child_id = child.info.run_id
        mc.log_batch(child_id, params=[Param(k, v) for k, v in params.items()],
                     tags=[RunTag(mt.MLFLOW_PROJECT_ENV, "local")])
        record["attempts"].append(child_id)
        start = log_path.stat().st_size if log_path.exists() else 0
        os.environ[ATTEMPT_ENV] = str(attempt)  # the step's process inherits it: its records are this attempt's
        try:
            with tee_output(log_path):
                run_entry_point(spec, task["entry_point"], params, child_id, parent.info.experiment_id)
            record["status"] = "FINISHED"
            return
        except ExecutionException:
            with log_path.open("rb") as fh:
                fh.seek(start)
                text = fh.read().decode("utf-8", errors="replace")
            record["status"] = "FAILED"
            if attempt == retry["limit"] or deliberate(text):
                raise StepError(task["name"], error_line(text)) from None
            delay = min(retry["backoff_s"] * retry["factor"] ** attempt, retry["max_backoff_s"])
            if spec.get("max_backoff_s") is not None:
                delay = min(delay, spec["max_backoff_s"])
            print(f"llmpack: step {task['name']!r} failed (attempt {attempt + 1}); retrying in {delay:g}s",
                  file=sys.stderr, flush=True)
            time.sleep(delay)
        finally:
            try:
                mc.log_artifact(child_id, str(log_path), artifact_path="logs")
            except Exception as exc:  # noqa: BLE001 - the log stays in the run directory
                print(f"llmpack: warning: could not log {log_path.name} to MLflow ({exc})", file=sys.stderr)


def close_open_children(mc: Any, parent: Any, status: str) -> None:
    """End every step run of ``parent`` still RUNNING: a signal can land between a step's run being
    created and the code that would end it (or while MLflow cancels the step), and no run may be
    left RUNNING after ``main``."""
    try:
        runs = mc.search_runs([parent.info.experiment_id],
                              f"tags.mlflow.parentRunId = '{parent.info.run_id}' and attributes.status = 'RUNNING'")
        for run in runs:
            mc.set_terminated(run.info.run_id, status)
    except Exception as exc:  # noqa: BLE001 - the record itself still closes
        print(f"llmpack: warning: could not close the step runs of {parent.info.run_id} ({exc})", file=sys.stderr)


def open_parent(experiment_hint: str | None) -> tuple[Any, bool]:
    """The run ``mlflow run`` created for main, or a new one when main.py runs by hand."""
    import mlflow

    mc = mlflow.MlflowClient()
    run_id = os.environ.get("MLFLOW_RUN_ID")
    if run_id:
        return mc.get_run(run_id), False
    run = mc.create_run(experiment_hint or "0", tags={"mlflow.source.type": "PROJECT",
                                                      "mlflow.project.entryPoint": "main"})
    return run, True


def main(argv: list[str] | None = None, *, project_dir: Path | None = None) -> int:
    """Run the project in ``project_dir`` (the generated ``main.py``'s directory; default: this file's)."""
    global HERE  # noqa: PLW0603 - the project this process runs, one per process
    if project_dir is not None:
        HERE = Path(project_dir)
    spec = json.loads((HERE / SPEC_FILE).read_text(encoding="utf-8"))
    try:
        values, artifacts_dir, base_dir = parse_args(list(sys.argv[1:] if argv is None else argv), spec)
        root = resolve_artifacts_dir(artifacts_dir, base_dir)
    except MainError as exc:
        print(f"{ERROR_MARK} {exc}", file=sys.stderr)
        return 2

    if os.environ.get("MLFLOW_TRACKING_URI"):
        os.environ["MLFLOW_TRACKING_URI"] = absolute_tracking_uri(os.environ["MLFLOW_TRACKING_URI"], base_dir)

    import mlflow
    from mlflow.entities import RunTag

    raise_on_signals()
    parent, owned = open_parent(os.environ.get("MLFLOW_EXPERIMENT_ID"))
    fill_telemetry(values, parent)
    run_dir = root / values["pipeline_run"]
    run_dir.mkdir(parents=True, exist_ok=True)
    mc = mlflow.MlflowClient()
    mc.log_batch(parent.info.run_id, tags=[
        RunTag("llmpack.record", "pipeline"),
        RunTag("llmpack.pipeline", spec["pipeline"]),
        RunTag("llmpack.pipeline_run", values["pipeline_run"]),
        RunTag("llmpack.run_group", values["run_group"]),
        RunTag("llmpack.orchestrator", values["orchestrator"]),
        RunTag("llmpack.mode", values["mode"]),
        RunTag("llmpack.artifacts", str(run_dir)),
    ])
    summary: dict[str, Any] = {
        "pipeline": spec["pipeline"],
        "pipeline_run": values["pipeline_run"],
        "parent_run_id": parent.info.run_id,
        "run_dir": str(run_dir),
        "status": "RUNNING",
        "steps": {},
        "artifacts": {
            f"{t['name']}.{out}": str(run_dir / t["name"] / out) for t in spec["tasks"] for out in t["outputs"].values()
        },
    }
    status_path = run_dir / STATUS_FILE
    print(f"llmpack: pipeline {spec['pipeline']!r} run {values['pipeline_run']!r}: "
          f"{len(spec['tasks'])} steps, artifacts in {run_dir}", file=sys.stderr, flush=True)
    rc = 0
    try:
        for task in spec["tasks"]:
            run_task(spec, task, values, run_dir, parent, summary)
        summary["status"] = "FINISHED"
    except StepError as exc:
        summary.update(status="FAILED", failed_step=exc.task, error=exc.message)
        print(f"{ERROR_MARK} {exc}", file=sys.stderr, flush=True)
        rc = 1
    except KeyboardInterrupt:
        summary.update(status="KILLED", error="interrupted")
        rc = 128 + (_SIGNAL_RECEIVED[0] if _SIGNAL_RECEIVED else 2)
    finally:
        if summary["status"] == "RUNNING":
            summary["status"] = "FAILED"
        if summary["status"] != "FINISHED":
            close_open_children(mc, parent, "KILLED" if summary["status"] == "KILLED" else "FAILED")
        status_path.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        close_record(spec, values, parent, summary["status"], run_dir)
        if owned:
            mc.set_terminated(parent.info.run_id, summary["status"])
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
