"""``llmpack report --run-group``'s rebuild of a compare (llmpack.compare.rebuilt): for each design of compare, the
same verdict, undecided list, `to decide:` command and report.json keys as the compare's own (trial 11)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from llmpack.compare.command import argv_tag
from llmpack.compare.comparison import comparison
from llmpack.compare.outcome import OUTCOME_TAG, outcome_tag, read_outcome
from llmpack.compare.rebuilt import rebuilt_comparison
from llmpack.compare.recommend import recommend
from llmpack.compare.until_decided import Path_, compare_until_decided
from llmpack.run.local import RunOptions
from tests.conftest import llmpack
from tests.llmpack.compare.test_until_decided import FakeRuns
from tests.synthetic_runs import runs as planted_runs

PATHS = [Path_(backend=b, fuse="none") for b in ("direct", "kfp", "argo", "mlflow")]
NAMES = [p.backend for p in PATHS]
# the keys a compare until decided writes beyond the verdicts (docs/cli.md#llmpack-report)
UNTIL_DECIDED_KEYS = ("recommendation", "design", "rounds", "stopped", "budget_s", "budget_adapted", "elapsed_s",
                      "plan", "max_steps", "repeats", "warmup", "argv", "baseline", "margins", "verdicts", "failed")


def _live(argv: list[str], *, budget_s: float, adapt: bool = False, noise: float = 0.8, seed: int = 2) -> dict:
    """A compare until decided (stand-in runs) as `llmpack compare` ends it: its flags, its recommendation."""
    fake = FakeRuns({"direct": 7.0, "kfp": 7.6, "argo": 7.0, "mlflow": 7.0}, noise=noise, seed=seed)
    live = compare_until_decided(RunOptions(), PATHS, run=fake, run_group="rg-rb", baseline="direct",
                                 budget_s=budget_s, say=lambda line: None, clock=fake.clock, adapt=adapt)
    live["argv"] = argv
    live["recommendation"] = recommend(live).as_dict()
    return live


def _as_stored(live: dict, *, outcome: bool = True) -> list[dict[str, Any]]:
    """The runs as runs_from_mlflow gives them back: metrics and tags (the flags, and how the compare ended)."""
    tags = {**argv_tag(live["argv"]), **(outcome_tag(live) if outcome else {})}
    return [{k: v for k, v in r.items() if k not in ("startup", "wall_s", "round")} | {"tags": {**r["tags"], **tags}}
            for r in live["runs"]]


def _same(live: dict, again: dict, keys: tuple[str, ...]) -> None:
    for key in keys:
        assert json.loads(json.dumps(again.get(key), default=str)) == json.loads(json.dumps(live.get(key))), key
    assert set(live) - {"runs"} <= set(again), set(live) - set(again)
    assert "not_recorded" not in again, again.get("not_recorded")


def test_a_one_round_budget_compare_is_rebuilt_with_its_design_budget_and_to_decide() -> None:
    """Trial 11: after `llmpack compare --budget 30s --max-steps 10` (round 1 alone), the rebuilt report said
    `--repeats 2` and "total and cost per run" undecided where the compare said `--budget 180s`, and lacked
    budget_s, elapsed_s, max_steps, plan, stopped and budget_adapted, with not_recorded null."""
    live = _live(["--budget", "30s", "--max-steps", "120"], budget_s=30.0)
    assert live["rounds"] == 1 and live["stopped"] == "budget" and "--budget" in live["recommendation"]["command"]
    again = rebuilt_comparison("rg-rb", NAMES, _as_stored(live))
    _same(live, again, UNTIL_DECIDED_KEYS)
    assert "total" not in again["recommendation"]["text"]


def test_a_multi_round_compare_with_a_raised_budget_is_rebuilt_alike() -> None:
    live = _live([], budget_s=110.0, adapt=True)
    assert live["rounds"] >= 3 and live["budget_adapted"] and live["budget_adapted"]["to_s"] > 110.0
    again = rebuilt_comparison("rg-rb", NAMES, _as_stored(live))
    _same(live, again, UNTIL_DECIDED_KEYS)


def test_a_repeats_compare_is_rebuilt_alike_and_one_stopped_early_says_so() -> None:
    runs = planted_runs({"kfp": -1.0}, n=3, paths=("direct", "kfp"))
    for extra in ({}, {"rounds": 2, "stopped": "failed", "stopped_why": "step 'x' failed: boom",
                       "injected_start_delay_s": {"kfp": 2.0}}):
        argv = ["--repeats", "3", "--backends", "direct,kfp"]
        live = comparison("rg-r", ["direct", "kfp"], runs, repeats=3, warmup=1, argv=argv, **extra)
        live["recommendation"] = recommend(live).as_dict()
        again = rebuilt_comparison("rg-r", ["direct", "kfp"], _as_stored(live))
        _same(live, again, ("recommendation", "repeats", "warmup", "argv", "verdicts", "design", *extra))
        assert again["design"] is None and "budget_s" not in again and "plan" not in again


def test_runs_without_the_outcome_tag_say_what_they_cannot_tell() -> None:
    """A compare older than the outcome tag (or whose store refused it): a given --budget is its budget, never
    raised; the rest null, each with its reason, and not the appearance of the compare's own values."""
    live = _live(["--budget", "30s"], budget_s=30.0)
    again = rebuilt_comparison("rg-rb", NAMES, _as_stored(live, outcome=False))
    assert again["budget_s"] == 30.0 and again["budget_adapted"] is None and again["rounds"] == 1
    assert set(again["not_recorded"]) == {"design", "elapsed_s", "max_steps", "plan", "stopped"}
    assert all(again[k] is None for k in again["not_recorded"])
    assert "judged as fixed rounds" in again["not_recorded"]["design"]
    multi = _live([], budget_s=600.0)  # start-up rounds carry design, budget and --max-steps; not the rest
    again = rebuilt_comparison("rg-rb", NAMES, _as_stored(multi, outcome=False))
    assert (again["design"], again["budget_s"], again["max_steps"]) == \
        (multi["design"], multi["budget_s"], multi["max_steps"])
    assert set(again["not_recorded"]) == {"budget_adapted", "elapsed_s", "plan", "stopped"}


