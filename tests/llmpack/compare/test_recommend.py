"""The compare's last word: a recommendation checked against planted differences, or the command that decides."""

from __future__ import annotations

import math
import shlex

import pytest

from llmpack.compare.comparison import comparison
from llmpack.compare.recommend import recommend, verdict_word
from llmpack.compare.until_decided import Path_, adapt_budget, compare_until_decided
from llmpack.run.local import RunOptions
from tests.llmpack.compare.test_until_decided import FakeRuns
from tests.synthetic_runs import runs as planted_runs

PATHS = [Path_(backend=b, fuse="none") for b in ("direct", "kfp", "argo", "mlflow")]


def _until_decided(start: dict[str, float], *, budget_s: float = 600.0, seed: int = 0, noise: float = 0.1,
                   **kw: object) -> dict:
    fake = FakeRuns(start, seed=seed, noise=noise)
    return compare_until_decided(RunOptions(), PATHS, run=fake, run_group="rg-rec", baseline="direct",
                                 budget_s=budget_s, say=lambda line: None, clock=fake.clock, **kw)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("slowed", ["direct", "kfp", "argo", "mlflow"])
def test_a_path_slowed_by_3_s_is_never_recommended(slowed: str, seed: int) -> None:
    start = {p.backend: 7.0 for p in PATHS}
    start[slowed] += 3.0
    rec = recommend(_until_decided(start, seed=seed))
    assert rec.path is not None and rec.path != slowed, rec.text
    assert "time to first step" in rec.text and "CI" in rec.text and rec.command is None
    if slowed != "direct":  # the others are equivalent to direct: keep the baseline, and say why
        assert rec.text.startswith(f"use direct: {slowed} is slower by") and "equivalent" in rec.text
        assert rec.caveat is not None and "not judged" in rec.caveat  # total and cost: one run each
    else:  # three paths faster than direct: the largest difference named, the caveat says they were not paired
        assert "not compared with each other" in (rec.caveat or "")


def test_a_path_faster_by_2_s_is_recommended_with_its_interval() -> None:
    rec = recommend(_until_decided({"direct": 9.0, "kfp": 7.0, "argo": 9.0, "mlflow": 12.0}))
    assert rec.path == "kfp" and rec.text.startswith("use kfp: faster than direct on time to first step by ")
    assert "% CI -" in rec.text and "100% CI" not in rec.text  # a level below 1 never rounds to 100%


def test_fixed_repeats_judged_with_planted_runs() -> None:
    """``--repeats`` results (tests/synthetic_runs) recommend on the same rule: argo +3 s is never named."""
    result = comparison("rg-s", ["direct", "kfp", "argo", "mlflow"], planted_runs({"argo": 3.0}, n=5))
    rec = recommend(result)
    assert rec.path in ("direct", "kfp", "mlflow") and "argo is slower by" in rec.text


def test_undecided_ends_with_the_command_that_would_decide() -> None:
    """Noise far above the margin within a small budget: no recommendation, a --budget computed from the rounds."""
    result = _until_decided({"direct": 7.0, "kfp": 7.6, "argo": 7.0, "mlflow": 7.0}, budget_s=150.0, noise=1.5, seed=4)
    result["argv"] = ["--backends", "direct,kfp,argo,mlflow", "--budget", "150", "--report", "x"]
    rec = recommend(result)
    assert rec.path is None and rec.text.startswith("no recommendation yet: undecided after")
    argv = shlex.split(rec.command)
    assert argv[:2] == ["llmpack", "compare"] and "--report" not in argv and argv.count("--budget") == 1
    budget = argv[argv.index("--budget") + 1]
    seconds = float(budget[:-1]) * (60 if budget.endswith("m") else 1)
    plan = result["plan"]
    need = max(e["rounds_to_decide"] for v in result["verdicts"].values() for e in v.values()
               if e.get("rounds_to_decide") and e["verdict"] == "undecided")
    assert seconds >= plan["before_rounds_s"] + (need - 1) * plan["round_s"] > 150.0
    assert "rounds at" in rec.why_command


