"""Verdicts only beyond noise: the bootstrap on synthetic data (a planted difference is found; none is not invented)."""

from __future__ import annotations

import random

import pytest

from llmpack.compare import stats
from llmpack.compare.comparison import comparison
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
    assert result["baseline"] == "direct" and "per-round differences" in result["verdict_method"]
    argo = result["verdicts"]["time_to_first_step_s"]["argo"]
    assert set(argo) >= {"value", "delta", "ci", "confidence", "margin", "n", "n_baseline", "verdict", "text"}
    assert argo["verdict"] == "slower" and argo["n"] == 5 and argo["ci"][0] <= 3.0 <= argo["ci"][1]
    assert argo["ci"][0] > 0 and argo["confidence"] == pytest.approx(0.95)  # --repeats 5: one look, the whole 5%
    assert "95% CI" in argo["text"] and "5 rounds" in argo["text"]
    for orch in ("kfp", "mlflow"):
        for metric, per_path in result["verdicts"].items():
            assert per_path[orch]["verdict"] in ("equivalent", "undecided"), (orch, metric, per_path[orch])
    # 0.15 s of noise on starts of ~2-5 s: well inside the 25% margin, so equivalent, not merely "no difference"
    assert result["verdicts"]["time_to_first_step_s"]["kfp"]["verdict"] == "equivalent"
    assert result["verdicts"]["cost_usd"]["direct"]["verdict"] == "baseline"


def test_no_injection_names_no_winner_and_cluster_has_no_default_baseline() -> None:
    result = comparison("rg-synthetic", ["direct", "kfp", "argo", "mlflow"], runs(seed=3))
    for per_path in result["verdicts"].values():
        for orch, e in per_path.items():
            assert e["verdict"] in ("baseline", "equivalent", "undecided"), (orch, e)
    cluster = comparison("rg-c", ["kfp", "argo"], runs({"argo": 3.0}, paths=("kfp", "argo")))
    assert cluster["baseline"] is None
    assert {e["verdict"] for p in cluster["verdicts"].values() for e in p.values()} == {"no baseline"}
    named = comparison("rg-c", ["kfp", "argo"], runs({"argo": 3.0}, paths=("kfp", "argo")), baseline="kfp")
    assert named["verdicts"]["time_to_first_step_s"]["argo"]["verdict"] == "slower"


def test_one_run_per_path_is_undecided_and_says_what_would_decide() -> None:
    result = comparison("rg-1", ["direct", "argo"], runs({"argo": 3.0}, n=1, paths=("direct", "argo")))
    e = result["verdicts"]["time_to_first_step_s"]["argo"]
    assert e["verdict"] == "undecided" and e["ci"] is None and e["delta"] is not None and e["delta"] > 1.5
    assert "--repeats 5" in e["text"]


def test_a_narrower_margin_turns_equivalent_into_undecided() -> None:
    from llmpack.compare.comparison import parse_margins

    rs = runs(seed=3)
    wide = comparison("rg-m", ["direct", "kfp"], [r for r in rs if r["orchestrator"] in ("direct", "kfp")])
    narrow = comparison("rg-m", ["direct", "kfp"], [r for r in rs if r["orchestrator"] in ("direct", "kfp")],
                        margins=parse_margins("ttfs=0.01s"))
    assert wide["verdicts"]["time_to_first_step_s"]["kfp"]["verdict"] == "equivalent"
    assert narrow["verdicts"]["time_to_first_step_s"]["kfp"]["verdict"] == "undecided"
    assert narrow["verdicts"]["time_to_first_step_s"]["kfp"]["margin"] == pytest.approx(0.01)


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
