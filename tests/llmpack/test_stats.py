"""Verdicts only beyond noise: the bootstrap on synthetic data (a planted difference is found; none is not invented)."""

from __future__ import annotations

import random

import pytest

from llmpack import stats
from llmpack.compare import comparison
from tests.synthetic_runs import runs


def _draw(rng: random.Random, n: int, mu: float, sd: float = 0.2) -> list[float]:
    return [rng.gauss(mu, sd) for _ in range(n)]


def test_a_planted_difference_is_found_with_a_ci_that_contains_it() -> None:
    rng = random.Random(7)
    d = stats.bootstrap_median_diff(_draw(rng, 5, 13.0), _draw(rng, 5, 10.0))
    assert d.verdict == "higher" and d.ci_low is not None and d.ci_high is not None
    assert d.ci_low <= 3.0 <= d.ci_high and d.ci_low > 0
    assert stats.bootstrap_median_diff(_draw(rng, 5, 7.0), _draw(rng, 5, 10.0)).verdict == "lower"


def test_no_difference_gives_no_verdict_at_a_false_positive_rate_near_nominal() -> None:
    rng = random.Random(11)
    trials = 200
    named = sum(stats.bootstrap_median_diff(_draw(rng, 6, 10.0), _draw(rng, 6, 10.0), resamples=2000).verdict
                in ("lower", "higher") for _ in range(trials))
    assert named / trials <= 0.08, named
    same = [10.0, 10.1, 9.9, 10.05, 9.95]
    assert stats.bootstrap_median_diff(same, list(same)).verdict == "no clear difference"


def test_the_interval_is_seeded_and_reproducible() -> None:
    a, b = [1.0, 2.0, 3.5, 2.2, 2.8], [1.1, 1.9, 2.0, 2.4, 1.7]
    assert stats.bootstrap_median_diff(a, b) == stats.bootstrap_median_diff(a, b)


def test_too_few_runs_never_name_a_winner() -> None:
    assert stats.bootstrap_median_diff([20.0, 21.0, 22.0, 23.0], [1.0, 2.0, 3.0, 4.0]).verdict == "too few runs"
    d = stats.bootstrap_median_diff([5.0], [1.0])
    assert d.verdict == "too few runs" and d.ci_low is None and d.delta == pytest.approx(4.0)


def test_comparison_json_carries_value_delta_ci_n_and_verdict() -> None:
    result = comparison("rg-synthetic", ["direct", "kfp", "argo", "mlflow"], runs({"argo": 3.0}))
    assert result["baseline"] == "direct" and "bootstrap" in result["verdict_method"]
    argo = result["verdicts"]["time_to_first_step_s"]["argo"]
    assert set(argo) >= {"value", "delta", "ci95", "n", "n_baseline", "verdict", "text"}
    assert argo["verdict"] == "slower" and argo["n"] == 5 and argo["ci95"][0] <= 3.0 <= argo["ci95"][1]
    assert argo["ci95"][0] > 0
    for orch in ("kfp", "mlflow"):
        for metric, per_path in result["verdicts"].items():
            assert per_path[orch]["verdict"] == "no clear difference", (orch, metric, per_path[orch])
    assert result["verdicts"]["cost_usd"]["direct"]["verdict"] == "baseline"


def test_no_injection_names_no_winner_and_cluster_has_no_default_baseline() -> None:
    result = comparison("rg-synthetic", ["direct", "kfp", "argo", "mlflow"], runs(seed=3))
    for per_path in result["verdicts"].values():
        for orch, e in per_path.items():
            assert e["verdict"] in ("baseline", "no clear difference"), (orch, e)
    cluster = comparison("rg-c", ["kfp", "argo"], runs({"argo": 3.0}, paths=("kfp", "argo")))
    assert cluster["baseline"] is None
    assert {e["verdict"] for p in cluster["verdicts"].values() for e in p.values()} == {"no baseline"}
    named = comparison("rg-c", ["kfp", "argo"], runs({"argo": 3.0}, paths=("kfp", "argo")), baseline="kfp")
    assert named["verdicts"]["time_to_first_step_s"]["argo"]["verdict"] == "slower"


def test_one_run_per_path_is_too_few_for_any_verdict() -> None:
    result = comparison("rg-1", ["direct", "argo"], runs({"argo": 3.0}, n=1, paths=("direct", "argo")))
    assert result["verdicts"]["time_to_first_step_s"]["argo"]["verdict"] == "too few runs"


def test_the_median_ci_of_paired_ratios_holds_the_median_and_narrows_with_more_rounds() -> None:
    rng = random.Random(3)
    few = [0.6 + rng.gauss(0, 0.05) for _ in range(5)]
    many = [0.6 + rng.gauss(0, 0.05) for _ in range(40)]
    lo_few, hi_few = stats.bootstrap_median_ci(few)
    lo_many, hi_many = stats.bootstrap_median_ci(many)
    assert lo_few <= sorted(few)[2] <= hi_few and lo_many < 0.6 < hi_many
    assert hi_many - lo_many < hi_few - lo_few
    assert stats.bootstrap_median_ci(many) == (lo_many, hi_many)  # seeded
    assert stats.bootstrap_median_ci([0.5]) is None
