"""``llmpack cluster timeline``: pod phase rows from dump files, and the plain-text table they print as."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from components.errors import InputError
from components.redaction import printable
from llmpack.cluster.k8s import LABEL_PREFIX, RUN_GROUP_LABEL
from llmpack.cluster.k8s.dumps import load_events, load_nodes, load_pods
from llmpack.cluster.k8s.objects import DumpError, join_detail
from llmpack.cluster.k8s.podphases import analyze


def timeline_from_files(
    pods: str | Path,
    nodes: str | Path | None = None,
    events: str | Path | None = None,
    *,
    run_group: str | None = None,
    runs: Mapping[str, str | None] | None = None,
) -> list[dict[str, Any]]:
    """``llmpack cluster timeline``: rows from dump files; every error is one line naming the file.

    ``run_group`` keeps that run group's pods; ``runs`` adds pods by orchestrator run id (a KFP
    run id -> its pipeline_run), see :func:`select_pods`.
    """
    files = {"pods": str(pods), "nodes": str(nodes) if nodes else "nodes",
             "events": str(events) if events else "events"}
    pod_items = load_pods(pods)
    node_items = load_nodes(nodes) if nodes else []
    event_items = load_events(events) if events else []
    try:
        rows = analyze(pod_items, node_items, event_items, run_group=run_group, runs=runs)
    except DumpError as exc:
        raise InputError(f"{files[exc.kind]}: items[{exc.index}]{join_detail(exc.detail)}") from None
    if not rows:
        if run_group is not None:
            raise InputError(f"{files['pods']}: no pods of run group {run_group!r} (label {RUN_GROUP_LABEL})")
        raise InputError(
            f"{files['pods']}: no llmpack or orchestrator pods among {len(pod_items)} pods "
            f"(no {LABEL_PREFIX} labels, no KFP, Argo or MLflow pods)"
        )
    return rows


# --------------------------------------------------------------------------- output


def _fmt_s(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def format_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """A plain-text table of the rows (seconds, one decimal; '-' for not applicable / unknown).

    A TrainJob node pod's step reads ``finetune/node<rank>``: every node of the gang has its row."""
    header = ("POD", "ORCH", "ROLE", "STEP", "NODE TYPE", "QUEUE_S", "PROVISION_S", "PULL_S", "START_S", "RUN_S",
              "PHASE")
    table = [header]
    for r in rows:
        table.append(
            (
                r["pod"],
                r["orchestrator"],
                r["role"],
                (r["step"] or "-") + ("" if r.get("gang_node") is None else f"/node{r['gang_node']}"),
                r["instance_type"] or "-",
                _fmt_s(r["queue_s"]),
                _fmt_s(r["provision_s"]),
                _fmt_s(r["image_pull_s"]),
                _fmt_s(r["start_s"]),
                _fmt_s(r["run_s"]),
                r["phase"] or "-",
            )
        )
    # a dump's names and annotations (the Argo node name is free text) shown, never obeyed: no escape bytes
    table = [table[0], *(tuple(printable(str(cell), 80) for cell in line) for line in table[1:])]
    widths = [max(len(str(line[c])) for line in table) for c in range(len(header))]
    numeric = {5, 6, 7, 8, 9}
    out = []
    for line in table:
        cells = [str(v).rjust(w) if c in numeric else str(v).ljust(w)
                 for c, (v, w) in enumerate(zip(line, widths, strict=True))]
        out.append("  ".join(cells).rstrip())
    return "\n".join(out)
