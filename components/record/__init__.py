"""The record: every run's events, cost and MLflow record, the same on every path.

``telemetry`` (run identity, events, the JSONL sink, derived timing metrics), ``cost`` (prices,
GPU-hours, node billing), ``tracking`` (the MLflow store), ``close`` (the task that closes a
pipeline run's record: ``python -m components.record``).
"""

from __future__ import annotations

from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """``from components.record import main``: the name compiled KFP exit tasks call (kept for them)."""
    from components.record.close import main as close_main

    return close_main(argv)
