"""Telemetry: the events every step emits, the JSONL sink, and the derived metrics.

Every record carries ``run_group``, ``pipeline_run``, ``orchestrator`` and ``mode``; times are UTC
epoch seconds; each record has an idempotency ``key``, so an upload twice duplicates nothing
(docs/telemetry-and-cost.md). Every attempt counts: a retry's records carry its ``attempt``, part of
their key and MLflow name, so a retry never replaces the attempt before it; a step knows its
attempt from the orchestrator or its own JSONL file (:func:`attempt_number`), and
:func:`group_by_step` derives a step's metrics from its last attempt while billing every attempt.
Import-light (stdlib only). Keys, attempts and derivation in full: docs/internals/record-internals.md.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from components import bounded, settings
from components.errors import InputError
from components.record import gpu_metrics

EVENTS_FILE = "llmpack-events.jsonl"
_ATTEMPT_SUFFIX = re.compile(r"^(.*)\.attempt(\d+)$")

# Per-step events, in the order they happen.
CLUSTER_EVENTS = ("pod_created", "pod_scheduled", "node_ready", "container_started")
STEP_EVENTS = ("process_started", "model_loaded", "first_step", "finished")
ALL_EVENTS = CLUSTER_EVENTS + STEP_EVENTS
# ``finished`` is recorded however the step's function ended (its time is compute either way); this metric,
# 1, says it ended by raising (or its launcher's ranks failed): progress and traces say "failed", never "done".
FAILED_METRIC = "step_failed"

TRAIN_STEP = "finetune"
EVAL_STEP = "evaluate"


@dataclass(frozen=True, kw_only=True)
class RunContext:
    """Who a record belongs to. ``submitted_at`` is taken by the submitting client."""

    run_group: str
    pipeline_run: str
    orchestrator: str
    mode: str
    submitted_at: float
    attempt: int = 0  # the running step's attempt (0: first); see attempt_number

    def tags(self) -> dict[str, str]:
        return {
            "llmpack.run_group": self.run_group,
            "llmpack.pipeline_run": self.pipeline_run,
            "llmpack.orchestrator": self.orchestrator,
            "llmpack.mode": self.mode,
        }


@dataclass(frozen=True, kw_only=True)
class Record:
    """One line of the JSONL file: an event (a timestamp) or a step metric (a number)."""

    key: str
    kind: str  # "event" | "metric"
    step: str
    name: str
    value: float
    run_group: str
    pipeline_run: str
    orchestrator: str
    mode: str
    attempt: int = 0

    @property
    def mlflow_key(self) -> str:
        """The MLflow metric name this record is stored under (a retry's ends in ``.attempt<N>``)."""
        return f"{self.kind}.{self.step}.{self.name}" + (f".attempt{self.attempt}" if self.attempt else "")


def record_key(pipeline_run: str, step: str, kind: str, name: str, attempt: int = 0) -> str:
    """The idempotency key: attempt 0 keeps the first wave's form, a retry's ends in ``/attempt<N>``."""
    return f"{pipeline_run}/{step}/{kind}/{name}" + (f"/attempt{attempt}" if attempt else "")


def split_mlflow_name(name: str) -> tuple[str, int]:
    """``("process_started", 1)`` from ``process_started.attempt1``; ``(name, 0)`` without a suffix."""
    match = _ATTEMPT_SUFFIX.match(name)
    return (match.group(1), int(match.group(2))) if match else (name, 0)


def make_record(ctx: RunContext, kind: str, step: str, name: str, value: float, attempt: int | None = None) -> Record:
    """A record of ``ctx``'s run; ``attempt`` defaults to the context's (the running step's attempt)."""
    attempt = ctx.attempt if attempt is None else attempt
    return Record(
        key=record_key(ctx.pipeline_run, step, kind, name, attempt),
        kind=kind,
        step=step,
        name=name,
        value=float(value),
        run_group=ctx.run_group,
        pipeline_run=ctx.pipeline_run,
        orchestrator=ctx.orchestrator,
        mode=ctx.mode,
        attempt=attempt,
    )


def process_start_time(pid: int | None = None) -> float:
    """When the OS started this process (epoch seconds), from /proc; not from Python's start-up.

    On systems without /proc the best we can do is "now", which is documented as a fallback.
    """
    pid = pid or os.getpid()
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        # Field 22 (starttime, clock ticks since boot); the command name may contain spaces.
        start_ticks = int(stat[stat.rindex(")") + 2 :].split()[19])
        # Ticks count on the boot clock: convert through "now" on both clocks (btime is whole
        # seconds and drifts with NTP, so it is not used). Resolution: one tick (10 ms).
        since_start = time.clock_gettime(time.CLOCK_BOOTTIME) - start_ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - since_start
    except (OSError, ValueError, IndexError, AttributeError):
        return time.time()


class EventLog:
    """Appends records to a JSONL file, flushed at once so nothing is lost if the step dies."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def append(self, record: Record) -> None:
        with os.fdopen(bounded.open_append(self.path), "a", encoding="utf-8") as fh:  # never through a planted link
            fh.write(json.dumps(asdict(record), sort_keys=True) + "\n")
            fh.flush()


# What MLflow takes as a metric name (mlflow.utils.validation), matched whole: its own check ends in
# ``$``, which lets a trailing newline through to the store, where it fails the whole batch.
_METRIC_NAME = re.compile(r"[/\w.\- :]+")


def record_problem(rec: Record) -> str | None:
    """Why one record cannot be stored (its name is not a metric name, its value not a number), or None."""
    if not all(isinstance(v, str) for v in (rec.key, rec.step, rec.name, rec.run_group, rec.pipeline_run)):
        return "a field that should be text is not"
    if rec.kind not in ("event", "metric"):
        return f"kind {rec.kind!r} is not 'event' or 'metric'"
    if isinstance(rec.value, bool) or not isinstance(rec.value, (int, float)):
        return "value is not a number"
    if isinstance(rec.attempt, bool) or not isinstance(rec.attempt, int) or rec.attempt < 0:
        return "attempt is not a whole number >= 0"
    name = rec.mlflow_key
    if not _METRIC_NAME.fullmatch(name) or name.startswith("/") or "//" in name or "/../" in f"/{name}/":
        return "its name is not an MLflow metric name"
    return None


MAX_RECORDS_BYTES = 64 << 20  # every event file of a run read together
MAX_EVENT_FILES = 10_000


def read_records_counted(paths: Iterable[str | os.PathLike[str]]) -> tuple[list[Record], int]:
    """``(records, skipped)``: :func:`read_records` and how many non-empty lines were not a storable record.

    One bad line (cut short by a killed step, garbage, a name with a newline) is left out and
    counted, never fatal: the rest of the file still counts, and ``llmpack sync`` says how many. A file
    that is a symlink, FIFO or device, or over :mod:`components.bounded`'s size or line limit, is one
    :class:`~components.errors.InputError` naming it and the limit.
    """
    by_key: dict[str, Record] = {}
    skipped = total = 0
    for n, path in enumerate(paths):
        if not os.path.lexists(path):
            continue
        total += os.lstat(path).st_size
        if total > MAX_RECORDS_BYTES or n >= MAX_EVENT_FILES:  # many planted files, each under its own limit
            raise InputError(f"{path}: the event files read together pass {MAX_EVENT_FILES:,} files or "
                             f"{MAX_RECORDS_BYTES >> 20} MiB in all (a run's records are KiBs); refused")
        for raw in bounded.iter_lines(path):  # a symlink, FIFO or device, an over-long line: one InputError
            line = raw.decode("utf-8", errors="replace")
            if not line.strip():
                continue
            try:
                rec = Record(**json.loads(line))
            except (json.JSONDecodeError, TypeError, RecursionError):
                skipped += 1
                continue
            if record_problem(rec):
                skipped += 1
                continue
            by_key[rec.key] = rec
    return list(by_key.values()), skipped


def read_records(paths: Iterable[str | os.PathLike[str]]) -> list[Record]:
    """Read JSONL files; a later record with the same key replaces an earlier one (a duplicate
    upload or a rewrite; a retry has keys of its own). Lines that are not a storable record are left out."""
    return read_records_counted(paths)[0]


def find_event_files(root: str | os.PathLike[str]) -> list[Path]:
    return sorted(Path(root).rglob(EVENTS_FILE))


def attempt_number(ctx: RunContext, step: str, events_path: str | os.PathLike[str],
                   env: dict[str, str] | None = None) -> int:
    """The attempt of ``step`` starting now: the larger of ``LLMPACK_ATTEMPT`` (what the orchestrator
    says) and the number of attempts of this step of ``ctx``'s run in its own JSONL file (see the
    module docstring for which path gives which)."""
    env = dict(os.environ) if env is None else env
    try:
        told = max(0, int(env.get(settings.ATTEMPT.name, "") or 0))
    except ValueError:
        told = 0
    seen = [r.attempt for r in read_records([events_path])
            if r.step == step and r.pipeline_run == ctx.pipeline_run and r.kind == "event"
            and r.name == "process_started"]
    return max(told, max(seen, default=-1) + 1)


def injected_failure(step: str, attempt: int, env: dict[str, str] | None = None) -> float | None:
    """Fault injection for retries: ``LLMPACK_INJECT_FAILURES=finetune=1:2.5`` makes the first
    attempt of finetune hold its process (and its GPU) 2.5 s, then crash (exit 1, which every path
    retries). Returns the seconds to hold before failing, or None when this attempt runs normally."""
    env = dict(os.environ) if env is None else env
    for part in env.get(settings.INJECT_FAILURES.name, "").split(","):
        name, sep, spec = part.partition("=")
        if not sep or name.strip() != step:
            continue
        count, _, hold = spec.partition(":")
        try:
            if attempt < int(count):
                return max(0.0, float(hold or 0.0))
        except ValueError:
            raise ValueError(f"{settings.INJECT_FAILURES.name}={env[settings.INJECT_FAILURES.name]!r}: "
                             "expected STEP=N[:SECONDS]") from None
    return None


def fail_if_injected(step: str, attempt: int) -> None:
    """Called by the step runtime inside the step: crash this attempt when :func:`injected_failure` says so."""
    hold = injected_failure(step, attempt)
    if hold is not None:
        time.sleep(hold)
        raise RuntimeError(f"{settings.INJECT_FAILURES.name}: step {step!r} attempt {attempt} failed on purpose")


# --------------------------------------------------------------------------- derivation


@dataclass(frozen=True, kw_only=True)
class StepTimes:
    """A step's events and metrics: its last attempt's (per name, the latest attempt that has it),
    with every attempt on its own in ``attempts`` (in order; empty when built by hand)."""

    step: str
    events: dict[str, float]
    metrics: dict[str, float]
    attempt: int = 0
    attempts: tuple[StepTimes, ...] = ()

    @property
    def all_attempts(self) -> tuple[StepTimes, ...]:
        """Every attempt, first to last (just this one when no attempts were recorded apart)."""
        return self.attempts or (self,)

    @property
    def failed(self) -> bool:
        """The last attempt ended by failing (``FAILED_METRIC``); a retry that finished clears it."""
        return bool(self.all_attempts[-1].metrics.get(FAILED_METRIC))

    @property
    def retried(self) -> tuple[StepTimes, ...]:
        """The attempts before the last one: the retried ones."""
        return self.all_attempts[:-1]

    def get(self, name: str) -> float | None:
        return self.events.get(name)

    @property
    def start(self) -> float | None:
        """Billing/compute start: container start on a cluster, process start locally."""
        return self.events.get("container_started", self.events.get("process_started"))

    @property
    def first_start(self) -> float | None:
        """The first attempt's start (its container's on a cluster, else its process's): billing's."""
        return next((a.start for a in self.all_attempts if a.start is not None), None)

    @property
    def first_process_start(self) -> float | None:
        """The first attempt's process start, else :attr:`first_start`: spin-up's end on every path, so that a
        pod running the steps before this one (the MLflow Job, a fused pod) counts them as separate pods do
        (issue 51's check: the container start left them out on one path only)."""
        first = next((a for a in self.all_attempts if a.start is not None or "process_started" in a.events), None)
        if first is None:  # the first attempt that started: its process, else its container (round 26: never a retry's)
            return None
        return first.events.get("process_started", first.start)

    @property
    def compute_s(self) -> float | None:
        s, f = self.events.get("process_started"), self.events.get("finished")
        return None if s is None or f is None else f - s

    @property
    def total_compute_s(self) -> float | None:
        """Step compute over every attempt (a failed attempt's compute is not orchestrator overhead)."""
        if not self.attempts:
            return self.compute_s
        known = [a.compute_s for a in self.attempts if a.compute_s is not None]
        return sum(known) if known else None


def group_by_step(records: Iterable[Record]) -> dict[str, StepTimes]:
    """Per step, its attempts' records; the step's own view is its last attempt's (module docstring)."""
    by_attempt: dict[str, dict[int, StepTimes]] = {}
    for rec in records:
        attempts = by_attempt.setdefault(rec.step, {})
        st = attempts.setdefault(rec.attempt, StepTimes(step=rec.step, events={}, metrics={}, attempt=rec.attempt))
        (st.events if rec.kind == "event" else st.metrics)[rec.name] = rec.value
    steps: dict[str, StepTimes] = {}
    for step, attempts in by_attempt.items():
        ordered = tuple(attempts[n] for n in sorted(attempts))
        events: dict[str, float] = {}
        metrics: dict[str, float] = {}
        for a in ordered:  # later attempts win, name by name
            events.update(a.events)
            metrics.update(a.metrics)
        steps[step] = StepTimes(step=step, events=events, metrics=metrics, attempt=ordered[-1].attempt,
                                attempts=ordered if len(ordered) > 1 else ())
    return steps


def _sub(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


# A process's start time is read from /proc in clock ticks (10 ms): a step started within a tick of the submit can
# read as a few ms before it. Such a spin-up is 0, never negative; a larger gap (clock skew) is left as it is.
START_RESOLUTION_S = 0.05


def since_submit(start: float | None, submitted_at: float | None) -> float | None:
    """``start - submitted_at``, a difference inside :data:`START_RESOLUTION_S` below 0 read as 0."""
    d = _sub(start, submitted_at)
    return 0.0 if d is not None and -START_RESOLUTION_S < d < 0 else d


def derive_metrics(
    steps: dict[str, StepTimes],
    *,
    submitted_at: float,
    finished_at: float | None = None,
) -> dict[str, float | None]:
    """The timing metrics of docs/telemetry-and-cost.md from per-step events. Cost is added by :mod:`cost`."""
    train = steps.get(TRAIN_STEP) or StepTimes(step=TRAIN_STEP, events={}, metrics={})
    ev = steps.get(EVAL_STEP) or StepTimes(step=EVAL_STEP, events={}, metrics={})
    finishes = [s.events["finished"] for s in steps.values() if "finished" in s.events]
    end = finished_at if finished_at is not None else (max(finishes) if finishes else None)
    total = _sub(end, submitted_at)
    computes = [c for c in (s.total_compute_s for s in steps.values()) if c is not None]
    return {
        "spinup_s": since_submit(train.first_process_start, submitted_at),
        "time_to_first_step_s": _sub(train.get("first_step"), submitted_at),
        "queue_s": _sub(train.get("pod_scheduled"), train.get("pod_created")),
        "provision_s": _sub(train.get("node_ready"), train.get("pod_created")),
        "pipeline_overhead_s": None if total is None else total - sum(computes),
        "total_s": total,
        "train_s": train.metrics.get("train_s"),
        "tokens_per_s": train.metrics.get("tokens_per_s"),
        "train_tokens": train.metrics.get("train_tokens"),
        "mfu": train.metrics.get("mfu"),
        "checkpoint_save_s": train.metrics.get("checkpoint_save_s"),  # the longest write; beside the pod's grace
        "grace_period_s": train.metrics.get("grace_period_s"),
        **gpu_metrics.derived(train.metrics),  # gpu_idle_before_first_step_s, gpu_util_mean_pct: GPU runs only
        "eval_loss": ev.metrics.get("eval_loss"),
        "base_eval_loss": ev.metrics.get("base_eval_loss"),
        "perplexity": ev.metrics.get("perplexity"),
        **task_metrics(ev.metrics),
    }


# evaluate's task metrics (components.training.generation), carried into every run's record as
# logged: base and tuned exact and normalised match, their per-task exact match
# (``tuned_exact_match_reverse``), the gate's improvement and which metric it judged (``gated_by_*``).
TASK_METRIC_PREFIXES = ("base_exact_match", "tuned_exact_match", "base_normalised_match", "tuned_normalised_match",
                        "task_rows", "gate_improvement", "gated_by_")


def task_metrics(logged: dict[str, float]) -> dict[str, float]:
    """evaluate's task metrics among ``logged`` (none from a run before task evaluation)."""
    return {k: v for k, v in sorted(logged.items()) if k.startswith(TASK_METRIC_PREFIXES)}


def clean_number(value: Any) -> float | None:
    """JSON-safe float: NaN and inf become None."""
    if value is None:
        return None
    value = float(value)
    return None if math.isnan(value) or math.isinf(value) else value
