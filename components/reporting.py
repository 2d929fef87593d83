"""How a step reports: its timeline events and metrics, without knowing what runs it.

A step calls :func:`metric` and :func:`emit` (as kfp components log through ``Output[Metrics]``
without importing kfp's executor); the step process (:mod:`components.process.runner`) installs
the running step's :class:`StepTelemetry` with :func:`begin` and removes it with :func:`end`.
Outside a step run both calls do nothing. This module imports nothing of the step process, so
importing a step loads no runner, launcher or fusion code.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from components.record.telemetry import EventLog, Record, RunContext, make_record


class StepTelemetry:
    """The running step's telemetry; steps reach it with :func:`emit` and :func:`metric`."""

    def __init__(self, ctx: RunContext, step: str, events_path: Path, rank: int | None = None,
                 on_model_loaded: Callable[[], None] | None = None) -> None:
        self.ctx = ctx
        self.step = step
        self.log = EventLog(events_path)
        self.records: list[Record] = []
        self.rank = rank  # a rank of a distributed step (components.training.distributed): its events end in .rank<R>
        self.on_model_loaded = on_model_loaded  # the step process's hook: start-up is over (components.process.startup)

    def _add(self, kind: str, name: str, value: float) -> None:
        rec = make_record(self.ctx, kind, self.step, name, value)
        self.records.append(rec)
        self.log.append(rec)

    def event(self, name: str, ts: float | None = None) -> None:
        """This process's event: a rank's is ``<name>.rank<R>``, a single process's the step's own."""
        self._add("event", name if self.rank is None else f"{name}.rank{self.rank}", time.time() if ts is None else ts)
        if name == "model_loaded" and self.on_model_loaded is not None:
            self.on_model_loaded()  # start-up is over: the collector back to normal

    def step_event(self, name: str, ts: float | None = None) -> None:
        """The step's own event, whichever rank records it."""
        self._add("event", name, time.time() if ts is None else ts)

    def step_metric(self, name: str, value: float) -> None:
        """A metric under exactly ``name``, whichever rank records it (a gang node's ``<name>.node<R>``)."""
        self._add("metric", name, value)

    def metric(self, name: str, value: float) -> None:
        """Rank 0's metrics (reduced over ranks by the step) are the step's; another rank's end in .rank<R>."""
        self._add("metric", name if not self.rank else f"{name}.rank{self.rank}", value)


_current: StepTelemetry | None = None


def current() -> StepTelemetry | None:
    """The running step's telemetry, or None outside a step run."""
    return _current


def emit(name: str, ts: float | None = None) -> None:
    """Record a timeline event for the running step (no-op when called outside a step run)."""
    if _current is not None:
        _current.event(name, ts)


def emit_step(name: str, ts: float | None = None) -> None:
    """Record the step's own event from a rank (a gang's ``first_step``: see components.training.distributed)."""
    if _current is not None:
        _current.step_event(name, ts)


def metric(name: str, value: float) -> None:
    """Record a step metric (train_s, tokens_per_s, eval_loss...) for the running step."""
    if _current is not None:
        _current.metric(name, value)


def submitted_at() -> float | None:
    """When the running step's pipeline run was submitted (epoch seconds); None outside a step run or unknown."""
    if _current is None or not _current.ctx.submitted_at or _current.ctx.submitted_at <= 0:
        return None
    return _current.ctx.submitted_at


def begin(tel: StepTelemetry) -> StepTelemetry:
    """Make ``tel`` the running step's telemetry (the step process calls this around a step)."""
    global _current
    _current = tel
    return tel


def end() -> None:
    """No step is running any more."""
    global _current
    _current = None
