"""Every run a trace: OpenTelemetry spans built from a pipeline run's JSONL events.

The JSONL is the source of truth, so the trace is built from it after the fact, the same on every
path: one trace per pipeline run (its id derived from the run, or joined to a W3C ``TRACEPARENT``),
a run span, per step a step span and per attempt an attempt span (a gang's node and rank spans
inside), phase spans between consecutive events (:data:`PHASES`), spin-up and hand-over spans.
Attributes follow OpenTelemetry's CI/CD conventions where they exist. The output is OTLP/JSON,
sent by :mod:`components.record.trace_export`. Stdlib only. The spans in full:
docs/internals/record-internals.md.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from components.record.telemetry import ALL_EVENTS, Record, StepTimes, group_by_step

# the shipped pipeline's name, when the run's tags name none (components.finetune_pipeline.PIPELINE_NAME)
PIPELINE_NAME = "llm-finetune"
SCOPE = "llmpack"

# The span between an event and the next event an attempt recorded (in time order), named by what it
# waited for: the event that ends it. A pod on a node the autoscaler brings up is created, waits for
# the node (provisioning), then is bound (queued); on a node that is there it is bound at once.
PHASES: dict[str, str] = {
    "pod_scheduled": "queued",
    "node_ready": "provisioning",
    "container_started": "pulling and starting",
    "process_started": "starting",
    "model_loaded": "loading the model",
    "first_step": "first step",
}
# After the last of those events, until ``finished``: what the step does.
WORK: dict[str, str] = {"finetune": "training", "evaluate": "evaluating", "register": "registering"}

# Our tags that become span attributes of the run span (the cost and packaging contract).
RUN_TAGS = ("llmpack.orchestrator", "llmpack.mode", "llmpack.run_group", "llmpack.packaging", "llmpack.gpu_type",
            "llmpack.gpu_count", "llmpack.price_per_gpu_hour", "llmpack.price_source", "llmpack.status")

_TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}$")
_MEMBER = re.compile(r"^(?P<event>[a-z_]+)\.(?P<kind>node|rank)(?P<n>\d+)$")  # node_ready.node1, finished.rank3


@dataclass(frozen=True, kw_only=True)
class Span:
    """One span: names and times (epoch seconds) as our records give them."""

    name: str
    span_id: str
    parent_id: str | None
    start: float
    end: float
    attributes: Mapping[str, str | float | int]
    ok: bool = True

    def otlp(self, trace_id: str, *, detach: str | None = None) -> dict[str, Any]:
        """The OTLP/JSON span; with ``detach`` (a parent span id), that parent becomes a link instead."""
        span: dict[str, Any] = {
            "traceId": trace_id,
            "spanId": self.span_id,
            "name": self.name,
            "kind": 1,  # SPAN_KIND_INTERNAL
            "startTimeUnixNano": str(_nanos(self.start)),
            "endTimeUnixNano": str(_nanos(max(self.end, self.start))),
            "attributes": [_attribute(k, v) for k, v in sorted(self.attributes.items())],
            "status": {"code": 1 if self.ok else 2},  # STATUS_CODE_OK / STATUS_CODE_ERROR
        }
        if self.parent_id and self.parent_id == detach:
            span["links"] = [{"traceId": trace_id, "spanId": self.parent_id}]
            span["attributes"].append(_attribute("llmpack.parent_span_id", self.parent_id))
        elif self.parent_id:
            span["parentSpanId"] = self.parent_id
        return span


@dataclass(frozen=True, kw_only=True)
class Trace:
    """A pipeline run's spans under one trace id."""

    trace_id: str
    spans: tuple[Span, ...]
    resource: Mapping[str, str]
    joined: str | None = None  # the TRACEPARENT's span id the run span is a child of

    def otlp(self, *, root: bool = False) -> dict[str, Any]:
        """The OTLP/JSON ``ExportTraceServiceRequest`` body.

        ``root``: the run span is the trace's root even when it joined a ``TRACEPARENT`` (same trace
        id; the parent becomes a span link and ``llmpack.parent_span_id``). MLflow needs that: it
        keeps a trace whose root span it never receives ``IN_PROGRESS`` and links it to no run,
        and the orchestrator's own spans go to its collector, not to MLflow.
        """
        detach = self.joined if root else None
        return {"resourceSpans": [{
            "resource": {"attributes": [_attribute(k, v) for k, v in sorted(self.resource.items())]},
            "scopeSpans": [{"scope": {"name": SCOPE},
                            "spans": [s.otlp(self.trace_id, detach=detach) for s in self.spans]}],
        }]}


