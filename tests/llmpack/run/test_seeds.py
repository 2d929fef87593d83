"""A spread, not a point (issue 48): ``llmpack run --seeds N``'s runs, the mean and 95% interval over them, and the
quality gate on the interval's lower end (components.serving.spread, llmpack.run.seeds)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from components import settings
from components.errors import InputError
from components.serving.spread import gate_passed, interval, spread_gate
from llmpack.run.local import RunOptions
from llmpack.run.seeds import aggregate, run_seeds, seed_list, spread_lines


def test_the_interval_is_students_t_over_the_seeds() -> None:
    iv = interval([0.1, 0.2, 0.3])  # mean 0.2, sd 0.1: half-width t(0.975, 2) 4.303 * 0.1 / sqrt(3)
    assert iv.n == 3 and iv.mean == pytest.approx(0.2)
    assert (iv.low, iv.high) == pytest.approx((0.2 - 4.303 * 0.1 / math.sqrt(3), 0.2 + 4.303 * 0.1 / math.sqrt(3)))
    assert interval([0.5]).low == interval([0.5]).high == 0.5  # one seed: a point
    assert interval([0.0, 0.0, 0.0]).text(100, "%") == "0.0% (95% interval 0.0%..0.0%, 3 seeds)"


def test_the_gate_over_seeds_needs_the_lower_end_above_min_improvement() -> None:
    assert spread_gate([0.30, 0.32, 0.31], 0.0)[0]  # tight and well above 0
    passed, line = spread_gate([0.0, 0.0, 0.6], 0.0)  # one lucky seed: mean 0.2, interval reaches below 0
    assert not passed
    assert line.startswith("quality gate over 3 seeds: failed: improvement +0.2000 (95% interval -0.6")
    assert not spread_gate([0.0, 0.0, 0.0], 0.0)[0]  # no improvement at all is not an improvement
    assert spread_gate([0.0], 0.0)[0]  # one seed: the single run's gate (>=)


def test_register_gates_on_the_interval_when_earlier_seeds_are_given() -> None:
    evaluation = {"passed": True, "gate_metric": "exact_match", "base_exact_match": 0.1, "tuned_exact_match": 0.7,
                  "min_improvement": 0.0}
    assert gate_passed(evaluation, env={})  # no earlier seeds: the run's own gate
    env = {settings.SEED_IMPROVEMENTS.name: "0.0,0.0"}
    assert not gate_passed(evaluation, env=env)  # 0, 0, 0.6: the interval reaches below 0
    assert gate_passed(evaluation, env={settings.SEED_IMPROVEMENTS.name: "0.58,0.61"})
    assert not gate_passed({**evaluation, "passed": False}, env={settings.SEED_IMPROVEMENTS.name: "0.58,0.61"})
    assert not gate_passed(evaluation, env={settings.SEED_IMPROVEMENTS.name: "0.58,0.61"}, own=False)  # recomputed
    assert not gate_passed({**evaluation, "tuned_exact_match": None}, env={settings.SEED_IMPROVEMENTS.name: "0.6"})
    with pytest.raises(InputError, match="LLMPACK_SEED_IMPROVEMENTS: 'nan' is not a finite number"):
        gate_passed(evaluation, env={settings.SEED_IMPROVEMENTS.name: "0.1,nan"})


def _summary(seed: int, base: float, tuned: float, status: str = "succeeded") -> dict[str, Any]:
    metrics = {"base_exact_match": base, "tuned_exact_match": tuned, "gate_improvement": tuned - base,
               "base_eval_loss": 2.0, "eval_loss": 1.0} if status == "succeeded" else {}
    return {"status": status, "params": {"seed": seed}, "metrics": metrics}


def test_each_seed_runs_once_in_one_group_and_only_the_last_may_promote(tmp_path: Path) -> None:
    assert seed_list(5, 3) == [5, 6, 7]
    seen: list[tuple[RunOptions, dict[str, str] | None]] = []
    tuned = {5: 0.2, 6: 0.3, 7: 0.25}

    def run_one(o: RunOptions, env: dict[str, str] | None) -> dict[str, Any]:
        seen.append((o, env))
        return _summary(o.seed, 0.0, tuned[o.seed])

    opts = RunOptions(backend="direct", seed=5, output_dir=tmp_path, params={"lr": 0.001})
    summaries = run_seeds(opts, 3, run_one)
    assert [o.seed for o, _ in seen] == [5, 6, 7] and len(summaries) == 3
    assert len({o.run_group for o, _ in seen}) == 1 and seen[0][0].run_group  # one run group: one report
    assert [o.params.get("promote", True) for o, _ in seen] == [False, False, True]
    assert all(o.params["lr"] == 0.001 for o, _ in seen)
    assert [env for _, env in seen[:2]] == [None, None]
    assert seen[2][1] == {settings.SEED_IMPROVEMENTS.name: "0.2,0.3"}


def test_the_spread_is_stated_and_a_failed_seed_counted() -> None:
    agg = aggregate([_summary(0, 0.0, 0.2), _summary(1, 0.0, 0.3), _summary(2, 0.0, 0.25),
                     _summary(3, 0.0, 0.0, status="failed")], min_improvement=0.0)
    assert (agg["succeeded"], agg["failed"], agg["seeds"]) == (3, 1, [0, 1, 2, 3])
    assert agg["tuned_exact_match"]["mean"] == pytest.approx(0.25)
    assert agg["gate"]["passed"]
    lines = spread_lines(agg)
    assert lines[0].startswith("over 3 seeds (0,1,2,3), 1 failed: exact match on unseen prompts base 0.0% "
                               "(95% interval 0.0%..0.0%) -> tuned 25.0% (95% interval 12.6%..37.4%)")
    assert lines[1].startswith("quality gate over 3 seeds: passed")


def test_run_seeds_zero_is_refused_in_one_line(tmp_path: Path) -> None:
    from tests.conftest import llmpack

    r = llmpack("run", "--seeds", "0", cwd=tmp_path, timeout=120)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "--seeds" in r.stderr, r.stderr


def test_run_seeds_prints_each_seed_then_the_spread_and_fails_on_the_gate(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    import llmpack.run.show as display
    from llmpack.cli import main

    def fake(opts: RunOptions, label: str, **kw: Any) -> dict[str, Any]:
        return {**_summary(opts.seed, 0.0, 0.0), "artifacts": {}}  # the tiny model: 0% on unseen prompts

    monkeypatch.setattr(display, "run_with_progress", fake)
    r = CliRunner().invoke(main, ["run", "--seeds", "3", "--output-dir", str(tmp_path)])
    lines = r.output.strip().splitlines()
    assert [line.split(":")[0] for line in lines[:3]] == ["seed 0", "seed 1", "seed 2"]
    assert lines[3] == ("over 3 seeds (0,1,2): exact match on unseen prompts base 0.0% (95% interval 0.0%..0.0%) "
                        "-> tuned 0.0% (95% interval 0.0%..0.0%)")
    assert lines[4].startswith("quality gate over 3 seeds: failed")
    assert r.exit_code == 1
