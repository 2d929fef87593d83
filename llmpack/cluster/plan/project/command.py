"""``llmpack cluster plan project``: the click command (registered in :mod:`llmpack.cli` with one line).

Reads measured gangs (MLflow run groups, or kubectl dumps), projects each path to the gang sizes
asked, prints the table (or ``--json``), and with ``--out DIR`` writes the two charts, the JSON
and a one-page HTML summary, each file written whole or not at all.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from components.errors import InputError
from components.redaction import redact_data
from llmpack.ui.terminal import command

DEFAULT_NODES = "1,2,4,8,16,32"
CHARTS = ("gang_ready.png", "cost_per_run.png")


def parse_ints(text: str, flag: str) -> list[int]:
    """"1,2,4" -> [1, 2, 4]: whole numbers >= 1, sorted, no repeats; else one line."""
    try:
        values = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError:
        raise InputError(f"{flag} {text!r}: not a comma-separated list of whole numbers") from None
    if not values or values[0] < 1:
        raise InputError(f"{flag} {text!r}: every value must be 1 or more")
    return values


def parse_quantiles(text: str) -> list[float]:
    """"50,90,99" -> [0.5, 0.9, 0.99] (percentiles strictly between 0 and 100)."""
    try:
        values = sorted({float(v) for v in text.split(",") if v.strip()})
    except ValueError:
        raise InputError(f"--quantiles {text!r}: not a comma-separated list of percentiles") from None
    if not values or values[0] <= 0 or values[-1] >= 100:
        raise InputError(f"--quantiles {text!r}: percentiles must be between 0 and 100 (e.g. 50,90,99)")
    return [v / 100 for v in values]


def gang_sizes(nodes: str, gpus: str | None, gpus_per_node: int | None) -> list[int]:
    """The gang sizes: ``--nodes``, or ``--gpus`` totals divided by ``--gpus-per-node``."""
    if gpus is None:
        return parse_ints(nodes, "--nodes")
    if gpus_per_node is None:
        raise InputError("--gpus: say --gpus-per-node too (GPU totals are split into nodes of that many)")
    totals = parse_ints(gpus, "--gpus")
    odd = [t for t in totals if t % gpus_per_node]
    if odd:
        raise InputError(f"--gpus {odd[0]}: not a multiple of --gpus-per-node {gpus_per_node}")
    return [t // gpus_per_node for t in totals]


def write_atomic(path: Path, write: Callable[[Path], None]) -> None:
    """``write`` to a temporary file beside ``path``, then rename: a reader sees all of it or none."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=path.suffix)
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_out(out: Path, result: dict[str, Any], text: str, projections: Any) -> list[Path]:
    """The charts, ``projection.json`` and ``index.html`` into ``out`` (created)."""
    from llmpack.cluster.plan.project import charts, render

    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"--out {out}: cannot create it ({exc.strerror or exc})") from None
    write_atomic(out / CHARTS[0], lambda p: charts.chart_gang_ready(projections, p))
    write_atomic(out / CHARTS[1], lambda p: charts.chart_cost(projections, p))
    write_atomic(out / "projection.json", lambda p: p.write_text(json.dumps(result, indent=2) + "\n"))
    page = render.as_html(text, result["summary"], CHARTS)
    write_atomic(out / "index.html", lambda p: p.write_text(page))
    return [out / n for n in (*CHARTS, "projection.json", "index.html")]


@command("project", short_help="Gang spin-up, straggler waste and cost projected to more nodes.")
@click.option("--run-group", "run_groups", multiple=True, help="A measured run group in MLflow (repeatable).")
@click.option("--tracking-uri", default=None, help="MLflow tracking URI (default: MLFLOW_TRACKING_URI).")
@click.option("--pods", default=None, help="Instead: `kubectl get pods -o json` dump with gang node pods.")
@click.option("--nodes-dump", default=None, help="With --pods: `kubectl get nodes -o json` dump.")
@click.option("--events", default=None, help="With --pods: `kubectl get events -o json` dump.")
@click.option("--nodes", default=DEFAULT_NODES, show_default=True, help="Gang sizes to project, in nodes.")
@click.option("--gpus", default=None, help="Instead of --nodes: GPU totals (multiples of --gpus-per-node).")
@click.option("--gpus-per-node", type=click.IntRange(min=1), default=None,
              help="GPUs per node (default: the measured gangs').")
@click.option("--quantiles", default="50,90,99", show_default=True, help="Gang-ready percentiles.")
@click.option("--paths", default=None, metavar="A,B", help="Two paths: where their monthly costs cross.")
@click.option("--runs-per-month", type=click.FloatRange(min=0, min_open=True), default=100.0, show_default=True,
              help="For --paths.")
@click.option("--control-plane-cost", "control_plane", multiple=True, metavar="ORCH=USD",
              help="Monthly control-plane cost per path, for --paths (repeatable).")
@click.option("--train-hours", type=click.FloatRange(min=0), default=None,
              help="Training time per run (default: the measured runs' median).")
@click.option("--price-per-gpu-hour", default=None, help="Price (default: the runs' recorded, or the nodes' GPU).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of the table.")
@click.option("--out", type=click.Path(path_type=Path), default=None, help="Write charts, JSON and index.html here.")
def project(run_groups: tuple[str, ...], tracking_uri: str | None, pods: str | None, nodes_dump: str | None,
            events: str | None, nodes: str, gpus: str | None, gpus_per_node: int | None, quantiles: str,
            paths: str | None, runs_per_month: float, control_plane: tuple[str, ...], train_hours: float | None,
            price_per_gpu_hour: str | None, as_json: bool, out: Path | None) -> None:
    """Project measured gangs to more nodes: gang-ready p50/p90/p99, time to first step, GPU-hours and
    cost per run (compute, straggler waste, overhead), each with a 95% bootstrap interval; with
    --paths, the GPU count where two paths' monthly costs cross. Model: docs/plan.md."""
    from llmpack.cluster.plan.project import run

    result, text = run.project(
        run_groups=run_groups, tracking_uri=tracking_uri, pods=pods, nodes_dump=nodes_dump, events=events,
        sizes=gang_sizes(nodes, gpus, gpus_per_node), gpus_per_node=gpus_per_node,
        quantiles=parse_quantiles(quantiles), paths=paths, runs_per_month=runs_per_month,
        control_plane=control_plane, train_s=None if train_hours is None else train_hours * 3600,
        price_flag=price_per_gpu_hour)
    if out is not None:
        written = write_out(out, result, text, result.pop("_projections"))
    else:
        result.pop("_projections")
        written = []
    click.echo(json.dumps(redact_data(result), indent=2) if as_json else text)
    for path in written:
        if not as_json:
            click.echo(f"wrote {path}")
