"""The answer a compare ends with: which path to use, on which headline, by how much, with its
interval and the caveat that matters; or, when the verdicts do not allow one, the command that
would decide them.

Only decided verdicts recommend (:mod:`llmpack.compare.sequential` bounds their error rate); a path
decidedly worse on any decided headline is never recommended; among the decidedly better, the
largest difference; with none better, the baseline. Undecided, the command (``--budget``,
``--max-steps`` or ``--repeats``) is computed from the rounds the verdicts need at the noise seen.
Pure: a comparison result in, a :class:`Recommendation` out. The rules in full: docs/internals/comparison.md.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass, replace
from typing import Any

from components.fusion import path_of
from llmpack.compare.comparison import HEADLINES, Headline, confidence_text, measured, quantity
from llmpack.compare.until_decided import MAX_ROUNDS, WHOLE_RUN_METRICS

FULL_REPEATS = 5  # what judges total and cost: --repeats 5 (the smallest that decides a 25% margin here)


@dataclass(frozen=True, kw_only=True)
class Recommendation:
    """What to use and why (``path`` None: no recommendation yet), or the command that would decide."""

    path: str | None
    text: str  # one line: "use kfp: faster than direct on time to first step by 1.20 s (95% CI ...)"
    caveat: str | None = None
    command: str | None = None  # undecided: what to type to decide
    why_command: str | None = None  # what the command changes, in a few words
    not_compared: str | None = None  # with a command: the shipped paths it leaves out stay undecided (issue 52)

    def lines(self) -> list[str]:
        """The recommendation as the terminal and report print it: the line, its caveat, the command."""
        out = [self.text]
        if self.caveat:
            out.append(f"caveat: {self.caveat}")
        if self.command:
            out.append(f"to decide: {self.command}" + (f"  ({self.why_command})" if self.why_command else ""))
        if self.command and self.not_compared:
            out.append(self.not_compared)
        return out

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "text": self.text, "caveat": self.caveat, "command": self.command,
                "why_command": self.why_command, "not_compared": self.not_compared}


def judged(entry: dict[str, Any]) -> bool:
    """Could this verdict have been decided: at least two paired rounds (one run each is shown, not judged)."""
    if entry.get("verdict") in ("baseline", "no baseline"):
        return True
    n = int(entry.get("n") or 0)
    return min(n, int(entry.get("rounds") or n)) > 1


def verdict_word(entry: dict[str, Any]) -> str:
    """The one word the terminal and the report show for a verdict: ``not judged`` for one run each,
    else the verdict (``undecided`` means judged and not yet decided)."""
    word = str(entry.get("verdict", ""))
    return "not judged" if word == "undecided" and not judged(entry) else word


def recommend(result: dict[str, Any]) -> Recommendation:
    """The recommendation of a comparison result (see the module doc)."""
    baseline = result.get("baseline")
    verdicts = result.get("verdicts", {})
    ok = {path_of(r) for r in result.get("runs", ()) if r.get("status") == "succeeded"}
    paths = [p for p in result.get("backends", ()) if p in ok]
    failed = [p for p in result.get("backends", ()) if p not in ok]
    if baseline is None:
        return Recommendation(path=None, text="no recommendation: no baseline to judge against "
                                              "(name one with --baseline PATH)")
    if not ok and result.get("runs"):
        return Recommendation(path=None, text="no recommendation: every run of every path failed (see each run's "
                                              "error)")
    if baseline not in ok:
        return Recommendation(path=None, text=f"no recommendation: the baseline {baseline} failed "
                                              "(see its error)")
    others = [p for p in paths if p != baseline]
    if len(result.get("backends", ())) < 2:
        return Recommendation(path=None, text=f"no recommendation: one path only ({baseline}) in this run group; "
                                              "nothing to judge it against")
    if not others:
        return Recommendation(path=None, text=f"no recommendation: only {baseline} succeeded; nothing to judge it "
                                              "against", caveat=_failed_caveat(failed))
    decided = [h for h in HEADLINES if h.metric in verdicts and measured(verdicts[h.metric])
               and all(_decided(verdicts[h.metric].get(p, {})) for p in others)]
    rec = _with_command(_recommend(result, baseline, others, failed, decided), result, baseline, others)
    return replace(rec, not_compared=_not_compared(result)) if rec.command else rec


def _not_compared(result: dict[str, Any]) -> str | None:
    """The shipped paths this compare left out (``argo not compared: it stays undecided``), said under its
    ``to decide:`` command, which decides the compared paths only, rather than implying a verdict on the others
    (issue 52). On a cluster ``direct`` has no path, so it is never named."""
    from llmpack.compare.comparison import DEFAULT_BACKENDS

    compared = {str(p).split("+", 1)[0] for p in result.get("backends", ())}
    on_cluster = result.get("mode") == "cluster" or any(r.get("mode") == "cluster" for r in result.get("runs", ()))
    left = [p for p in DEFAULT_BACKENDS if p not in compared and not (on_cluster and p == "direct")]
    if not left:
        return None
    one = len(left) == 1
    return (f"{' and '.join(left)} not compared: {'it stays' if one else 'they stay'} undecided "
            f"(add {'it' if one else 'them'} to --backends to judge)")


def _recommend(result: dict[str, Any], baseline: str, others: list[str], failed: list[str],
               decided: list[Headline]) -> Recommendation:
    """The recommendation from the decided headlines (see the module doc), before :func:`_with_command`."""
    verdicts = result["verdicts"]
    worse = {p for h in decided for p in others if verdicts[h.metric][p]["verdict"] == h.higher}
    for h in decided:
        per_path = verdicts[h.metric]
        if not any(per_path[p]["verdict"] in (h.lower, h.higher) for p in others):
            continue
        better = [p for p in others if per_path[p]["verdict"] == h.lower and p not in worse]
        if better:
            best = max(better, key=lambda p: abs(per_path[p]["delta"]))
            e = per_path[best]
            text = f"use {best}: {h.lower} than {baseline} on {h.label} by {_by(e, h)}"
            caveat = _failed_caveat(failed) or (
                f"{', '.join(better)} are each {h.lower} than {baseline}, not compared with each other"
                if len(better) > 1 else None) or _caveat(result, h, decided)
            return Recommendation(path=best, text=text, caveat=caveat)
        slower = [p for p in others if per_path[p]["verdict"] == h.higher]
        same = [p for p in others if per_path[p]["verdict"] == "equivalent"]
        mixed = [p for p in others if per_path[p]["verdict"] == h.lower]  # better here, decidedly worse elsewhere
        said = ([f"{', '.join(f'{p} is {h.higher} by {_by(per_path[p], h)}' for p in slower)} on {h.label}"]
                if slower else [])
        said += [f"{p} is {h.lower} on {h.label} but " + " and ".join(
            f"{x.higher} on {x.label}" for x in decided if verdicts[x.metric][p]["verdict"] == x.higher) for p in mixed]
        text = f"use {baseline}: {'; '.join(said)}" + (f"; {', '.join(same)} equivalent" if same else "")
        return Recommendation(path=baseline, text=text, caveat=_failed_caveat(failed) or _caveat(result, h, decided))
    if decided:  # every decided headline says equivalent
        h = decided[0]
        return Recommendation(
            path=baseline, text=f"use {baseline} or any: {', '.join(others)} equivalent to {baseline} on {h.label} "
                                f"(within ±{quantity(verdicts[h.metric][others[0]].get('margin'), h.unit)})",
            caveat=_failed_caveat(failed) or _caveat(result, h, decided))
    return _undecided(result, baseline, others, failed)


def _decided(entry: dict[str, Any]) -> bool:
    return entry.get("verdict") not in (None, "undecided") and judged(entry)


def _with_command(rec: Recommendation, result: dict[str, Any], baseline: str, others: list[str]) -> Recommendation:
    """A recommendation from the decided headlines, with ``to decide:`` when a verdict the rounds judge is
    still undecided (the budget ran out before it): what was decided stands, and what would decide the
    rest is said too."""
    if rec.command or rec.path is None:
        return rec
    open_ = {p: [h for h in judged_each_round(result) if verdicts_of(result, h, p).get("verdict") == "undecided"
                 and judged(verdicts_of(result, h, p))] for p in others}
    if not any(open_.values()):
        return rec
    pending = _undecided(result, baseline, others, [])
    what = "; ".join(f"{p} on {' and '.join(h.label for h in hs)}" for p, hs in open_.items() if hs)
    return replace(rec, command=pending.command,
                   why_command=f"undecided: {what}" + (f"; {pending.why_command}" if pending.why_command else ""))


def judged_each_round(result: dict[str, Any]) -> list[Headline]:
    """The headlines a compare's rounds judge, measured by some run: the start-up ones, or, when every
    round ran the whole pipeline (``--repeats``, a rebuilt report whose `to decide:` is ``--repeats N``, or a
    pipeline without finetune), every measured one."""
    from llmpack.compare.comparison import untrained

    verdicts = result.get("verdicts", {})
    fixed = not result.get("design")  # --repeats N: every headline judged after the last round
    whole = untrained(list(result.get("runs", ())))
    return [h for h in HEADLINES if h.metric in verdicts and measured(verdicts[h.metric])
            and (h.startup or fixed or (whole and h.metric in WHOLE_RUN_METRICS))]


def verdicts_of(result: dict[str, Any], h: Headline, path: str) -> dict[str, Any]:
    return result.get("verdicts", {}).get(h.metric, {}).get(path, {})


def _by(e: dict[str, Any], h: Headline) -> str:
    """``1.20 s (95% CI -1.50 s to -0.90 s)``: the difference and its interval."""
    by = quantity(abs(e["delta"]), h.unit)
    if e.get("ci") and e.get("confidence"):
        lo, hi = e["ci"]
        by += (f" ({confidence_text(e['confidence'])} CI {quantity(lo, h.unit, signed=True)} "
               f"to {quantity(hi, h.unit, signed=True)})")
    return by


def _failed_caveat(failed: list[str]) -> str | None:
    return f"{', '.join(failed)} failed and {'was' if len(failed) == 1 else 'were'} not judged" if failed else None


def _caveat(result: dict[str, Any], h: Headline, decided: list[Headline]) -> str:
    """What the recommendation does not cover: total and cost when not judged, else where it was measured."""
    from llmpack.compare.comparison import measured

    verdicts = result.get("verdicts", {})
    rest = [x for x in HEADLINES if x not in decided and not x.startup and x.metric in verdicts
            and measured(verdicts[x.metric])]  # a headline no run measured (no GPU: no cost) is not a caveat
    unjudged = [x.label for x in rest if not any(judged(e) for e in verdicts[x.metric].values()
                                                   if e.get("verdict") not in ("baseline", "no baseline"))]
    undecided = [x.label for x in rest if x.label not in unjudged]
    if h.startup and (unjudged or undecided):
        how = f"--repeats {FULL_REPEATS} judges them" if result.get("design") else "more --repeats would judge them"
        parts = ([f"{' and '.join(unjudged)} not judged ({how})"] if unjudged else []) + (
            [f"{' and '.join(undecided)} undecided"] if undecided else [])
        from llmpack.compare.comparison import untrained

        if untrained(list(result.get("runs", ()))):  # every round ran the pipeline whole: rounds would decide them
            return f"{'; '.join(parts)} (more --repeats would decide {'it' if len(rest) == 1 else 'them'})"
        return f"{'; '.join(parts)}; start-up is what differs between paths"
    cluster = any(r.get("mode") == "cluster" for r in result.get("runs", ()))
    return ("measured on this cluster with its current load" if cluster else
            "measured on this machine, locally: a cluster adds scheduling and image pulls (llmpack cluster compare)")


# --------------------------------------------------------------------------- undecided: the command that decides


def _undecided(result: dict[str, Any], baseline: str, others: list[str], failed: list[str]) -> Recommendation:
    verdicts = result["verdicts"]
    startup = judged_each_round(result)
    open_ = {p: [h for h in startup if not _decided(verdicts[h.metric].get(p, {}))] for p in others}
    open_ = {p: hs for p, hs in open_.items() if hs}
    need = [verdicts[h.metric][p].get("rounds_to_decide") for p, hs in open_.items() for h in hs]
    what = "; ".join(f"{p} on {' and '.join(h.label for h in hs)}" for p, hs in open_.items()) or "total and cost"
    paired = max((int(e.get("rounds") or 0) for per in verdicts.values() for e in per.values()), default=0)
    rounds_done = int(result.get("rounds") or result.get("repeats") or paired or 1)  # a rebuilt report: the verdicts'
    text = f"no recommendation yet: undecided after {rounds_done} round{'' if rounds_done == 1 else 's'} ({what})"
    caveat = _failed_caveat(failed)
    if any(n is None for n in need) or not need:
        return Recommendation(path=None, text=text, caveat=caveat, command=_command(result, {"--margin": "50%"}),
                              why_command="the differences are inside the noise: a wider margin can call them "
                                          "equivalent")
    rounds = max(int(n) for n in need)
    if not result.get("design"):  # fixed --repeats
        return Recommendation(path=None, text=text, caveat=caveat,
                              command=_command(result, {"--repeats": str(rounds)}),
                              why_command=f"{rounds} rounds, as the noise so far needs")
    plan = plan_from_runs(result) or result.get("plan") or {}
    before, per_round = plan.get("before_rounds_s"), plan.get("round_s")
    if before is None or not per_round:
        return Recommendation(path=None, text=text, caveat=caveat, command=_command(result, {"--repeats": str(rounds)}),
                              why_command=f"{rounds} rounds, as the noise so far needs")
    by_path = {p: max(int(verdicts[h.metric][p]["rounds_to_decide"]) for h in hs) for p, hs in open_.items()}
    options = [_budget_for(result, baseline, by_path, list(open_))]
    worst = max(by_path, key=lambda p: by_path[p])
    rest = [p for p in open_ if by_path[p] < by_path[worst]]
    if rest:  # one path's noise sets the rounds: the others decide far sooner without it
        options.append(_budget_for(result, baseline, by_path, rest, why=f"without {worst}"))
    doable = [o for o in options if o is not None]
    if not doable:
        return Recommendation(path=None, text=text, caveat=caveat, command=_command(result, {"--margin": "50%"}),
                              why_command=f"over {MAX_ROUNDS} rounds at this noise: a wider margin, or a quieter "
                                          "machine, would decide")
    command, why = doable[0]
    steps = _fewer_steps(result, plan, by_path[worst])
    extra = [f"or {w}: {c}" for c, w in doable[1:]]
    if steps is not None:
        extra.append(f"or shorter runs: {_command(result, {'--max-steps': str(steps)})}")
    return Recommendation(path=None, text=text, caveat=caveat, command=command,
                          why_command="; ".join([why, *extra]))


def plan_from_runs(result: dict[str, Any]) -> dict[str, Any]:
    """What a round cost, from the runs themselves, so that the compare's last word and a report rebuilt from
    MLflow (which has no ``plan``) say the same: each path's start-up runs' median total; before the rounds, what
    the compare recorded on its start-up runs (warm-up and round 1, :data:`BEFORE_ROUNDS_TAG`), else round 1's
    whole runs summed. Empty without start-up runs."""
    from components.fusion import path_of
    from llmpack.compare.comparison import BEFORE_ROUNDS_TAG, is_startup_run

    ok = [r for r in result.get("runs", ()) if r.get("status") == "succeeded" and r["metrics"].get("total_s")]
    per_path: dict[str, float] = {}
    for path in dict.fromkeys(path_of(r) for r in ok):
        times = sorted(r["metrics"]["total_s"] for r in ok if path_of(r) == path and is_startup_run(r))
        if times:
            per_path[path] = times[len(times) // 2]
    whole = [r for r in ok if not is_startup_run(r)]
    if not per_path or not whole:
        return {}
    recorded = [float(t) for r in ok if (t := (r.get("tags") or {}).get(BEFORE_ROUNDS_TAG)) is not None]
    before = max(recorded) if recorded else sum(r["metrics"]["total_s"] for r in whole)
    train = sum(r["metrics"].get("train_s") or 0.0 for r in whole)
    return {"before_rounds_s": before, "round_s": sum(per_path.values()), "path_round_s": per_path,
            "round1_train_s": round(train, 1) or None}


def _budget_for(result: dict[str, Any], baseline: str, by_path: dict[str, int], paths: list[str], *,
                why: str = "") -> tuple[str, str] | None:
    """``llmpack compare --budget N`` (with ``--backends`` when fewer paths) that holds the rounds ``paths``
    need, at what a round of them cost here; None when they need more than a compare runs."""
    plan = plan_from_runs(result) or result.get("plan") or {}
    rounds = max(by_path[p] for p in paths)
    if rounds > MAX_ROUNDS:
        return None
    every = len(paths) == len(by_path) and len(by_path) + 1 == len(result["backends"])
    per_round = plan["round_s"] if every else sum(plan.get("path_round_s", {}).get(p, 0.0) for p in [baseline, *paths])
    flags = {"--budget": _duration(_seconds_up(plan["before_rounds_s"] + (rounds - 1) * per_round))}
    if not every:
        flags["--backends"] = ",".join([baseline, *paths])
    said = f"{rounds} rounds at {per_round:.0f} s a round here"
    return _command(result, flags), (f"{why}: {said}" if why else said)


def _fewer_steps(result: dict[str, Any], plan: dict[str, Any], rounds: int) -> int | None:
    """``--max-steps`` that leaves the current budget room for ``rounds`` rounds (training time scales with steps)."""
    max_steps, train, budget = result.get("max_steps"), plan.get("round1_train_s"), result.get("budget_s")
    if not (max_steps and train and budget):
        return None
    over = plan["before_rounds_s"] + (rounds - 1) * plan["round_s"] - budget
    if over <= 0 or over >= train:
        return None
    steps = math.floor(max_steps * (1 - over / train))
    return steps if 1 <= steps < max_steps else None


def _seconds_up(seconds: float) -> float:
    """A budget with a tenth to spare, up to the half minute."""
    return math.ceil(seconds * 1.1 / 30.0) * 30.0


def _duration(seconds: float) -> str:
    """``--budget`` spelling: ``270s`` below 10 minutes, else ``12.5m``."""
    return f"{seconds:.0f}s" if seconds < 600 else f"{seconds / 60:g}m"


def _command(result: dict[str, Any], flags: dict[str, str]) -> str:
    """``llmpack compare`` (``llmpack cluster compare`` for a comparison on a cluster: ``llmpack compare`` refuses its
    flags) with the user's own flags (``result['argv']``), ``flags`` set over them."""
    argv = list(result.get("argv") or [])
    kept: list[str] = []
    skip = False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        dropped = name in flags or name in ("--report", "--force", "--json", "--no-report") \
            or (name == "--budget" and "--repeats" in flags) or (name == "--repeats" and "--budget" in flags)
        if dropped:
            skip = "=" not in arg and name not in ("--force", "--json", "--no-report") and i + 1 < len(argv)
            continue
        kept.append(arg)
    for flag, value in flags.items():
        kept += [flag, value]
    from components.redaction import blank_known, redact_uri

    def shown(arg: str) -> str:  # a --tracking-uri's password (URI or --flag=URI)
        flag, sep, value = arg.partition("=") if arg.startswith("--") else ("", "", arg)
        return f"{flag}{sep}{redact_uri(value, every_value=True)}" if "://" in value else arg

    on_cluster = result.get("mode") == "cluster" or any(r.get("mode") == "cluster" for r in result.get("runs", ()))
    command = ["llmpack", "cluster", "compare"] if on_cluster else ["llmpack", "compare"]  # a rebuilt report: its runs
    return blank_known(shlex.join([*command, *map(shown, kept)]))  # and the secrets it was handed
