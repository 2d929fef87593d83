"""``llmpack run --seeds N``: the pipeline N times, one seed each, and the spread of its outcome.

The seeds are ``--seed``, ``--seed``+1, ... (0..N-1 by default), in one run group. Each seed is a
whole run (its own data split, LoRA initialisation and batch order) with its own outcome line;
then the mean and 95% interval over the seeds of base and tuned exact match on unseen prompts
(:mod:`components.serving.spread`), and the quality gate on the improvement's interval: the
earlier seeds register challengers only (``promote=false``), the last seed's run is told the
earlier improvements (:data:`components.settings.SEED_IMPROVEMENTS`) and its version can take
``champion`` only when the interval's lower end is above ``min_improvement``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from components import settings
from components.redaction import redact_data
from components.serving.spread import interval, spread_gate

# The figures whose spread is stated, where every run that succeeded has them: exact match on the
# unseen prompts (base, tuned), the gated metric's improvement, and eval loss (base, tuned).
FIGURES = ("base_exact_match", "tuned_exact_match", "gate_improvement", "base_eval_loss", "eval_loss")
RunOne = Callable[[Any, "dict[str, str] | None"], "dict[str, Any]"]


def seed_list(first: int, n: int) -> list[int]:
    return [first + i for i in range(n)]


def run_seeds(opts: Any, n: int, run_one: RunOne) -> list[dict[str, Any]]:
    """Run ``opts`` at ``n`` seeds from ``opts.seed`` (``run_one(opts, env)`` runs one); every run's summary.

    All but the last register their version as the challenger only; the last gets the earlier
    succeeded runs' gate improvements, so its register step gates on the interval over all of them.
    """
    from components.servers.submission import new_id

    opts = replace(opts, run_group=opts.run_group or new_id("rg"))  # one run group: one report over the seeds
    summaries: list[dict[str, Any]] = []
    seeds = seed_list(opts.seed, n)
    for i, seed in enumerate(seeds):
        last = i == len(seeds) - 1
        env = None
        if last and n > 1:
            earlier = [float(s["metrics"]["gate_improvement"]) for s in summaries if ok(s)]
            env = {settings.SEED_IMPROVEMENTS.name: ",".join(repr(v) for v in earlier)} if earlier else None
        params = opts.params if last else {**opts.params, "promote": False}
        summaries.append(run_one(replace(opts, seed=seed, params=params), env))
    return summaries


def ok(summary: Mapping[str, Any]) -> bool:
    return summary.get("status") == "succeeded" and "gate_improvement" in (summary.get("metrics") or {})


def aggregate(summaries: Sequence[Mapping[str, Any]], min_improvement: float) -> dict[str, Any]:
    """Per seed, the figures; over the seeds that succeeded, each figure's mean and interval; the gate over them."""
    good = [s for s in summaries if ok(s)]
    out: dict[str, Any] = {
        "seeds": [int(s.get("params", {}).get("seed", -1)) for s in summaries],
        "succeeded": len(good),
        "failed": len(summaries) - len(good),
        "per_seed": [{"seed": s.get("params", {}).get("seed"), "status": s.get("status"),
                      **{k: s["metrics"][k] for k in FIGURES if k in (s.get("metrics") or {})}} for s in summaries],
        "min_improvement": min_improvement,
    }
    for key in FIGURES:
        values = [float(s["metrics"][key]) for s in good if key in s["metrics"]]
        if values and len(values) == len(good):
            iv = interval(values)
            out[key] = {"mean": iv.mean, "low": iv.low, "high": iv.high, "n": iv.n}
    if good:
        passed, line = spread_gate([float(s["metrics"]["gate_improvement"]) for s in good], min_improvement)
        out["gate"] = {"passed": passed, "line": line}
    return out


def _text(figure: Mapping[str, Any], percent: bool) -> str:
    scale, unit = (100.0, "%") if percent else (1.0, "")
    digits = 1 if percent else 3
    mean = f"{scale * figure['mean']:.{digits}f}{unit}"
    if figure["n"] < 2:
        return mean
    low, high = f"{scale * figure['low']:.{digits}f}{unit}", f"{scale * figure['high']:.{digits}f}{unit}"
    return f"{mean} (95% interval {low}..{high})"


def spread_lines(agg: Mapping[str, Any]) -> list[str]:
    """``over 3 seeds (0,1,2): exact match on unseen prompts base 0.0% (...) -> tuned 12.0% (95% interval ...)``
    and the gate's line."""
    seeds = ",".join(str(s) for s in agg["seeds"])
    head = f"over {agg['succeeded']} seeds ({seeds})" + (f", {agg['failed']} failed" if agg["failed"] else "")
    if "base_exact_match" in agg and "tuned_exact_match" in agg:
        body = (f"exact match on unseen prompts base {_text(agg['base_exact_match'], True)} -> "
                f"tuned {_text(agg['tuned_exact_match'], True)}")
    elif "base_eval_loss" in agg and "eval_loss" in agg:
        body = f"eval loss base {_text(agg['base_eval_loss'], False)} -> tuned {_text(agg['eval_loss'], False)}"
    else:
        return [f"{head}: no run finished its evaluation"]
    lines = [f"{head}: {body}"]
    if "gate" in agg:
        lines.append(agg["gate"]["line"])
    return lines


def min_improvement_of(opts: Any) -> float:
    """The run's ``min_improvement``: given with ``--param``, else the pipeline's default."""
    if "min_improvement" in opts.params:
        return float(opts.params["min_improvement"])
    from llmpack.run.user_pipeline import load_pipeline

    param = load_pipeline(opts.pipeline).params.get("min_improvement")
    return float(param.default) if param is not None and param.default is not None else 0.0


def run_command(opts: Any, n: int, *, as_json: bool, echo: Callable[[str], None]) -> int:
    """What ``llmpack run --seeds N`` does: the runs, each one's outcome line, the spread; the exit code.

    1 when a run failed or the gate over the seeds failed, else 0.
    """
    from llmpack.run.show import measured_only, run_with_progress
    from llmpack.ui.outcome import outcome_line, promotion_phrase

    def one(o: Any, env: dict[str, str] | None) -> dict[str, Any]:
        summary = run_with_progress(o, f"{o.backend} seed {o.seed}", **({"env": env} if env else {}))
        if phrase := promotion_phrase(summary):
            summary["promotion"] = phrase
        if not as_json:
            line = outcome_line(summary)
            failed = f" ({summary['error']})" if summary["status"] != "succeeded" and summary.get("error") else ""
            echo(f"seed {o.seed}: {line or summary['status']}{failed}")
        return summary

    summaries = run_seeds(opts, n, one)
    agg = aggregate(summaries, min_improvement_of(opts))
    if as_json:
        echo(json.dumps(redact_data({"spread": agg, "runs": [measured_only(s) for s in summaries]}), sort_keys=True,
                        default=str))
    else:
        for line in spread_lines(agg):
            echo(line)
    return 0 if agg["failed"] == 0 and agg.get("gate", {}).get("passed") else 1