def test_an_outcome_tag_is_store_data_bounded_and_checked() -> None:
    live = _live(["--budget", "30s"], budget_s=30.0)
    tag = outcome_tag({**live, "stopped_why": "x" * 10_000})
    assert len(tag[OUTCOME_TAG]) <= 4000
    hostile = [{"tags": {OUTCOME_TAG: t}} for t in ('{"rounds": -3, "budget_s": "1e999", "plan": [1], '
                                                    '"stopped": "a;rm -rf", "elapsed_s": 12.5}',)]
    assert read_outcome(hostile) == {"elapsed_s": 12.5}
    assert read_outcome([{"tags": {OUTCOME_TAG: "[1, 2]"}}]) is None
    assert read_outcome([{"tags": {OUTCOME_TAG: '{"rounds": 1}'}}, {"tags": {OUTCOME_TAG: '{"rounds": 2}'}}]) is None
    secret = outcome_tag({"stopped_why": "http://u:Sx9pQ2mZ7tRw@127.0.0.1:5000 refused", "stopped": "failed"})
    assert "Sx9pQ2mZ7tRw" not in secret[OUTCOME_TAG]


@pytest.mark.slow  # a real compare: warm-up and round 1 of the whole pipeline on two paths (~50 s on 2 cores)
def test_a_real_one_round_compare_and_its_rebuilt_report_say_the_same(tmp_path: Path,
                                                                       fresh_tracking_uri: str) -> None:
    """Trial 11, end to end: `llmpack compare --budget 10s` stops after round 1; `llmpack report --run-group` of its
    group writes a report.json with the compare's verdicts, recommendation (`to decide: ... --budget`) and keys."""
    r = llmpack("compare", "--backends", "direct,kfp", "--budget", "10s", "--max-steps", "2", "--json",
                "--report", str(tmp_path / "live"), "--tracking-uri", fresh_tracking_uri, cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    live = json.loads((tmp_path / "live" / "report.json").read_text())
    assert live["rounds"] == 1 and live["stopped"] == "budget" and live["design"] is not None
    again_run = llmpack("report", "--run-group", live["run_group"], "--tracking-uri", fresh_tracking_uri,
                        "--out", str(tmp_path / "again"), cwd=tmp_path, timeout=600)
    assert again_run.returncode == 0, again_run.stderr[-3000:]
    again = json.loads((tmp_path / "again" / "report.json").read_text())
    assert set(again) == set(live), set(again) ^ set(live)  # not_recorded absent: everything was recorded
    for key in sorted(set(live) - {"runs"}):
        assert again[key] == live[key], key
    assert "--budget" in (again["recommendation"]["command"] or "") and "total" not in again["recommendation"]["text"]
