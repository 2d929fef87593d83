"""``llmpack plan``: what is borrowed between GPU types, the gang's max-of-N, spot waste, the choice,
"no measurement" without history, the 80-column table, the chart, and the one-line refusals.

On the loopback cluster, planned against real runs: tests/llmpack/cluster/plan/test_plan_cluster.py (slow).
"""

from __future__ import annotations

import datetime as dt
import json
import random
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from llmpack.cli import main
from llmpack.cluster.plan import history, phases, render, run
from llmpack.cluster.plan.history import samples_of_runs
from tests.llmpack.cluster.plan.plan_runs import gang_run
from tests.llmpack.cluster.plan.plan_runs import history as make_history

TODAY = dt.date(2026, 12, 5)
FAST_DEAR = {"provision": (20.0, 40.0), "price": 7.9}
SLOW_CHEAP = {"provision": (150.0, 250.0), "price": 0.7}


def _samples(spec: dict, runs: int = 10, seed: int = 1) -> list[history.RunSample]:
    return samples_of_runs(make_history(spec, runs, seed))


def _row(plan: run.Plan, path: str, gpu: str, capacity: str = "on-demand"):  # noqa: ANN202
    return next(r for r in plan.rows if r.samples.option == phases.Option(path=path, gpu_type=gpu, capacity=capacity))


def test_a_gang_run_becomes_a_sample_with_its_phases_apart() -> None:
    rec = gang_run("argo", "nvidia-h200", 0, random.Random(3), provision=(30.0, 30.0), pull=(8.0, 8.0),
                   overhead=(5.0, 5.0), load=(12.0, 12.0), train_s=600.0, post_s=30.0)
    s = history.sample_of_run(rec)
    assert s is not None and s.path == "argo" and s.gpu_type == "nvidia-h200" and s.capacity == "on-demand"
    assert [(n.provision_s, n.pull_s) for n in s.nodes] == [(30.0, 8.0), (30.0, 8.0)]
    assert (s.overhead_s, s.load_s, s.train_s) == (5.0, 12.0, 600.0)
    assert s.post_s == pytest.approx(30.0)
    assert history.sample_of_run({**rec, "status": "failed"}) is None


def test_gpu_independent_phases_are_borrowed_and_marked_gpu_dependent_ones_never_cross_gpu_types() -> None:
    samples = _samples({("argo", "nvidia-h200"): FAST_DEAR, ("argo", "nvidia-l4"): SLOW_CHEAP,
                        ("mlflow", "nvidia-h200"): FAST_DEAR})
    own = phases.option_samples(samples, phases.Option(path="argo", gpu_type="nvidia-l4", capacity="on-demand"))
    assert own.borrowed == {} and own.measured and own.runs == 10
    # mlflow was never run on L4: its path phases come from mlflow on H200, the GPU's from argo on L4.
    mixed = phases.option_samples(samples, phases.Option(path="mlflow", gpu_type="nvidia-l4", capacity="on-demand"))
    assert mixed.measured and mixed.runs == 0
    assert mixed.borrowed["overhead"].startswith("nvidia-h200") and mixed.borrowed["load"].startswith("nvidia-h200")
    assert mixed.borrowed["pull"].startswith("nvidia-h200")
    assert mixed.borrowed["provision"].startswith("argo") and mixed.borrowed["train"].startswith("argo")
    assert min(mixed.ready_s) > 150.0  # L4's provisioning, not H200's
    # A GPU type nobody ran gets nothing from the others: provisioning and training depend on it.
    none = phases.option_samples(samples, phases.Option(path="argo", gpu_type="nvidia-a100-80gb", capacity="on-demand"))
    assert not none.measured and set(none.missing) == {"provision", "train"}