def parse_traceparent(value: str | None) -> tuple[str, str] | None:
    """``(trace_id, span_id)`` of a W3C ``traceparent`` header value, or None when absent or malformed."""
    match = _TRACEPARENT.match((value or "").strip().lower())
    if match is None or set(match.group(1)) == {"0"} or set(match.group(2)) == {"0"}:
        return None
    return match.group(1), match.group(2)


def trace_id_of(pipeline_run: str) -> str:
    """The run's own trace id (32 hex): the same every time the trace is built."""
    return hashlib.sha256(f"llmpack-trace/{pipeline_run}".encode()).hexdigest()[:32]


def build_trace(records: Iterable[Record], *, pipeline_run: str, submitted_at: float,
                tags: Mapping[str, str] | None = None, status: str | None = None,
                traceparent: str | None = None, finished_at: float | None = None) -> Trace:
    """The trace of one pipeline run from its records (module docstring for the span tree)."""
    tags = dict(tags or {})
    joined = parse_traceparent(traceparent)
    trace_id = joined[0] if joined else trace_id_of(pipeline_run)
    sid = _span_ids(pipeline_run)
    steps = group_by_step(r for r in records if r.pipeline_run == pipeline_run)
    ordered = sorted(steps.values(),
                     key=lambda s: (s.first_start if s.first_start is not None else float("inf"), s.step))
    finishes = [s.events["finished"] for s in ordered if "finished" in s.events]
    end = finished_at if finished_at is not None else max(finishes, default=submitted_at)
    status = status or tags.get("llmpack.status")
    name = tags.get("llmpack.pipeline") or PIPELINE_NAME  # a pipeline of one's own: its name (trial 9)
    run_attrs: dict[str, str | float | int] = {
        "cicd.pipeline.name": name,
        "cicd.pipeline.run.id": pipeline_run,
        **{k: v for k, v in tags.items() if k in RUN_TAGS},
    }
    if status:
        run_attrs["cicd.pipeline.result"] = _result(status)
    run = Span(name=f"pipeline {name}", span_id=sid("run"), parent_id=joined[1] if joined else None,
               start=submitted_at, end=end, attributes=run_attrs, ok=_result(status) in ("success", None))
    spans = [run]
    first = ordered[0].first_start if ordered else None
    if first is not None:
        spans.append(Span(name="to the first step", span_id=sid("spin-up"), parent_id=run.span_id, start=submitted_at,
                          end=first, attributes={"cicd.pipeline.run.id": pipeline_run}))
    previous: StepTimes | None = None
    for step in ordered:
        spans += _step_spans(step, pipeline_run, run.span_id, sid)
        if previous is not None and "finished" in previous.events and step.first_start is not None:
            spans.append(Span(name="hand-over", span_id=sid(f"hand-over/{previous.step}/{step.step}"),
                              parent_id=run.span_id, start=previous.events["finished"], end=step.first_start,
                              attributes={"llmpack.from_step": previous.step, "llmpack.to_step": step.step}))
        previous = step
    orchestrator = tags.get("llmpack.orchestrator", "")
    resource = {"service.name": "llmpack", "service.namespace": orchestrator or "llmpack"}
    return Trace(trace_id=trace_id, spans=tuple(spans), resource=resource, joined=joined[1] if joined else None)


def _step_spans(step: StepTimes, pipeline_run: str, run_id: str, sid: Any) -> list[Span]:
    attempts = step.all_attempts
    starts = [e for a in attempts for e in a.events.values()]
    if not starts:
        return []
    step_span = Span(name=f"step {step.step}", span_id=sid(f"step/{step.step}"), parent_id=run_id,
                     start=min(starts), end=max(starts),
                     attributes={"cicd.pipeline.task.name": step.step, "cicd.pipeline.run.id": pipeline_run,
                                 "llmpack.attempts": len(attempts)},
                     ok="finished" in attempts[-1].events and not step.failed)
    spans = [step_span]
    for n, attempt in enumerate(attempts):
        events = in_order(attempt.events)
        if not events:
            continue
        number = attempt.attempt if step.attempts else n
        finished = "finished" in attempt.events and not attempt.failed
        attempt_span = Span(
            name=f"{step.step} attempt {number}", span_id=sid(f"attempt/{step.step}/{number}"),
            parent_id=step_span.span_id, start=events[0][1], end=events[-1][1],
            attributes={"cicd.pipeline.task.name": step.step,
                        "cicd.pipeline.task.run.id": f"{pipeline_run}/{step.step}/{number}",
                        "cicd.pipeline.task.run.result": "success" if finished else "failure",
                        "llmpack.attempt": number},
            ok=finished)
        spans.append(attempt_span)
        spans += _phases(step.step, events, attempt_span.span_id, sid, f"{step.step}/{number}")
        spans += _gang_spans(step.step, attempt.events, attempt_span.span_id, sid, number)
    return spans