def test_a_slow_first_round_raises_the_budget_and_says_so() -> None:
    assert adapt_budget(285.0, 100.0, 30.0) is None  # 3 rounds fit
    raised = adapt_budget(285.0, 300.0, 40.0)
    assert raised is not None and raised["to_s"] >= 300.0 + 2 * 40.0 and "this machine is slow" in raised["text"]
    too_slow = adapt_budget(285.0, 560.0, 100.0)
    assert too_slow is not None and too_slow["to_s"] == 285.0 and "what would decide" in too_slow["text"]
    lines: list[str] = []
    fake = FakeRuns({"direct": 7.0, "kfp": 7.0, "argo": 10.0, "mlflow": 7.0})
    result = compare_until_decided(RunOptions(), PATHS, run=fake, run_group="rg-slow", baseline="direct",
                                   budget_s=110.0, say=lines.append, clock=fake.clock, adapt=True)
    assert lines[0].startswith("this machine is slow") and result["budget_adapted"]["to_s"] > 110.0
    assert result["rounds"] >= 3


def test_one_run_each_reads_not_judged_in_the_compare_and_a_rebuilt_report_alike() -> None:
    fake = FakeRuns({"direct": 7.0, "kfp": 7.0, "argo": 10.0, "mlflow": 7.0})
    result = compare_until_decided(RunOptions(), PATHS, run=fake, run_group="rg-w", baseline="direct",
                                   budget_s=600.0, say=lambda line: None, clock=fake.clock)
    rebuilt = comparison("rg-w", [p.backend for p in PATHS], [{**r, "round": None} for r in result["runs"]])
    for res in (result, rebuilt):
        total = res["verdicts"]["total_s"]["kfp"]
        assert verdict_word(total) == "not judged" and "not judged" in total["text"]


def test_faster_but_decidedly_costlier_is_not_recommended() -> None:
    """kfp starts 2 s sooner but costs decidedly more (fixed --repeats): the baseline, and why."""
    runs = planted_runs({"kfp": -1.5}, n=6, paths=("direct", "kfp"))
    for r in runs:
        if r["orchestrator"] == "kfp":
            r["metrics"]["cost_usd"] *= 3
    rec = recommend(comparison("rg-c", ["direct", "kfp"], runs))
    assert rec.path == "direct" and "kfp is faster on" in rec.text and "costlier on cost per run" in rec.text


def _undecided_result(rounds: dict[str, int], plan: dict | None) -> dict:
    """Every path undecided on both start-up headlines, ``rounds[path]`` rounds from deciding."""
    from llmpack.compare.comparison import HEADLINES

    paths = ["direct", *rounds]
    verdicts = {}
    for h in HEADLINES:
        per = {"direct": {"verdict": "baseline", "n": 3}}
        for p, k in rounds.items():
            per[p] = {"verdict": "undecided", "n": 3 if h.startup else 1, "rounds": 3 if h.startup else 1,
                      "rounds_to_decide": k if h.startup else None, "delta": 1.0, "ci": None}
        verdicts[h.metric] = per
    runs = [{"orchestrator": p, "status": "succeeded", "metrics": {}, "tags": {}} for p in paths]
    return {"backends": paths, "baseline": "direct", "runs": runs, "verdicts": verdicts, "rounds": 3,
            "design": {"max_rounds": 6}, "budget_s": 285.0, "plan": plan, "argv": []}


def test_one_noisy_path_sets_the_rounds_so_the_command_offers_the_others_without_it() -> None:
    plan = {"before_rounds_s": 180.0, "round_s": 40.0,
            "path_round_s": {"direct": 10.0, "kfp": 10.0, "argo": 10.0, "mlflow": 10.0}}
    rec = recommend(_undecided_result({"kfp": 41, "argo": 8, "mlflow": 5}, plan))
    argv = shlex.split(rec.command)  # kfp needs 41 > 30 rounds: only the command without it can decide
    assert argv[argv.index("--backends") + 1] == "direct,argo,mlflow"
    assert argv[argv.index("--budget") + 1] == f"{math.ceil((180 + 7 * 30) * 1.1 / 30) * 30:.0f}s"
    assert rec.why_command.startswith("without kfp: 8 rounds")
    rec = recommend(_undecided_result({"kfp": 12, "argo": 8, "mlflow": 5}, plan))
    argv = shlex.split(rec.command)  # 12 rounds fit: every path, and the faster alternative without kfp
    assert "--backends" not in argv and "or without kfp:" in rec.why_command
    rec = recommend(_undecided_result({"kfp": 41, "argo": 41, "mlflow": 41}, plan))
    assert "--margin" in rec.command and "over 30 rounds" in rec.why_command