def test_spin_up_grows_with_the_gang_by_max_of_n_and_first_step_adds_the_load() -> None:
    samples = _samples({("argo", "nvidia-h200"): {"provision": (20.0, 80.0), "price": 7.9}}, runs=30)
    inputs = {"capacities": ("on-demand",)}
    small = _row(run.plan(samples, run.PlanInputs(nodes=2, **inputs), today=TODAY), "argo", "nvidia-h200")
    big = _row(run.plan(samples, run.PlanInputs(nodes=8, **inputs), today=TODAY), "argo", "nvidia-h200")
    assert big.times["spin_up_s"]["p50"].value > small.times["spin_up_s"]["p50"].value + 5
    for r in (small, big):
        for q in ("p50", "p90"):
            up, first = r.times["spin_up_s"][q], r.times["first_step_s"][q]
            assert up.low <= up.value <= up.high
            assert 10.0 <= first.value - up.value <= 14.0  # the measured load, 10-14 s
        assert r.times["spin_up_s"]["p90"].value > r.times["spin_up_s"]["p50"].value
    assert big.cost["straggler_waste"].value > small.cost["straggler_waste"].value
    # Training scales with the gang (constant throughput per GPU, the stated prior): 4x the GPUs, a quarter
    # of the time, the same GPU-hours; the cost is the price x the GPUs x the plan's own time at that size.
    assert big.train_s == pytest.approx(small.train_s / 4) and "perfect scaling" in big.training
    for r in (small, big):
        assert r.cost["compute"].value == pytest.approx(r.price.per_gpu_hour * r.gpus * r.train_s / 3600)
    eight = _row(run.plan(samples, run.PlanInputs(nodes=2, gpus_per_node=8, **inputs), today=TODAY), "argo",
                 "nvidia-h200")
    assert eight.gpus == 16 and eight.train_s == pytest.approx(small.train_s / 8)
    assert eight.cost["compute"].value == pytest.approx(small.cost["compute"].value)
    assert eight.times["spin_up_s"]["p50"].value == small.times["spin_up_s"]["p50"].value  # the nodes' pace, not G


