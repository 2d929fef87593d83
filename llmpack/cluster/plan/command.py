"""``llmpack cluster plan``: the click command (registered in :mod:`llmpack.cli` with one line).

Reads the measured history (progress on stderr), estimates every option, prints the table (or
``--json``) and with ``--out DIR`` writes ``plan.json`` and ``plan.png``, each whole or not at all.
Bad input is one line and exit 2 (:class:`components.errors.InputError`), before anything is read.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from components.errors import InputError
from components.redaction import redact_data
from llmpack.ui.terminal import command


def _finite_cost(ctx: Any, param: Any, value: float | None) -> float | None:
    from llmpack.cluster.plan.record import finite_cost  # the one check, loaded when the flag is given

    return finite_cost(ctx, param, value)

if TYPE_CHECKING:
    from llmpack.cluster.plan.run import Plan

CHART = "plan.png"


def parse_duration(text: str | None, flag: str) -> float | None:
    """``90`` (seconds), ``300s``, ``45m``, ``2h`` -> seconds; else one line."""
    if text is None:
        return None
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(s|m|min|h)?\s*", text)
    if not m or float(m.group(1)) <= 0:
        raise InputError(f"{flag} {text!r}: a positive duration like 300s, 45m or 2h")
    return float(m.group(1)) * {"s": 1, None: 1, "m": 60, "min": 60, "h": 3600}[m.group(2)]


def parse_list(text: str | None, flag: str) -> tuple[str, ...] | None:
    if text is None:
        return None
    items = tuple(dict.fromkeys(v.strip() for v in text.split(",") if v.strip()))
    if not items:
        raise InputError(f"{flag} {text!r}: an empty list")
    return items


def parse_paths(text: str | None) -> tuple[str, ...] | None:
    """Cluster paths of the backend registry, each optionally fused (``argo+fuse-gpu``); else one line."""
    from llmpack.backends import ORCHESTRATORS

    paths = parse_list(text, "--paths")
    for p in paths or ():
        backend, _, fuse = p.partition("+fuse-")
        if backend not in ORCHESTRATORS or ("+fuse-" in p and fuse not in ("gpu", "all")):
            raise InputError(f"--paths {p!r}: not a cluster path ({', '.join(ORCHESTRATORS)}, optionally +fuse-gpu "
                             "or +fuse-all)")
    return paths


def parse_gpu_types(text: str | None) -> tuple[str, ...] | None:
    """Full ids of the GPU types named (full id or short name, as ``--gpu-type`` takes them, or any type
    the price catalogue lists: a plan prices GPUs the compiler may not place yet); else one line."""
    from components.record import cost
    from llmpack.gpu_catalogue import ALIASES, PREFIX, lookup_gpu_type

    priced = cost.known_gpu_types()
    names = {**{t.removeprefix(PREFIX): t for t in priced}, **{t: t for t in priced}, **ALIASES}
    out = []
    for t in parse_list(text, "--gpu-type") or ():
        found = lookup_gpu_type(t) or names.get(t.strip().lower())
        if found is None:
            raise InputError(f"--gpu-type {t!r}: unknown GPU type; priced: "
                             + ", ".join(n.removeprefix(PREFIX) for n in priced))
        out.append(found)
    return tuple(dict.fromkeys(out)) if text is not None else None


def parse_capacities(text: str) -> tuple[str, ...]:
    from llmpack.cluster.plan.history import CAPACITIES

    caps = parse_list(text, "--capacity") or ()
    for c in caps:
        if c not in CAPACITIES:
            raise InputError(f"--capacity {c!r}: one of {', '.join(CAPACITIES)}")
    return caps


def check_provider(provider: str, price_file: str | None) -> None:
    """A provider some row of the catalogue (or the price file) lists; else one line naming them."""
    from components.record import cost

    rows = [*cost.shipped_table(), *(cost._load_table(Path(price_file)) if price_file else [])]
    known = sorted({str(e.get("provider", "")) for e in rows} - {""})
    if provider not in known:
        raise InputError(f"--provider {provider!r}: no price row from it (known: {', '.join(known)})")


def write_out(out: Path, result: dict[str, Any], plan: Plan) -> list[Path]:
    """``plan.json`` and ``plan.png`` into ``out`` (created), each written whole or not at all."""
    from llmpack.cluster.plan.chart import chart_plan
    from llmpack.cluster.plan.project.command import write_atomic

    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"--out {out}: cannot create it ({exc.strerror or exc})") from None
    write_atomic(out / CHART, lambda p: chart_plan(plan.rows, plan.choice, p))
    write_atomic(out / "plan.json", lambda p: p.write_text(json.dumps(result, indent=2) + "\n"))
    return [out / CHART, out / "plan.json"]


@command("plan", short_help="Spin-up and cost per path x GPU type, estimated before submitting.")
@click.option("--run-group", "run_groups", multiple=True,
              help="A measured run group in MLflow (repeatable; default: every group in the store).")
@click.option("--tracking-uri", default=None, help="MLflow tracking URI (default: MLFLOW_TRACKING_URI).")
@click.option("--pods", default=None, help="Instead: `kubectl get pods -o json` dump with gang node pods.")
@click.option("--nodes-dump", default=None, help="With --pods: `kubectl get nodes -o json` dump.")
@click.option("--events", default=None, help="With --pods: `kubectl get events -o json` dump.")
@click.option("--paths", default=None, metavar="A,B", help="Paths to plan (default: those measured).")
@click.option("--gpu-type", "gpu_type", default=None, metavar="A,B",
              help="GPU types to plan (default: those measured).")
@click.option("--capacity", default="on-demand,spot", show_default=True, help="on-demand, spot, or both.")
@click.option("--nodes", type=click.IntRange(min=1), default=2, show_default=True, help="Nodes in the finetune gang.")
@click.option("--gpus", type=click.IntRange(min=1), default=None,
              help="GPUs per node (default: the measured runs'); training divides the measured GPU-seconds.")
@click.option("--objective", type=click.Choice(["cost", "time"]), default="cost", show_default=True,
              help="What the chosen row minimises.")
@click.option("--deadline", default=None, metavar="DURATION", help="Total time's p90 at most this (300s, 45m, 2h).")
@click.option("--max-cost", type=click.FloatRange(min=0, min_open=True), default=None, metavar="USD",
              callback=lambda c, p, v: _finite_cost(c, p, v), help="The cost's upper bound at most this, per run.")
@click.option("--spot-interruptions-per-hour", type=click.FloatRange(min=0), default=None,
              help="Spot preemptions per node-hour (default: measured from the history's spot runs).")
@click.option("--checkpoint-interval", default=None, metavar="DURATION",
              help="Time between checkpoints (default: none, a preemption loses half the training).")
@click.option("--max-steps", type=click.IntRange(min=1), default=None,
              help="Optimizer steps: training time = steps x the measured time per step (the runs' max_steps).")
@click.option("--train-time", default=None, metavar="DURATION",
              help="Training time, instead (default: the measured median).")
@click.option("--price-file", default=None, help="Price YAML overriding the shipped catalogue (its format).")
@click.option("--price-per-gpu-hour", default=None, help="One price for every option (USD per GPU-hour).")
@click.option("--provider", default=None, help="Catalogue provider: aws, gcp, azure (default: the first row's).")
@click.option("--stale-days", type=click.IntRange(min=1), default=180, show_default=True,
              help="A price older than this is flagged stale.")
@click.option("--calibration", is_flag=True,
              help="Instead: each run planned from the others (held out), and how often planned runs held.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of the table.")
@click.option("--out", type=click.Path(path_type=Path), default=None, help="Write plan.json and plan.png here.")
def plan(run_groups: tuple[str, ...], tracking_uri: str | None, pods: str | None, nodes_dump: str | None,
         events: str | None, paths: str | None, gpu_type: str | None, capacity: str,
         nodes: int, gpus: int | None, objective: str, deadline: str | None, max_cost: float | None,
         spot_interruptions_per_hour: float | None, checkpoint_interval: str | None, max_steps: int | None,
         train_time: str | None,
         price_file: str | None, price_per_gpu_hour: str | None, provider: str | None, stale_days: int,
         calibration: bool, as_json: bool, out: Path | None) -> None:
    """Estimate, from your own measured runs, each path x GPU type x on-demand/spot: spin-up, time to
    first step and total (p50, p90, 95% intervals) and cost per run, and choose one by --objective
    under --deadline and --max-cost. Without history a row says "no measurement" and what would
    measure it. Model and its limits: docs/plan.md."""
    from llmpack.cluster.plan import run
    from llmpack.ui.progress import note

    if calibration:
        from llmpack.cluster.plan import calibration as cal

        report = cal.calibration(run.read_history(run_groups, tracking_uri, note, (pods, nodes_dump, events)))
        click.echo(json.dumps(redact_data(report), indent=2) if as_json else cal.text(report))
        return
    if price_per_gpu_hour is not None:
        from components.record.cost import parse_price

        parse_price(price_per_gpu_hour, "--price-per-gpu-hour")
    if price_file is not None and not Path(price_file).is_file():
        raise InputError(f"--price-file {price_file}: no such file")
    if provider is not None:
        check_provider(provider, price_file)
    inputs = run.PlanInputs(
        paths=parse_paths(paths), gpu_types=parse_gpu_types(gpu_type), capacities=parse_capacities(capacity),
        nodes=nodes, gpus_per_node=gpus, objective=objective,  # type: ignore[arg-type]
        deadline_s=parse_duration(deadline, "--deadline"), max_cost=max_cost,
        spot_interruptions_per_hour=spot_interruptions_per_hour,
        checkpoint_interval_s=parse_duration(checkpoint_interval, "--checkpoint-interval"),
        price_file=price_file, price_flag=price_per_gpu_hour, provider=provider, stale_days=stale_days,
        train_s=parse_duration(train_time, "--train-time"), max_steps=max_steps)
    if max_steps is not None and train_time is not None:
        raise InputError("--max-steps: not with --train-time (one or the other sets the training time)")
    result = run.plan(run.read_history(run_groups, tracking_uri, note, (pods, nodes_dump, events)), inputs)
    payload = result.as_json()
    written = write_out(out, payload, result) if out is not None else []
    click.echo(json.dumps(redact_data(payload), indent=2) if as_json else result.text())
    for path in written:
        if not as_json:
            click.echo(f"wrote {path}")
