"""Issue 49: plans whose intervals hold. The time quantiles' intervals on a second family of histories
of known truth (:mod:`own_histories`: gamma, Weibull, Burr and stall tails, not the coverage study's),
each GPU type of a merged dump planned from its own runs, training scaled by the gang, the held-out
``--calibration`` flagging miscalibrated histories, and a plan that writes nothing and says why local
runs are not history.

The coverage study over the independent generators: ``python benchmarks/plan_coverage/study.py``
(docs/plan.md has its table).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from llmpack.cli import main
from llmpack.cluster.plan import calibration, history, holdout, quantiles, run
from llmpack.cluster.plan.history import NodePhases, RunSample
from tests.llmpack.cluster.plan import own_histories as own
from tests.llmpack.cluster.plan.plan_runs import gang_run

QS = (0.5, 0.9)


def _spin_up(g: dict[str, np.ndarray], nodes: int, seed: int) -> dict[str, quantiles.Estimate]:
    return quantiles.gang_times(list(g["provision"].ravel() + g["pull"].ravel()), list(g["overhead"]), [0.0],
                                nodes=nodes, qs=QS, train=quantiles.fixed_training(0.0, ""), after_s=0.0,
                                extrapolated=[False, False], seed=seed)["spin_up_s"]


@pytest.mark.parametrize("families", [own.LIGHT, own.HEAVY], ids=["light", "heavy"])
def test_the_95_percent_intervals_hold_on_a_second_family_of_known_truth(families: tuple[str, ...]) -> None:
    """10 runs of 2-node gangs planned at 2 and 8 nodes: p50 and p90 of spin-up inside their interval
    in at least 85% of seeds per cell and 90% overall (stated 95%; 16 seeds a cell, so a cell's count
    is noisy: 85% is 14 of 16); and not bought by absurd width: the median interval at most 0.7 x the
    truth at 2 nodes and 1.3 x at 8 (measured: 0.42 / 0.86 light, 0.60 / 1.10 heavy). The old bootstrap
    held 44-49 of these 64 p90s at 2 nodes."""
    held, cells, widths = [], {}, {2: [], 8: []}
    for fam in families:
        for gpu in (own.A100, own.L40S):
            for nodes in (2, 8):
                truth = own.truth(fam, gpu, nodes)
                hits = []
                for seed in range(16):
                    est = _spin_up(own.history(fam, gpu, 10, 2, seed), nodes, seed)
                    pairs = list(zip((est["p50"], est["p90"]), truth, strict=True))
                    hits += [e.low <= t <= e.high for e, t in pairs]
                    widths[nodes] += [(e.high - e.low) / t for e, t in pairs]
                cells[(fam, gpu, nodes)] = sum(hits) / len(hits)
                held += hits
    assert min(cells.values()) >= 0.85, cells
    assert sum(held) / len(held) >= 0.90, cells
    assert np.median(widths[2]) <= 0.7 and np.median(widths[8]) <= 1.3


def test_the_interval_passes_the_slowest_node_measured() -> None:
    g = own.history("stall", own.A100, 10, 2, 3)
    ready = g["provision"] + g["pull"]
    est = _spin_up(g, 8, 3)["p90"]
    truth = own.truth("stall", own.A100, 8)[1]
    assert est.high > g["overhead"].max() + ready.max()  # a bootstrap of the nodes cannot get here
    assert est.low <= truth <= est.high
    # Lognormal nodes: the lognormal fit alone is exact; the union is never narrower than it.
    x = np.exp(5 + 0.3 * np.random.default_rng(1).standard_normal(40))
    ln = np.percentile(quantiles.lognormal_draws(x, [0.9 ** (1 / 8)], np.random.default_rng(2))[:, 0], [2.5, 97.5])
    both = quantiles.interval(quantiles.per_node(list(x), [0.9 ** (1 / 8)], np.random.default_rng(2)))
    assert both.low <= ln[0] + 1e-9 and both.high >= ln[1] - 1e-9


def _dumps(tmp_path: Path, mixed: bool = False, runs: int = 10, nodes: int = 2) -> list[str]:
    h = [(gpu, own.history("gamma", gpu, runs, nodes, 5)) for gpu in (own.A100, own.L40S)]
    paths = own.dumps(h, tmp_path / "dumps", node_gpus={(2, 1): own.L40S} if mixed else None)
    return ["--pods", str(paths["pods"]), "--nodes-dump", str(paths["nodes"]), "--events", str(paths["events"])]


def test_a_merged_dump_plans_each_gpu_type_from_its_own_runs_and_leaves_out_a_mixed_gang(tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["cluster", "plan", *_dumps(tmp_path, mixed=True), "--capacity", "on-demand",
                                    "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    rows = {o["gpu_type"]: o for o in out["options"]}
    # Run 2 is an A100 gang with one L40S node: left out, said once; each type from its own runs.
    assert rows[own.A100]["own_runs"] == 9 and rows[own.L40S]["own_runs"] == 10 and out["history_runs"] == 19
    assert all(o["estimated"] and not o["borrowed"] for o in out["options"])
    assert [n for n in out["history_notes"] if "different GPU types" in n] == [
        "1 gang(s) left out: their nodes are of different GPU types (a gang waits for its slowest node, so its time "
        "is no one type's): ft-002"]
    # The slower-provisioning L40S is planned slower: the two types were not pooled.
    assert (rows[own.L40S]["times_s"]["spin_up_s"]["p50"]["value"]
            > rows[own.A100]["times_s"]["spin_up_s"]["p50"]["value"])


def test_eight_nodes_divide_the_training_and_cost_price_x_gpus_x_their_own_time(tmp_path: Path) -> None:
    args = ["cluster", "plan", *_dumps(tmp_path), "--capacity", "on-demand", "--gpu-type", "a100-80gb",
            "--price-per-gpu-hour", "3.0"]
    two, eight = ({o["gpu_type"]: o for o in json.loads(CliRunner().invoke(main, [*args, "--nodes", n, "--json"])
                                                           .stdout)["options"]}[own.A100] for n in ("2", "8"))
    assert eight["gpus"] == 32 and eight["train_s"] == pytest.approx(two["train_s"] / 4)
    for row in (two, eight):
        assert row["cost_usd"]["compute"]["value"] == pytest.approx(3.0 * row["gpus"] * row["train_s"] / 3600, rel=1e-3)
        t = row["times_s"]
        # The time the cost is priced at is the one the plan's total adds (no post-training in dumps).
        assert t["total_s"]["p50"]["value"] - t["first_step_s"]["p50"]["value"] == pytest.approx(row["train_s"],
                                                                                                 rel=0.03)
    assert eight["times_s"]["total_s"]["p50"]["value"] < two["times_s"]["total_s"]["p50"]["value"]
    text = CliRunner().invoke(main, [*args, "--nodes", "8"]).stdout
    assert "throughput per GPU taken as constant (perfect scaling, a prior, not measured)" in " ".join(text.split())


def _sample(i: int, ready: list[float], overhead: float = 15.0, gpu: str = "nvidia-h200") -> RunSample:
    return RunSample(run=f"r{i}", path="argo", gpu_type=gpu, capacity="on-demand",
                     nodes=tuple(NodePhases(provision_s=r - 20.0, pull_s=20.0) for r in ready), overhead_s=overhead,
                     load_s=None, train_s=600.0, post_s=None, gpus_per_node=8, preemptions=0, price_per_gpu_hour=None,
                     submitted_at=1e9 + 1000 * i)


def _gamma_history(runs: int, nodes: int, seed: int, shift: float = 0.0, start: int = 0) -> list[RunSample]:
    rng = np.random.default_rng(seed)
    return [_sample(start + i, list(100 + shift + rng.gamma(4.0, 30.0, nodes))) for i in range(runs)]


def test_held_out_calibration_is_quiet_on_a_history_the_plan_fits() -> None:
    report = holdout.check(_gamma_history(30, 2, 1))
    c = report["options"]["argo nvidia-h200 on-demand"]
    assert c["loo"]["runs"] == 30 and c["time"]["runs"] == 25 and report["warnings"] == []


def test_held_out_calibration_flags_a_cluster_that_changed() -> None:
    """A planted shift: the last 15 of 30 runs provision 250 s slower (a new node pool, say). Planned
    from the runs before them, they land above the p90 far more than one time in ten."""
    shifted = _gamma_history(15, 2, 2) + _gamma_history(15, 2, 3, shift=250.0, start=15)
    report = holdout.check(shifted)
    time_split = report["options"]["argo nvidia-h200 on-demand"]["time"]
    assert time_split["p90"]["below_stated"], time_split
    assert any(w.startswith("WARNING argo nvidia-h200 on-demand, time split: p90 held") for w in report["warnings"])
    text = calibration.text(calibration.calibration(shifted))
    assert "below its stated 90%: the plan's tail is too light for this history, or the cluster changed" in " ".join(
        text.split())


def test_held_out_calibration_flags_nodes_that_are_not_independent() -> None:
    """A planted dependence the max-of-N model cannot know: 8-node gangs whose nodes all wait out one
    shared capacity delay (here 300-500 s), beside 2-node gangs that never do. From the pooled nodes
    the independent-node model has most 2-node gangs wait too: they land below its p50 far more than
    half the time."""
    rng = np.random.default_rng(4)
    small = _gamma_history(20, 2, 5)
    big = [_sample(100 + i, list(100 + rng.gamma(4.0, 30.0, 8) + rng.uniform(300, 500))) for i in range(12)]
    report = holdout.check(small + big)
    loo = report["options"]["argo nvidia-h200 on-demand"]["loo"]
    assert loo["p50"]["above_stated"], loo
    assert any("leave-one-out: p50 held" in w and "above its stated 50%: the plan is too slow for this history" in w
               for w in report["warnings"])


def test_a_plan_in_an_empty_directory_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    for args in (["cluster", "plan"], ["cluster", "plan", "--calibration"], ["cluster", "plan", "--json"]):
        res = CliRunner().invoke(main, args)
        assert res.exit_code == 0, res.output
    assert list(tmp_path.iterdir()) == []
    text = CliRunner().invoke(main, ["cluster", "plan"]).stdout
    assert "history: no measured cluster run in the tracking store" in text


def test_local_runs_are_said_not_to_be_cluster_history(monkeypatch: pytest.MonkeyPatch) -> None:
    from llmpack.report import facts

    local = [{"mode": "local", "status": "succeeded", "orchestrator": "local", "events": {}} for _ in range(23)]
    monkeypatch.setattr(history, "read_only_client", lambda _uri: object())
    monkeypatch.setattr(facts, "runs_from_mlflow", lambda _mc, _group: local)
    samples = history.from_mlflow(["rg-local"], None, strict=False)
    assert samples == [] and samples.notes == [history.LOCAL_NOTE.format(n=23)]
    text = run.plan(samples, run.PlanInputs(gpu_types=("nvidia-h200",), capacities=("on-demand",), nodes=1)).text()
    assert "history: none" not in text and "23 local run(s) in the store are not cluster history" in " ".join(
        text.split())
    with pytest.raises(Exception, match=r"run group 'rg-local': its 23 runs are local"):
        history.from_mlflow(["rg-local"], None, strict=True)


def test_nodes_1_proposes_nodes_1_and_a_one_node_cluster_run_is_history() -> None:
    plan = run.plan([], run.PlanInputs(gpu_types=("nvidia-h200",), capacities=("on-demand",), nodes=1))
    assert all("--nodes 1 " in r.note and "--nodes 2" not in r.note for r in plan.rows)
    rec = gang_run("argo", "nvidia-h200", 0, random.Random(1), nodes=2, provision=(30.0, 30.0))
    ev = rec["events"]["finetune"]
    one = {**rec, "mode": "cluster", "events": {"finetune": {
        "pod_created": ev["pod_created.node0"], "node_ready": ev["node_ready.node0"],
        "container_started": ev["container_started.node0"], "first_step": ev["first_step"],
        "finished": ev["finished"]}}}
    s = history.sample_of_run(one)
    assert s is not None and len(s.nodes) == 1 and s.nodes[0].provision_s == pytest.approx(30.0)
    assert s.train_s == pytest.approx(600.0) and history.sample_of_run({**one, "mode": "local"}) is None