def test_the_report_leads_with_the_recommendation_and_sets_unjudged_figures_apart(tmp_path) -> None:
    from llmpack.report import write_report

    result = _until_decided({"direct": 7.0, "kfp": 7.0, "argo": 10.0, "mlflow": 7.0})
    for r in result["runs"]:
        r.update(submitted_at=1.7e9, events={}, retried_attempts=[])
    out = write_report(result, tmp_path / "rep", {})
    md = (out / "report.md").read_text()
    html = (out / "report.html").read_text()
    rec = recommend(result)
    assert rec.path != "argo" and md.index(rec.text.split(":")[0]) < md.index("## Verdicts")
    assert '<p class="rec"><b>use ' in html and html.index('class="rec"') < html.index('class="hero"')
    assert html.count('class="card dim"') == 2 and "Not judged (one run per path" in md


def test_nothing_judged_yet_is_one_line_of_counts_not_a_two_column_table() -> None:
    """Issue 52: with one run per path the narrow table had only ``path | n`` under a title that wrapped."""
    import io

    from rich.console import Console

    from llmpack.compare.table import compare_table

    result = comparison("rg-one", ["direct", "kfp"], planted_runs(n=1, paths=("direct", "kfp")))
    console = Console(width=80, file=io.StringIO(), force_terminal=False)
    compare_table(result, console=console)
    text = console.file.getvalue()
    assert "llmpack compare · rg-one · runs per path: direct 1 · kfp 1" in text, text
    assert "not judged (one run per path" in text and "┃" not in text and "path " not in text.split("\n")[1]
    assert max(len(line) for line in text.splitlines()) <= 80


def test_a_rebuilt_report_keeps_the_compares_pipeline_and_paths() -> None:
    """The fifth trial: `llmpack report` of a `compare --pipeline P --backends direct,argo` said `to decide:
    llmpack compare --pipeline P --repeats 3`, which runs kfp and mlflow too."""
    from llmpack.compare.rebuilt import rebuilt_argv

    runs = [{"tags": {"llmpack.pipeline_ref": "mymod:mine"}}] * 2
    assert rebuilt_argv(runs, ["direct", "argo"]) == ["--pipeline", "mymod:mine", "--backends", "direct,argo"]
    assert rebuilt_argv([{"tags": {}}], ["direct", "kfp", "argo", "mlflow"]) == []
    # trials 9 and 10: the compare's own flags, recorded on its runs, come back whole (--param, --margin...)
    from llmpack.compare.command import ARGV_TAG, argv_tag
    from llmpack.compare.rebuilt import recorded_margin

    flags = ["--pipeline", "mymod:mine", "--param", "min_len=3", "--margin", "spinup=0.001s",
             "--tracking-uri", "http://u:Sx9pQ2mZ7tRw@127.0.0.1:5000"]
    tagged = [{"tags": {**r["tags"], **argv_tag(flags)}} for r in runs]
    back = rebuilt_argv(tagged, ["direct", "argo"])
    assert back[:6] == flags[:6] and "Sx9pQ2mZ7tRw" not in " ".join(back) and recorded_margin(back) == "spinup=0.001s"
    odd = [{"tags": {ARGV_TAG: '{"not": "a list"}', "llmpack.pipeline_ref": "mymod:mine"}}]
    assert rebuilt_argv(odd, ["direct", "kfp", "argo", "mlflow"]) == ["--pipeline", "mymod:mine"]  # store data checked


