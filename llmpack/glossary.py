"""The one glossary: every term llmpack's tables, report and docs use, with its short definition.

``python -m llmpack.glossary`` prints docs/glossary.md (a test holds the committed page to it).
The terminal legends (:mod:`llmpack.display`), report.md and report.html read their definitions
from here, so a term means the same thing wherever it is shown. Two figures used to share the
word "overhead", 13x apart; they have two names now: **pipeline overhead** (time: the gaps
between steps) and **billed non-compute** (money: GPU time billed while no step trained or
evaluated).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Term:
    key: str  # how code asks for it
    name: str  # how it is written in tables and text
    short: str  # one line: what the legends print
    detail: str = ""  # more, for docs/glossary.md
    metric: str = ""  # the derived metric it names, where it is one (docs/telemetry-and-cost.md)
    group: str = "time"


GROUPS = (
    ("time", "Time"),
    ("money", "Money and GPU use"),
    ("stats", "Comparing paths"),
)

TERMS: tuple[Term, ...] = (
    # ------------------------------------------------------------------ time
    Term(key="spinup", name="spin-up", metric="spinup_s",
         short="submit → the training step's process (locally) or container (cluster) started, first attempt",
         detail="What the orchestrator costs before training can begin: scheduling, pod creation, image pull, "
                "the hand-overs of the steps before finetune."),
    Term(key="time_to_first_step", name="time to first step", metric="time_to_first_step_s",
         short="submit → the first optimizer step done (spin-up + imports + model load + one step)",
         detail="The headline: how long until the GPUs do useful work."),
    Term(key="total", name="total", metric="total_s",
         short="submit → the run's end (when the orchestrator handed over to the closing task)"),
    Term(key="step_compute", name="step compute",
         short="each step's process start → finished, summed over steps and attempts (CPU and GPU steps alike)",
         detail="What pipeline overhead is measured against; not the same as GPU compute."),
    Term(key="pipeline_overhead", name="pipeline overhead", metric="pipeline_overhead_s",
         short="total − step compute: wall time between steps (orchestrator hand-overs, waits), no step running",
         detail="Seconds, not dollars. Not billed non-compute, which is GPU time billed while a step ran."),
    Term(key="percentiles", name="p50 / p90", short="median and 90th percentile over n runs (type 7); p99 only with n >= 10"),
    Term(key="tokens_per_s", name="tokens/s", metric="tokens_per_s",
         short="training tokens per second of finetune's training loop, every rank counted"),
    # ------------------------------------------------------------------ money
    Term(key="cost", name="cost", metric="cost_usd", group="money",
         short="GPUs × billed seconds × price per GPU-hour / 3600, over every GPU step and attempt",
         detail="Billed from container start (locally: process start) to finished, plus node provisioning; "
                "on a cluster the GPU nodes' billed time."),
    Term(key="projected", name="projected", group="money",
         short="a local run's cost: its step times priced as if on the spec's GPU type; no GPU was billed",
         detail="A CPU run with 2 × nvidia-h100-80gb in its spec is priced at that GPU's list price, so the "
                "paths' overheads show in dollars. Cluster runs are billed, not projected."),
    Term(key="gpu_compute", name="GPU compute", group="money",
         short="GPU time while a GPU step trained or evaluated: each GPU step's model loaded → finished, × its GPUs"),
    Term(key="billed_non_compute", name="billed non-compute", group="money",
         short="cost − GPU compute: GPUs billed for start-up, model load, hand-overs, retries, node tails",
         detail="Dollars, not seconds: the part of the bill in which no step trained or evaluated. Not pipeline "
                "overhead, which is wall time between steps and holds no GPU."),
    Term(key="usd_per_1m_tokens", name="$/1M tokens", metric="usd_per_1m_tokens", group="money",
         short="cost / training tokens × 10⁶"),
    Term(key="goodput", name="goodput", metric="goodput", group="money",
         short="training GPU-seconds / the GPU-seconds the run held: its GPUs from submit to end, or billed if more",
         detail="Between 0 and 1, higher is better. For the same training, more wall time or more billed time "
                "can only lower it, so a slower path never looks better. It says how much of the held GPU time "
                "was training, not how fast training was (tokens/s says that)."),
    # ------------------------------------------------------------------ comparing
    Term(key="n", name="n", group="stats", short="succeeded runs of a path that the figure is over"),
    Term(key="baseline", name="baseline", group="stats",
         short="the path every other is compared with (direct when compared; --baseline PATH)"),
    Term(key="delta", name="Δ", group="stats", short="median of the path − median of the baseline"),
    Term(key="ci", name="CI", group="stats",
         short="95% bootstrap confidence interval of Δ: the differences the runs are consistent with"),
    Term(key="equivalence_margin", name="equivalence margin", group="stats",
         short="the largest Δ that counts as no practical difference; a path is equivalent when its CI lies within ±margin"),
    Term(key="decided", name="decided / undecided", group="stats",
         short="decided: the CI excludes 0 (faster, slower...) or lies within the margin (equivalent); "
               "undecided: neither, more runs needed"),
    Term(key="beyond_noise", name="▼ / ▲", group="stats",
         short="lower / higher than the baseline beyond noise (the CI of Δ excludes 0)"),
)

_BY_KEY = {t.key: t for t in TERMS}


def term(key: str) -> Term:
    """The term for ``key`` (a KeyError names a term the glossary lacks: add it here)."""
    return _BY_KEY[key]


def define(key: str) -> str:
    """``name: short definition``, as the legends print it."""
    t = term(key)
    return f"{t.name}: {t.short}"


def legend(keys: tuple[str, ...] | list[str]) -> list[str]:
    """One ``name: definition`` line per key, in the order given."""
    return [define(k) for k in keys]


def render() -> str:
    """docs/glossary.md."""
    lines = [
        "# Glossary",
        "",
        "<!-- generated by `python -m llmpack.glossary > docs/glossary.md`; edit llmpack/glossary.py, not this page -->",
        "",
        "Every term `llmpack run`, `llmpack compare` and the report use, with the definition their legends print.",
        "How each metric is derived: [telemetry-and-cost.md](telemetry-and-cost.md#derived-metrics).",
        "",
    ]
    for group, title in GROUPS:
        lines += [f"## {title}", "", "| term | metric | definition |", "|---|---|---|"]
        for t in TERMS:
            if t.group != group:
                continue
            text = t.short + (f". {t.detail}" if t.detail else "")
            metric = f"`{t.metric}`" if t.metric else ""
            lines.append(f"| **{t.name}** | {metric} | {text.replace('|', '&#124;')} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    print(render(), end="")
