"""``llmpack plan`` validated on the loopback cluster: two GPU types whose nodes come up at paces drawn
from different distributions (:mod:`standins.node_paces`) and are priced differently, 10 measured runs
per path on each, a plan from that history, then the next 10 runs per path on each submitted with the
plan's estimate on their records (``--plan``'s hooks), and the estimate checked against them:

* each headline's p50 and p90 held (actual <= the quantile's 95% upper end) at least at their stated
  rates, 50% and 90%, over all 40 planned runs, the counts printed as measured ("held 37 of 40");
* ``plan --calibration`` reads the same counts back from MLflow;
* the option the plan chose by cost is the one whose runs were cheapest (mean cost), and by time
  the one whose runs finished soonest (median total, the time objective's figure).

Virtual time: the paces are minutes of the cluster's clock, played in milliseconds.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner
from standins.loopback import LoopbackCluster
from standins.node_paces import NodePaces, fixed, lognormal, uniform

from llmpack.cluster.compare import cluster
from llmpack.cluster.plan import calibration, history, record, run

RUNS, PATHS = 10, "argo,mlflow"
# GPU type -> (the fake nodes' product and instance type, their paces): L4 cheap and slow to come up,
# H200 dear and quick.
GPUS: dict[str, tuple[dict[str, str], Callable[[], NodePaces]]] = {
    "nvidia-h200": ({"gpu_product": "NVIDIA-H200", "instance_type": "p5en.48xlarge"},
                    lambda: NodePaces(node_create=fixed(1), node_ready=uniform(20, 50), pull=uniform(5, 15),
                                      start=fixed(1), seed=11)),
    "nvidia-l4": ({"gpu_product": "NVIDIA-L4", "instance_type": "g2-standard-4"},
                  lambda: NodePaces(node_create=fixed(1), node_ready=lognormal(120, 0.3), pull=uniform(5, 15),
                                    start=fixed(1), seed=13)),
}

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("loopback_env")]


def _measure(tmp_path: Path, uri: str, gpu: str, planned: dict | None = None) -> dict:
    """RUNS runs per path on a cluster of ``gpu`` nodes; with ``planned``, the estimate recorded on each."""
    fake, paces = GPUS[gpu]
    (tmp_path / gpu).mkdir(parents=True)
    with LoopbackCluster(tmp_path / gpu, uri, node_paces=paces(), **fake) as c:
        result = cluster.compare_cluster(**c.options(backends=PATHS, nodes=2, gpus=1, repeats=RUNS))
    assert result["failed"] == [], result["failed"]
    if planned is not None:
        record.after_compare(planned, result)
    return result


def test_the_plan_holds_on_the_next_runs_and_chooses_what_they_show_cheapest(tmp_path: Path, capsys) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    groups = [_measure(tmp_path, uri, gpu)["run_group"] for gpu in GPUS]
    samples = history.from_mlflow(groups, uri)
    assert len(samples) == 2 * 2 * RUNS and {s.gpu_type for s in samples} == set(GPUS)
    inputs = {"capacities": ("on-demand",), "nodes": 2}
    by_cost = run.plan(samples, run.PlanInputs(objective="cost", **inputs))
    by_time = run.plan(samples, run.PlanInputs(objective="time", **inputs))
    plan_json = by_cost.as_json()
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(plan_json))
    from llmpack.cluster.plan.chart import chart_plan

    chart_plan(by_cost.rows, by_cost.choice, tmp_path / "plan.png")  # looked at: docs/images/plan.png
    assert all(o["estimated"] and not o["borrowed"] for o in plan_json["options"])

    actual: dict[str, list[dict]] = {}
    for gpu in GPUS:
        planned = record.before_compare(str(plan_file), None, labels=PATHS.split(","), gpu_type=gpu, cluster=True)
        result = _measure(tmp_path / "next", uri, gpu, planned)
        for r in result["runs"]:
            assert r["tags"]["llmpack.plan.option"] == f"{r['orchestrator']} {gpu} on-demand"
            actual.setdefault(r["tags"]["llmpack.plan.option"], []).append(r)

    # The report of the last comparison, and the same rebuilt from MLflow, put each run beside its estimate.
    from components.record import tracking
    from llmpack.report import estimate as section
    from llmpack.report import runs_from_mlflow, write_report

    md = (write_report(result, tmp_path / "report") / "report.md").read_text()
    assert "## Estimate vs actual" in md and md.count(" | first step | ") == 2 * RUNS
    assert (sorted(section.rows(runs_from_mlflow(tracking.client(uri), result["run_group"])))
            == sorted(section.rows(result["runs"])))
    # Coverage: per headline, over the 40 planned runs.
    report = calibration.calibration(history.from_mlflow(
        [g for g in history.all_groups(uri) if g not in groups], uri))
    assert report["planned_runs"] == 4 * RUNS
    lines = []
    for h, name in calibration.HEADLINES.items():
        c = report["headlines"][h]
        lines.append(f"{name}: p50 held {c['held']['p50']} of {c['runs']}, p90 held {c['held']['p90']} of {c['runs']}")
        assert c["runs"] == 4 * RUNS and c["ok"], (h, c)
    # The same counts through the CLI, as `llmpack plan --calibration` prints them.
    cli = CliRunner().invoke(__import__("llmpack.cli").cli.main, ["cluster", "plan", "--calibration",
                                                                  "--tracking-uri", uri])
    assert cli.exit_code == 0 and f"p90 held {report['headlines']['first_step_s']['held']['p90']} of 40" in cli.stdout

    # The choice against what the runs showed.
    mean_cost = {o: statistics.mean(r["metrics"]["cost_usd"] for r in rs) for o, rs in actual.items()}
    median_total = {o: statistics.median(r["metrics"]["total_s"] for r in rs) for o, rs in actual.items()}
    cheapest, soonest = min(mean_cost, key=mean_cost.get), min(median_total, key=median_total.get)
    chosen_cost = by_cost.choice.chosen.samples.option.label
    chosen_time = by_time.choice.chosen.samples.option.label
    with capsys.disabled():  # the figures docs/plan.md quotes
        print("\n" + by_cost.text())
        print("\n".join(lines))
        print(f"chosen by cost: {chosen_cost}; actual mean cost: "
              + ", ".join(f"{o} ${v:.3f}" for o, v in sorted(mean_cost.items())))
        print(f"chosen by time: {chosen_time}; actual median total: "
              + ", ".join(f"{o} {v:.0f} s" for o, v in sorted(median_total.items())))
    assert chosen_cost.split()[1] == "nvidia-l4" and cheapest.split()[1] == "nvidia-l4"
    assert chosen_time.split()[1] == "nvidia-h200" and soonest.split()[1] == "nvidia-h200"
    assert chosen_cost == cheapest, (chosen_cost, mean_cost)
    assert chosen_time == soonest, (chosen_time, median_total)