def test_a_fixed_repeats_compare_asks_for_the_rounds_every_headline_needs() -> None:
    """The fifth trial: with --repeats, total needed ~9 rounds and cost ~11, yet `to decide:` said --repeats 7
    (the start-up headlines' rounds only), though every round of --repeats runs the whole pipeline."""
    from llmpack.compare.comparison import HEADLINES

    need = {"time_to_first_step_s": 7, "spinup_s": 5, "total_s": 9, "cost_usd": 11}
    verdicts = {h.metric: {"direct": {"verdict": "baseline", "n": 2, "value": 7.0},
                           "kfp": {"verdict": "undecided", "n": 2, "rounds": 2, "delta": 0.3, "value": 7.3,
                                   "rounds_to_decide": need[h.metric]}} for h in HEADLINES if h.metric in need}
    runs = [{"orchestrator": p, "status": "succeeded", "metrics": {"time_to_first_step_s": 7.0}, "tags": {}}
            for p in ("direct", "kfp")]
    rec = recommend({"backends": ["direct", "kfp"], "baseline": "direct", "runs": runs, "verdicts": verdicts,
                     "repeats": 2, "argv": ["--repeats", "2"]})
    assert rec.command is not None and rec.command.endswith("--repeats 11"), rec.command


def test_a_cluster_compare_asks_to_rerun_llmpack_cluster_compare() -> None:
    """Found on the real control plane (issue 51): after `llmpack cluster compare`, `to decide:` said `llmpack compare
    --argo-host ...`, which refuses the cluster flags."""
    from llmpack.compare.comparison import HEADLINES

    verdicts = {h.metric: {"argo": {"verdict": "baseline", "n": 2, "value": 30.0},
                           "mlflow": {"verdict": "undecided", "n": 2, "rounds": 2, "delta": -20.0, "value": 10.0,
                                      "rounds_to_decide": 4}} for h in HEADLINES}
    runs = [{"orchestrator": p, "status": "succeeded", "metrics": {"spinup_s": 9.0}, "tags": {}}
            for p in ("argo", "mlflow")]
    rec = recommend({"backends": ["argo", "mlflow"], "baseline": "argo", "runs": runs, "verdicts": verdicts,
                     "repeats": 2, "mode": "cluster", "argv": ["--backends", "argo,mlflow", "--argo-host", "h:2746"]})
    assert rec.command is not None and shlex.split(rec.command)[:3] == ["llmpack", "cluster", "compare"], rec.command
    assert rec.command.endswith("--argo-host h:2746 --repeats 4"), rec.command
    # a report rebuilt from MLflow has no `mode` of its own: its runs' (issue 51's recheck, helper-59)
    for r in runs:
        r["mode"] = "cluster"
    rebuilt = recommend({"backends": ["argo", "mlflow"], "baseline": "argo", "runs": runs, "verdicts": verdicts,
                         "repeats": 2, "argv": ["--backends", "argo,mlflow"]})
    assert rebuilt.command is not None and shlex.split(rebuilt.command)[:3] == ["llmpack", "cluster", "compare"]


def test_a_rebuilt_report_plans_the_same_budget_as_the_compare_printed() -> None:
    """Issue 52 (item 5): ``llmpack report --run-group`` of an undecided compare printed ``--budget 540s (12 rounds
    at 25 s a round)`` where the compare had printed ``--budget 15m (12 rounds at 53 s a round)``: the compare
    planned from round 1's time to first step and its clock, the rebuilt report from the start-up runs' totals.
    Both now read the runs: start-up runs' median totals, and what warm-up and round 1 took (a tag on them)."""
    result = _until_decided({"direct": 7.0, "kfp": 7.6, "argo": 7.0, "mlflow": 7.0}, budget_s=200.0, noise=0.8, seed=2)
    result["argv"] = []
    assert result["rounds"] > 1  # start-up rounds ran (a compare of round 1 alone records no design)
    as_stored = [{k: v for k, v in r.items() if k not in ("startup", "wall_s")} | {"round": None}
                 for r in result["runs"]]  # what runs_from_mlflow gives back: metrics and tags
    rebuilt = comparison("rg-rec", [p.backend for p in PATHS], as_stored, argv=[])
    live, again = recommend(result), recommend(rebuilt)
    assert live.path is None and live.command is not None and "--budget" in live.command
    assert (again.command, again.why_command.split("; or shorter")[0]) == \
        (live.command, live.why_command.split("; or shorter")[0])
    assert float(result["runs"][-1]["tags"]["llmpack.before_rounds_s"]) == result["plan"]["before_rounds_s"]