def test_spot_adds_the_expected_preemption_waste_from_the_given_rate_or_says_it_has_none(tmp_path: Path) -> None:
    samples = _samples({("argo", "nvidia-h200"): FAST_DEAR})
    prices = tmp_path / "prices.yaml"
    prices.write_text("prices:\n  - {gpu: nvidia-h200, provider: aws, per_gpu_hour: 8.0, spot_per_gpu_hour: 3.0, "
                      "as_of: 2026-11-01, source: test}\n")
    base = {"price_file": str(prices), "checkpoint_interval_s": 120.0}
    without = run.plan(samples, run.PlanInputs(**base), today=TODAY)
    assert _row(without, "argo", "nvidia-h200", "spot").cost == {}
    assert "no preemption rate" in _row(without, "argo", "nvidia-h200", "spot").note
    plan = run.plan(samples, run.PlanInputs(spot_interruptions_per_hour=0.5, **base), today=TODAY)
    spot, od = _row(plan, "argo", "nvidia-h200", "spot"), _row(plan, "argo", "nvidia-h200")
    p = spot.preemption
    held_h = ((spot.samples.load_s and sorted(spot.samples.load_s)[len(spot.samples.load_s) // 2] or 0) / 3600
              + 600 / 3600)
    assert p["expected"] == pytest.approx(0.5 * 2 * held_h, rel=0.05)
    assert p["lost_s"] > 60.0  # half the 120 s interval, plus a node's re-spin-up and the load
    assert spot.cost["preemption_waste"].value == pytest.approx(p["expected"] * 2 * p["lost_s"] * 3.0 / 3600)
    assert spot.price.per_gpu_hour == 3.0 and od.price.per_gpu_hour == 8.0
    assert spot.times["total_s"]["p50"].value > od.times["total_s"]["p50"].value
    assert spot.cost["total"].value < od.cost["total"].value
    # Measured instead: 2 preempted attempts in the spot runs' node-hours.
    spot_hist = samples + samples_of_runs([gang_run("argo", "nvidia-h200", 50 + i, random.Random(i), provision=(20, 40),
                                                    capacity="spot", preempted=1 if i < 2 else 0) for i in range(10)])
    measured = _row(run.plan(spot_hist, run.PlanInputs(**base), today=TODAY), "argo", "nvidia-h200", "spot")
    assert measured.preemption["source"].startswith("measured: 2 in ")
    assert "provision" not in measured.samples.borrowed  # its own spot runs now


def test_the_choice_follows_the_objective_and_the_limits_and_says_why() -> None:
    samples = _samples({("argo", "nvidia-h200"): FAST_DEAR, ("argo", "nvidia-l4"): SLOW_CHEAP})
    od = {"capacities": ("on-demand",)}
    cheap = run.plan(samples, run.PlanInputs(objective="cost", **od), today=TODAY).choice
    assert cheap.chosen.samples.option.gpu_type == "nvidia-l4"
    assert (cheap.why.startswith("chosen: argo nvidia-l4 on-demand: cheapest at $")
            and "next argo nvidia-h200" in cheap.why)
    fast = run.plan(samples, run.PlanInputs(objective="time", **od), today=TODAY).choice
    assert fast.chosen.samples.option.gpu_type == "nvidia-h200" and "fastest" in fast.why
    l4_p90 = _row(run.plan(samples, run.PlanInputs(**od), today=TODAY),
                  "argo", "nvidia-l4").times["total_s"]["p90"].value
    tight = run.plan(samples, run.PlanInputs(objective="cost", deadline_s=l4_p90 - 1, **od), today=TODAY).choice
    assert tight.chosen.samples.option.gpu_type == "nvidia-h200" and "1 over it" in tight.why
    broke = run.plan(samples, run.PlanInputs(max_cost=0.01, **od), today=TODAY).choice
    assert broke.chosen is None and broke.why.startswith("nothing chosen: no option keeps within $0.01")


def test_without_history_every_row_says_no_measurement_and_how_to_get_one(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    res = CliRunner().invoke(main, ["cluster", "plan", "--tracking-uri", uri, "--gpu-type", "h200,l4", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["history_runs"] == 0 and out["chosen"] is None
    assert len(out["options"]) == 3 * 2 * 2  # kfp, argo, mlflow x two GPU types x on-demand, spot
    for o in out["options"]:
        assert o["times_s"] == {} and o["cost_usd"] == {} and not o["estimated"]
        assert o["note"].startswith("no measurement of overhead, provision, train: llmpack cluster compare "
                                    f"--backends {o['path']} --gpu-type {o['gpu_type']} --nodes 2 --repeats 10")
    text = CliRunner().invoke(main, ["cluster", "plan", "--tracking-uri", uri]).stdout
    assert "no measurement" in text and not re.search(r"\$\d", text)


def test_the_table_fits_80_columns_and_out_writes_the_chart_and_json(tmp_path: Path, monkeypatch) -> None:
    from llmpack.cluster.plan import command

    samples = _samples({("argo", "nvidia-h200"): FAST_DEAR, ("mlflow", "nvidia-l4"): SLOW_CHEAP})
    monkeypatch.setattr(run, "read_history", lambda *a, **k: samples)
    res = CliRunner().invoke(main, ["cluster", "plan", "--out", str(tmp_path / "out"),
                                    "--spot-interruptions-per-hour", "0.2"])
    assert res.exit_code == 0, res.output
    lines = [ln for ln in res.stdout.splitlines() if not ln.startswith("wrote ")]  # a path is as long as it is
    assert max(len(ln) for ln in lines) <= 80, max(lines, key=len)
    assert any(ln.startswith("* ") for ln in lines) and "chosen: " in res.stdout
    assert "borrowed: overhead from nvidia-h200 (10 runs)" in res.stdout
    png = (tmp_path / "out" / command.CHART).read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    data = json.loads((tmp_path / "out" / "plan.json").read_text())
    assert data["chosen"] == data["why"].split(": ")[1] and sum(o["chosen"] for o in data["options"]) == 1


@pytest.mark.parametrize(("args", "message"), [
    (["--deadline", "soon"], "--deadline 'soon': a positive duration like 300s, 45m or 2h"),
    (["--gpu-type", "h200,tpu9"], "--gpu-type 'tpu9': unknown GPU type"),
    (["--paths", "argo,airflow"], "--paths 'airflow': not a cluster path"),
    (["--capacity", "reserved"], "--capacity 'reserved': one of on-demand, spot"),
    (["--provider", "oracle"], "--provider 'oracle': no price row from it"),
    (["--price-file", "/nonexistent/prices.yaml"], "--price-file /nonexistent/prices.yaml: no such file"),
    (["--price-per-gpu-hour", "cheap"], "--price-per-gpu-hour: price 'cheap' is not a number"),
])
def test_bad_input_is_one_line_and_exit_2(args: list[str], message: str, tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["cluster", "plan", "--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}", *args])
    assert res.exit_code == 2, res.output
    assert message in res.output and len(res.output.strip().splitlines()) == 1, res.output
    assert not (tmp_path / "m.db").exists()  # refused before the store was opened


def test_the_pipelines_other_gpu_time_is_the_node_bill_less_the_gang_and_is_priced() -> None:
    rec = gang_run("mlflow", "nvidia-h200", 0, random.Random(3), provision=(30.0, 30.0), pull=(8.0, 8.0),
                   overhead=(5.0, 5.0), load=(12.0, 12.0), train_s=600.0)
    ev = rec["events"]["finetune"]
    gang_h = sum(ev["finished"] - ev[f"node_ready.node{k}"] + 600.0 for k in range(2)) / 3600
    rec["metrics"]["node_gpu_hours"] = gang_h + 0.25  # the MLflow Job's own GPU pod, say
    assert history.other_gpu_hours(rec, 1) == pytest.approx(0.25)
    assert history.sample_of_run({**rec, "metrics": {**rec["metrics"], "node_gpu_hours": None}}).other_gpu_h is None
    records = []
    for i in range(10):
        r = gang_run("mlflow", "nvidia-h200", i, random.Random(i), provision=(20.0, 40.0), price=8.0)
        e = r["events"]["finetune"]
        r["metrics"]["node_gpu_hours"] = (sum(e["finished"] - e[f"node_ready.node{k}"] + 600 for k in range(2)) / 3600
                                          + 0.25)
        records.append(r)
    plan = run.plan(samples_of_runs(records), run.PlanInputs(capacities=("on-demand",)), today=TODAY)
    row = _row(plan, "mlflow", "nvidia-h200")
    other = row.cost["other_gpu"]
    assert (other.value == pytest.approx(0.25 * row.price.per_gpu_hour, rel=1e-6)
            and other.low <= other.value <= other.high)
    parts = sum(row.cost[k].value for k in ("compute", "straggler_waste", "overhead", "other_gpu"))
    assert row.cost["total"].value == pytest.approx(parts)
    assert "other gpu $" in "\n".join(render.block(row, False))


def test_kubectl_dumps_are_history_too_their_unmeasured_load_said() -> None:
    examples = Path(__file__).resolve().parents[4] / "examples" / "projection"
    res = CliRunner().invoke(main, ["cluster", "plan", "--pods", str(examples / "pods.json"), "--nodes-dump",
                                    str(examples / "nodes.json"), "--events", str(examples / "events.json"),
                                    "--nodes", "4", "--capacity", "on-demand", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["history_runs"] == 52 and {o["path"] for o in out["options"]} == {"argo", "mlflow"}
    for o in out["options"]:
        assert o["estimated"] and o["gpu_type"] == "nvidia-h200" and o["gpus"] == 32 and o["assumed_zero"] == ["load"]
    res = CliRunner().invoke(main, ["cluster", "plan", "--events", str(examples / "events.json")])
    assert res.exit_code == 2 and "--nodes-dump/--events: only with --pods" in res.output


def test_max_steps_scales_the_training_by_the_measured_time_per_step() -> None:
    records = make_history({("argo", "nvidia-h200"): {"provision": (20.0, 40.0), "train_s": 600.0, "max_steps": 60}})
    samples = samples_of_runs(records)
    assert {s.steps for s in samples} == {60}
    od = {"capacities": ("on-demand",)}
    base = _row(run.plan(samples, run.PlanInputs(**od), today=TODAY), "argo", "nvidia-h200")
    more = _row(run.plan(samples, run.PlanInputs(max_steps=120, **od), today=TODAY), "argo", "nvidia-h200")
    assert more.times["total_s"]["p50"].value == pytest.approx(base.times["total_s"]["p50"].value + 600.0)
    assert more.cost["compute"].value == pytest.approx(2 * base.cost["compute"].value)
    assert more.times["first_step_s"]["p50"].value == base.times["first_step_s"]["p50"].value
    unknown = _row(run.plan(_samples({("argo", "nvidia-h200"): FAST_DEAR}), run.PlanInputs(max_steps=120, **od),
                            today=TODAY), "argo", "nvidia-h200")
    assert "the runs record no max_steps, training time as measured" in unknown.note
    res = CliRunner().invoke(main, ["cluster", "plan", "--max-steps", "10", "--train-time", "1h"])
    assert res.exit_code == 2 and "--max-steps: not with --train-time" in res.output
