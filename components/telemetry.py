"""Telemetry: the events every step emits, the JSONL sink, and the derived metrics.

The contract (see DESIGN.md): every record carries ``run_group``, ``pipeline_run``,
``orchestrator`` and ``mode``; times are UTC epoch seconds as floats; each record has an
idempotency ``key`` so that uploading a JSONL file twice never duplicates anything.

This module is import-light (stdlib only). MLflow is imported by :mod:`components.tracking`.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

EVENTS_FILE = "llmpack-events.jsonl"

# Per-step events, in the order they happen.
CLUSTER_EVENTS = ("pod_created", "pod_scheduled", "node_ready", "container_started")
STEP_EVENTS = ("process_started", "model_loaded", "first_step", "finished")
ALL_EVENTS = CLUSTER_EVENTS + STEP_EVENTS

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

    @property
    def mlflow_key(self) -> str:
        """The MLflow metric name this record is stored under."""
        return f"{self.kind}.{self.step}.{self.name}"


def make_record(ctx: RunContext, kind: str, step: str, name: str, value: float) -> Record:
    return Record(
        key=f"{ctx.pipeline_run}/{step}/{kind}/{name}",
        kind=kind,
        step=step,
        name=name,
        value=float(value),
        run_group=ctx.run_group,
        pipeline_run=ctx.pipeline_run,
        orchestrator=ctx.orchestrator,
        mode=ctx.mode,
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
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(asdict(record), sort_keys=True) + "\n")
            fh.flush()


def read_records(paths: Iterable[str | os.PathLike[str]]) -> list[Record]:
    """Read JSONL files; a later record with the same key replaces an earlier one (retries)."""
    by_key: dict[str, Record] = {}
    for path in paths:
        p = Path(path)
        if not p.exists():
            continue
        for line in p.read_text(encoding="utf-8", errors="replace").splitlines():
            if not line.strip():
                continue
            try:
                rec = Record(**json.loads(line))
            except (json.JSONDecodeError, TypeError):
                continue  # a line cut short by a killed step: the rest of the file still counts
            by_key[rec.key] = rec
    return list(by_key.values())


def find_event_files(root: str | os.PathLike[str]) -> list[Path]:
    return sorted(Path(root).rglob(EVENTS_FILE))


# --------------------------------------------------------------------------- derivation


@dataclass(frozen=True, kw_only=True)
class StepTimes:
    step: str
    events: dict[str, float]
    metrics: dict[str, float]

    def get(self, name: str) -> float | None:
        return self.events.get(name)

    @property
    def start(self) -> float | None:
        """Billing/compute start: container start on a cluster, process start locally."""
        return self.events.get("container_started", self.events.get("process_started"))

    @property
    def compute_s(self) -> float | None:
        s, f = self.events.get("process_started"), self.events.get("finished")
        return None if s is None or f is None else f - s


def group_by_step(records: Iterable[Record]) -> dict[str, StepTimes]:
    steps: dict[str, StepTimes] = {}
    for rec in records:
        st = steps.setdefault(rec.step, StepTimes(step=rec.step, events={}, metrics={}))
        (st.events if rec.kind == "event" else st.metrics)[rec.name] = rec.value
    return steps


def _sub(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def derive_metrics(
    steps: dict[str, StepTimes],
    *,
    submitted_at: float,
    finished_at: float | None = None,
) -> dict[str, float | None]:
    """The timing metrics of DESIGN.md from per-step events. Cost is added by :mod:`cost`."""
    train = steps.get(TRAIN_STEP) or StepTimes(step=TRAIN_STEP, events={}, metrics={})
    ev = steps.get(EVAL_STEP) or StepTimes(step=EVAL_STEP, events={}, metrics={})
    finishes = [s.events["finished"] for s in steps.values() if "finished" in s.events]
    end = finished_at if finished_at is not None else (max(finishes) if finishes else None)
    total = _sub(end, submitted_at)
    computes = [s.compute_s for s in steps.values() if s.compute_s is not None]
    return {
        "spinup_s": _sub(train.start, submitted_at),
        "time_to_first_step_s": _sub(train.get("first_step"), submitted_at),
        "queue_s": _sub(train.get("pod_scheduled"), train.get("pod_created")),
        "provision_s": _sub(train.get("node_ready"), train.get("pod_created")),
        "pipeline_overhead_s": None if total is None else total - sum(computes),
        "total_s": total,
        "train_s": train.metrics.get("train_s"),
        "tokens_per_s": train.metrics.get("tokens_per_s"),
        "train_tokens": train.metrics.get("train_tokens"),
        "mfu": train.metrics.get("mfu"),
        "eval_loss": ev.metrics.get("eval_loss"),
        "base_eval_loss": ev.metrics.get("base_eval_loss"),
        "perplexity": ev.metrics.get("perplexity"),
    }


def clean_number(value: Any) -> float | None:
    """JSON-safe float: NaN and inf become None."""
    if value is None:
        return None
    value = float(value)
    return None if math.isnan(value) or math.isinf(value) else value