def test_the_numbers_table_gives_each_cell_its_own_n(tmp_path) -> None:
    """Issue 52 (item 7): the Numbers table read n=4 on every row while total and cost were one run's figure
    (start-up rounds count for spin-up and time to first step only) under "Cells are p50 / p90 over n runs"."""
    from llmpack.report import write_report

    result = _until_decided({"direct": 7.0, "kfp": 7.0, "argo": 10.0, "mlflow": 7.0})
    for r in result["runs"]:
        r.update(submitted_at=1.7e9, events={}, retried_attempts=[])
    out = write_report(result, tmp_path / "rep", {})
    md, html = (out / "report.md").read_text(), (out / "report.html").read_text()
    head = next(line for line in md.splitlines() if line.startswith("| orchestrator |"))
    row = next(line for line in md.splitlines() if line.startswith("| direct |"))
    cols = [c.strip() for c in head.strip("|").split("|")]
    cells = dict(zip(cols, (c.strip() for c in row.strip("|").split("|")), strict=True))
    n = int(cells["n"])
    assert n > 1 and "(n=" not in cells[next(c for c in cols if c.startswith("time to first step"))]
    assert cells[next(c for c in cols if c.startswith("total"))].endswith("(n=1)")
    assert "or the n a cell gives" in md and "or the n a cell gives" in html and "(n=1)</td>" in html


def test_a_pipeline_without_training_is_not_told_start_up_is_what_differs() -> None:
    """Trial 7: a compare of a pipeline without finetune (every round whole) said `caveat: total undecided;
    start-up is what differs between paths`, the stock line of the shipped pipeline's design."""
    from llmpack.compare.comparison import HEADLINES

    verdicts = {"spinup_s": {"direct": {"verdict": "baseline", "n": 4, "value": 0.3},
                             "argo": {"verdict": "equivalent", "n": 4, "rounds": 4, "delta": 0.01, "value": 0.31,
                                      "margin": 0.1, "ci": [-0.02, 0.03], "confidence": 0.95}},
                "total_s": {"direct": {"verdict": "baseline", "n": 4, "value": 2.0},
                            "argo": {"verdict": "undecided", "n": 4, "rounds": 4, "delta": 0.4, "value": 2.4,
                                     "rounds_to_decide": 6}}}
    assert {"spinup_s", "total_s"} <= {h.metric for h in HEADLINES}
    runs = [{"orchestrator": p, "status": "succeeded", "metrics": {"spinup_s": 0.3, "total_s": 2.0}, "tags": {}}
            for p in ("direct", "argo")]
    rec = recommend({"backends": ["direct", "argo"], "baseline": "direct", "runs": runs, "verdicts": verdicts,
                     "repeats": 4, "argv": ["--repeats", "4"]})
    assert rec.text.startswith("use direct or any: argo equivalent to direct on spin-up"), rec.text
    assert rec.caveat == "total undecided (more --repeats would decide it)", rec.caveat