def _phases(step: str, events: list[tuple[str, float]], parent: str, sid: Any, path: str) -> list[Span]:
    """A phase span between each pair of consecutive events (``events`` in order)."""
    return [Span(name=phase_name(step, name, following), span_id=sid(f"phase/{path}/{name}"), parent_id=parent,
                 start=t0, end=t1, attributes={"llmpack.from_event": name, "llmpack.to_event": following})
            for (name, t0), (following, t1) in zip(events, events[1:], strict=False)]


def _gang_spans(step: str, events: Mapping[str, float], attempt_id: str, sid: Any, number: int) -> list[Span]:
    """A gang attempt's node and rank spans from its ``<event>.node<n>`` / ``<event>.rank<r>`` records."""
    members: dict[str, dict[int, dict[str, float]]] = {"node": {}, "rank": {}}
    for key, t in events.items():
        if (m := _MEMBER.match(key)) is not None and m.group("event") in ALL_EVENTS:
            members[m.group("kind")].setdefault(int(m.group("n")), {})[m.group("event")] = t
    nodes, ranks = members["node"], members["rank"]
    per_node = len(ranks) // len(nodes) if nodes and ranks and len(ranks) % len(nodes) == 0 else 0
    node_of = {r: sorted(nodes)[i // per_node] for i, r in enumerate(sorted(ranks))} if per_node else {}
    spans: list[Span] = []
    for kind, found in (("node", nodes), ("rank", ranks)):
        for n, mine in sorted(found.items()):
            ordered = in_order(mine)
            times = [t for _, t in ordered] + [ranks[r][e] for r in ranks if node_of.get(r) == n and kind == "node"
                                               for e in ranks[r]]
            parent = sid(f"node/{step}/{number}/{node_of[n]}") if kind == "rank" and n in node_of else attempt_id
            span = Span(name=f"{step} {kind} {n}", span_id=sid(f"{kind}/{step}/{number}/{n}"), parent_id=parent,
                        start=min(times), end=max(times), ok=kind == "node" or "finished" in mine,
                        attributes={"cicd.pipeline.task.name": step, f"llmpack.{kind}": n, "llmpack.attempt": number})
            spans += [span, *_phases(step, ordered, span.span_id, sid, f"{step}/{number}/{kind}{n}")]
    return spans


def in_order(events: Mapping[str, float]) -> list[tuple[str, float]]:
    """The events of :data:`ALL_EVENTS` among ``events``, in time order (ties in the order they happen)."""
    return sorted(((e, events[e]) for e in ALL_EVENTS if e in events),
                  key=lambda item: (item[1], ALL_EVENTS.index(item[0])))


def phase_name(step: str, event: str, following: str) -> str:
    """What happens between two consecutive events of an attempt (module docstring)."""
    if following == "finished":
        return WORK.get(step, "running")
    if event == "process_started" and following == "first_step":
        return "starting up"
    return PHASES.get(following, "running")


def _span_ids(pipeline_run: str) -> Any:
    def sid(path: str) -> str:
        return hashlib.sha256(f"llmpack-span/{pipeline_run}/{path}".encode()).hexdigest()[:16]
    return sid


def _result(status: str | None) -> str | None:
    """Our status words onto ``cicd.pipeline.result`` values."""
    if not status:
        return None
    return {"succeeded": "success", "failed": "failure", "killed": "cancellation",
            "timeout": "timeout", "preempted": "error"}.get(status.lower(), "error")


def _nanos(t: float) -> int:
    return int(round(t * 1e9))


def _attribute(key: str, value: str | float | int) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"key": key, "value": {"boolValue": value}}
    if isinstance(value, int):
        return {"key": key, "value": {"intValue": str(value)}}
    if isinstance(value, float):
        return {"key": key, "value": {"doubleValue": value}}
    return {"key": key, "value": {"stringValue": str(value)}}


def from_otlp(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The spans of an OTLP/JSON body, flattened (for tests and ``llmpack report``'s reader)."""
    return [span for rs in body.get("resourceSpans", []) for ss in rs.get("scopeSpans", [])
            for span in ss.get("spans", [])]
