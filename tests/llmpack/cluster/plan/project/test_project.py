"""``llmpack project``: the max-of-N math against closed forms, the bootstrap's honesty
past the measured range, the flip, the command's JSON and its one-line refusals.

The projection on the loopback cluster, measured against real bigger gangs, is
tests/llmpack/cluster/plan/project/test_project_cluster.py (slow).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from components.errors import InputError
from llmpack.cli import main
from llmpack.cluster.plan.project import tail
from llmpack.cluster.plan.project.data import MeasuredGang, NodeTimes
from llmpack.cluster.plan.project.fit import PathFit, fit_paths
from llmpack.cluster.plan.project.flip import flip
from llmpack.cluster.plan.project.model import project_path

EXAMPLES = Path(__file__).resolve().parents[5] / "examples" / "projection"


def exp_max_quantile(q: float, n: int, scale: float = 1.0) -> float:
    """The q-quantile of the max of n Exp(scale) draws: -scale ln(1 - q^(1/n))."""
    return -scale * math.log(1.0 - q ** (1.0 / n))


def a_fit(path: str, ready: np.ndarray, *, runs: int = 20, overhead: float = 0.0, billed: float = 0.0,
          train_s: float = 3600.0, price: float | None = 2.0, gpus: int = 8) -> PathFit:
    return PathFit(path=path, runs=runs, gang_sizes=(2,), ready_s=tuple(float(v) for v in ready),
                   billed_s=(billed,) * len(ready), overhead_s=(overhead,) * runs, first_step_s=(0.0,) * runs,
                   train_s=train_s, gpus_per_node=gpus, price_per_gpu_hour=price, phases={})


@pytest.mark.parametrize("nodes", [1, 8, 32])
def test_max_quantiles_match_the_closed_form_for_exponential_and_uniform(nodes: int) -> None:
    rng = np.random.default_rng(7)
    qs = [0.5, 0.9, 0.99]
    exp = tail.max_quantiles(rng.exponential(10.0, size=(1, 20_000)), nodes, qs)[0]
    for got, q in zip(exp, qs, strict=True):
        assert got == pytest.approx(exp_max_quantile(q, nodes, 10.0), rel=0.06), (q, nodes)
    uni = tail.max_quantiles(rng.uniform(0.0, 1.0, size=(1, 20_000)), nodes, qs)[0]
    for got, q in zip(uni, qs, strict=True):
        assert got == pytest.approx(q ** (1.0 / nodes), abs=0.01), (q, nodes)  # max of N U(0,1): Beta(N, 1)
    # E[max of N Exp(1)] is the harmonic number H_N.
    expected = tail.expected_max(rng.exponential(1.0, size=(1, 20_000)), nodes)[0]
    assert expected == pytest.approx(sum(1.0 / k for k in range(1, nodes + 1)), rel=0.05)


def test_past_the_sample_the_tail_is_extrapolated_and_the_interval_still_covers_the_truth() -> None:
    rng = np.random.default_rng(3)
    fit = a_fit("argo", 30.0 + rng.exponential(20.0, size=120), overhead=5.0)
    rows = project_path(fit, [2, 32], [0.5, 0.9])
    small, big = rows
    assert not small.gang_ready["p50"].extrapolated and big.gang_ready["p90"].extrapolated
    # n=120 samples: p90 of 32 nodes is the per-node 0.9967 quantile, past the largest sample.
    assert big.gang_ready["p90"].value > 5.0 + float(np.max(fit.ready_s))
    for row in rows:
        for q, e in row.gang_ready.items():
            truth = 5.0 + 30.0 + exp_max_quantile(float(q[1:]) / 100, row.nodes, 20.0)
            assert e.low <= truth <= e.high, (row.nodes, q, e, truth)
            assert e.low <= e.value <= e.high
    # The interval widens as the projection leaves the measured range.
    assert (big.gang_ready["p90"].high - big.gang_ready["p90"].low
            > small.gang_ready["p90"].high - small.gang_ready["p90"].low)


def test_straggler_waste_is_n_g_times_the_expected_gap_to_the_slowest() -> None:
    rng = np.random.default_rng(5)
    fit = a_fit("kfp", rng.exponential(60.0, size=4000), price=3.6)
    for row in project_path(fit, [1, 4, 16], [0.5], resamples=50):
        gap = 60.0 * (sum(1.0 / k for k in range(1, row.nodes + 1)) - 1.0)  # E[max] - E[own], Exp(60)
        assert row.cost_usd["straggler_waste"].value == pytest.approx(row.gpus * gap * 3.6 / 3600, rel=0.06, abs=1e-3)
        assert row.cost_usd["compute"].value == pytest.approx(row.gpus * 3.6, rel=1e-9)


def test_too_few_samples_for_p99_is_refused_in_one_line() -> None:
    fit = a_fit("mlflow", np.arange(40, dtype=float))
    with pytest.raises(InputError) as info:
        project_path(fit, [8], [0.5, 0.99])
    assert str(info.value) == ("path mlflow: 40 node samples, too few for p99 (needs 100); measure more gang "
                               "runs or leave p99 out of --quantiles")
    assert project_path(fit, [8], [0.5, 0.9])  # p90 needs 10


def test_the_flip_lies_where_the_monthly_costs_cross() -> None:
    rng = np.random.default_rng(11)
    ready = 60.0 + rng.exponential(30.0, size=200)
    sizes = [1, 2, 4, 8, 16, 32]
    # argo: $2000/month of control plane, nothing extra a node; kfp: none, but 300 s more billed per node.
    argo = project_path(a_fit("argo", ready), sizes, [0.5], resamples=400)
    kfp = project_path(a_fit("kfp", ready, billed=300.0), sizes, [0.5], resamples=400)
    result = flip({"argo": argo, "kfp": kfp}, ("argo", "kfp"), runs_per_month=100, control_plane={"argo": 2000.0})
    # kfp's extra: 100 runs x G GPUs x 300 s x $2/h = 16.67 G dollars a month; equal at G = 120.
    assert result["flip_gpus"] == pytest.approx(120.0, rel=0.02)
    low, high = result["ci"]
    assert low is not None and high is not None and low <= result["flip_gpus"] <= high
    assert result["sentence"].startswith("kfp is cheaper per month below ~120 GPUs and argo above")
    none = flip({"argo": argo, "kfp": kfp}, ("argo", "kfp"), runs_per_month=100, control_plane={})
    assert none["flip_gpus"] is None and none["sentence"].startswith("no flip in range (8-256 GPUs): argo")


def test_fit_refuses_a_single_run_and_mixed_gpus_per_node() -> None:
    node = NodeTimes(ready_s=10.0)
    gang = MeasuredGang(path="argo", run="r1", nodes=(node, node), overhead_s=1.0, first_step_s=1.0, train_s=5.0,
                        gpus_per_node=8, price_per_gpu_hour=1.0)
    with pytest.raises(InputError, match=r"^path argo: 1 measured gang run\(s\), need at least 2 to resample$"):
        fit_paths([gang])
    other = MeasuredGang(**{**gang.__dict__, "run": "r2", "gpus_per_node": 4})
    with pytest.raises(InputError, match="GPUs per node; say --gpus-per-node"):
        fit_paths([gang, other])
    assert fit_paths([gang, other], gpus_per_node=8)["argo"].gpus_per_node == 8


def _project(*args: str) -> object:
    dumps = ["--pods", str(EXAMPLES / "pods.json"), "--nodes-dump", str(EXAMPLES / "nodes.json"),
             "--events", str(EXAMPLES / "events.json")]
    return CliRunner().invoke(main, ["cluster", "plan", "project", *dumps, *args])


@pytest.mark.parametrize(("args", "line"), [
    (["--nodes", "0,2"], "llmpack: error: --nodes '0,2': every value must be 1 or more"),
    (["--gpus", "64,100", "--gpus-per-node", "8"], "llmpack: error: --gpus 100: not a multiple of --gpus-per-node 8"),
    (["--paths", "argo,kfp"], "llmpack: error: path 'kfp': no measured gangs of it (measured: argo, mlflow)"),
    (["--quantiles", "50,100"],
     "llmpack: error: --quantiles '50,100': percentiles must be between 0 and 100 (e.g. 50,90,99)"),
    (["--quantiles", "50,99.9"],
     "llmpack: error: path argo: 104 node samples, too few for p99.9 (needs 1000); measure more "
     "gang runs or leave p99.9 out of --quantiles"),
])
def test_bad_input_is_one_line_and_exit_2(args: list[str], line: str) -> None:
    res = _project(*args)
    assert res.exit_code == 2 and res.output.strip().splitlines() == [line], res.output


def test_no_source_and_a_dump_without_gangs_are_one_line(tmp_path: Path) -> None:
    res = CliRunner().invoke(main, ["cluster", "plan", "project"])
    assert res.exit_code == 2 and len(res.output.strip().splitlines()) == 1 and "--run-group" in res.output
    empty = tmp_path / "pods.json"
    empty.write_text(json.dumps({"items": [{"metadata": {"name": "p", "namespace": "x",
                                                         "labels": {"llmpack.io/step": "finetune"}}}]}))
    res = CliRunner().invoke(main, ["cluster", "plan", "project", "--pods", str(empty)])
    assert res.exit_code == 2 and res.output.strip().splitlines() == [
        f"llmpack: error: {empty}: no TrainJob node pods (label jobset.sigs.k8s.io/jobset-name): "
        "no gang to project from"]


@pytest.fixture(scope="module")
def projected(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    """One ``llmpack project --json --out`` of the committed example dumps (module-wide: it is the slow part)."""
    out = tmp_path_factory.mktemp("projection") / "out"
    res = _project("--nodes", "1,2,4,8,16,32", "--paths", "argo,mlflow", "--control-plane-cost", "mlflow=3000",
                   "--json", "--out", str(out))
    assert res.exit_code == 0, res.output
    return json.loads(res.output), out


def test_the_example_dumps_project_to_json_with_intervals(projected: tuple[dict, Path]) -> None:
    out, _ = projected
    assert set(out) == {"method", "paths", "flip", "summary"} and list(out["paths"]) == ["argo", "mlflow"]
    argo = out["paths"]["argo"]
    assert argo["fit"]["node_samples"] == 104 and argo["fit"]["gang_sizes"] == [4] and argo["fit"]["gpus_per_node"] == 8
    rows = argo["projections"]
    assert [r["nodes"] for r in rows] == [1, 2, 4, 8, 16, 32] and [r["gpus"] for r in rows] == [8, 16, 32, 64, 128, 256]
    for r in rows:
        assert set(r["gang_ready_s"]) == {"p50", "p90", "p99"}
        assert set(r["cost_usd"]) == {"compute", "straggler_waste", "overhead", "total"}
        for e in (*r["gang_ready_s"].values(), *r["cost_usd"].values()):
            assert e["ci"][0] <= e["value"] <= e["ci"][1], r
    # Gang ready grows with the gang; the p99 of 32 nodes is past 104 samples, the p50 of 1 is not.
    medians = [r["gang_ready_s"]["p50"]["value"] for r in rows]
    assert medians == sorted(medians) and medians[-1] > medians[0]
    assert rows[-1]["gang_ready_s"]["p99"]["extrapolated"] and not rows[0]["gang_ready_s"]["p50"]["extrapolated"]
    assert rows[0]["cost_usd"]["straggler_waste"]["value"] == 0  # one node waits for no one
    assert out["flip"]["paths"] == ["argo", "mlflow"] and out["flip"]["gpus"] == [8, 16, 32, 64, 128, 256]
    assert out["summary"][-1] == out["flip"]["sentence"]


def test_the_out_directory_has_the_charts_json_and_page_within_80_columns(projected: tuple[dict, Path]) -> None:
    result, out = projected
    for name in ("gang_ready.png", "cost_per_run.png", "projection.json", "index.html"):
        assert (out / name).stat().st_size > 0
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temporary left behind
    assert json.loads((out / "projection.json").read_text()) == result
    page = (out / "index.html").read_text()
    table = page.split("<pre>", 1)[1].split("</pre>", 1)[0]
    assert "ready p50" in table and max(len(line) for line in table.splitlines()) <= 80