def test_a_rebuilt_report_carries_the_compares_recommendation_repeats_and_warmup(tmp_path) -> None:
    """Issue 52 (leftover 1): `llmpack report --run-group` wrote a report.json without the compare's
    ``recommendation``, ``repeats`` and ``warmup``. Rebuilt from the runs as MLflow gives them back, it has them with
    the compare's meaning, or null with the reason in ``not_recorded``; its rendered verdict is the compare's."""
    from llmpack.compare.command import argv_tag
    from llmpack.compare.outcome import outcome_tag
    from llmpack.compare.rebuilt import rebuilt_comparison
    from llmpack.report import write_report

    names = [p.backend for p in PATHS]
    # until decided: repeats and warmup null (rounds say how many ran), the budget and --max-steps recorded
    live = _until_decided({"direct": 7.0, "kfp": 7.6, "argo": 7.0, "mlflow": 7.0}, budget_s=200.0, noise=0.8, seed=2)
    live["argv"] = []
    live["recommendation"] = recommend(live).as_dict()
    stored = [{k: v for k, v in r.items() if k not in ("startup", "wall_s", "round")}  # and how it ended (trial 11)
              | {"tags": {**r["tags"], **argv_tag([]), **outcome_tag(live)}} for r in live["runs"]]
    again = rebuilt_comparison("rg-rec", names, stored)
    for key in ("recommendation", "repeats", "warmup", "rounds", "budget_s", "max_steps"):
        assert again[key] == live[key], key
    assert live["repeats"] is None and live["warmup"] is None and "not_recorded" not in again
    md_live = write_report(live, tmp_path / "live") / "report.md"
    md_again = write_report(again, tmp_path / "again") / "report.md"
    said = [line for line in md_live.read_text().splitlines() if "recommendation" in line or "to decide" in line]
    assert said and all(line in md_again.read_text() for line in said)
    # --repeats 3 (--warmup its default, then given)
    runs = planted_runs({"kfp": -1.0}, n=3, paths=("direct", "kfp"))
    for argv, warmup in ((["--repeats", "3"], 1), (["--repeats=3", "--warmup", "0"], 0)):
        live = comparison("rg-r", ["direct", "kfp"], runs, repeats=3, warmup=warmup, argv=argv)
        tagged = [{**r, "tags": {**r["tags"], **argv_tag(argv)}} for r in runs]
        again = rebuilt_comparison("rg-r", ["direct", "kfp"], tagged)
        assert (again["repeats"], again["warmup"]) == (3, warmup)
        assert again["recommendation"] == recommend(live).as_dict()
    # an older compare, no flags recorded: what its runs cannot tell is null, and why
    again = rebuilt_comparison("rg-r", ["direct", "kfp"], runs)
    assert again["repeats"] == 3 and again["warmup"] is None and "--warmup" in again["not_recorded"]["warmup"]
    one = rebuilt_comparison("rg-1", ["direct", "kfp"], planted_runs(n=1, paths=("direct", "kfp")))
    assert one["repeats"] is None and "round 1" in one["not_recorded"]["repeats"]
    # a cluster compare: its runs per path, no warm-up (a cluster compare refuses --warmup)
    cluster = [{**r, "mode": "cluster"} for r in runs]
    assert {k: rebuilt_comparison("rg-c", ["direct", "kfp"], cluster)[k] for k in ("repeats", "warmup")} == \
        {"repeats": 3, "warmup": 0}


def test_to_decide_says_a_path_left_out_of_the_compare_stays_undecided() -> None:
    """Issue 52 (leftover 2): `--backends direct,kfp` ended with `to decide: llmpack compare --backends direct,kfp
    --repeats 11` and nothing of argo, as if argo had been judged. The line now says it stays undecided."""
    from llmpack.compare.comparison import HEADLINES

    def undecided(paths: list[str], mode: str = "local") -> dict:
        verdicts = {h.metric: {paths[0]: {"verdict": "baseline", "n": 2, "value": 7.0},
                               **{p: {"verdict": "undecided", "n": 2, "rounds": 2, "delta": 0.3, "value": 7.3,
                                      "rounds_to_decide": 6} for p in paths[1:]}} for h in HEADLINES}
        runs = [{"orchestrator": p, "status": "succeeded", "metrics": {"spinup_s": 7.0}, "tags": {}, "mode": mode}
                for p in paths]
        return {"backends": paths, "baseline": paths[0], "runs": runs, "verdicts": verdicts, "repeats": 2,
                "argv": ["--backends", ",".join(paths), "--repeats", "2"]}

    rec = recommend(undecided(["direct", "kfp"]))
    assert rec.command is not None and rec.command.endswith("--backends direct,kfp --repeats 6"), rec.command
    said = "argo and mlflow not compared: they stay undecided (add them to --backends to judge)"
    assert rec.not_compared == said and rec.lines()[-2:] == [f"to decide: {rec.command}  ({rec.why_command})", said]
    assert rec.as_dict()["not_compared"] == said
    assert recommend(undecided(["direct", "kfp", "mlflow"])).not_compared == \
        "argo not compared: it stays undecided (add it to --backends to judge)"
    assert recommend(undecided(["direct", "kfp", "argo", "mlflow"])).not_compared is None
    on_cluster = recommend(undecided(["kfp", "mlflow"], mode="cluster"))  # direct has no cluster path
    assert on_cluster.not_compared == "argo not compared: it stays undecided (add it to --backends to judge)"
    import io

    from rich.console import Console

    from llmpack.compare.table import recommendation_lines

    console = Console(width=80, file=io.StringIO(), force_terminal=False)
    recommendation_lines(undecided(["direct", "kfp"]), console)
    assert "argo and mlflow not compared: they stay undecided" in console.file.getvalue()
