"""What a report shows: only the measures its runs have.

A pipeline of one's own need not train (no time to first step, tokens/s or goodput) nor ask for a GPU
(no cost): its report names what these runs could not measure once, and shows neither empty
columns, dashes in every cell, empty charts, nor terms for measures it lacks. The terminal table
decides the same from the same verdicts (:func:`llmpack.compare.table.measured_metrics`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llmpack.report.escape import html_text
from llmpack.ui import glossary

# Per measure a report may show, the glossary term that defines it.
_TERM_OF = {"spinup_s": "spinup", "time_to_first_step_s": "time_to_first_step", "total_s": "total",
            "pipeline_overhead_s": "pipeline_overhead", "cost_usd": "cost", "goodput": "goodput"}
# Terms every report with a succeeded run uses; the rest follow their measures.
_ALWAYS = ("step_compute", "percentiles", "n", "baseline", "delta", "ci")
_COST_TERMS = ("projected", "gpu_compute", "billed_non_compute")
COST_FORMULA = ("Cost: GPU count × billed seconds (container start, or process start locally, to finish) × price per "
                "GPU-hour / 3600; GPU compute = each GPU step's model loaded to finished, billed non-compute = the "
                "rest of the billed time.")


@dataclass(frozen=True)
class Shown:
    """The parts of one report: its measures, the terms that define them, its charts."""

    metrics: frozenset[str]  # the run metrics some succeeded run has
    untrained: bool  # a pipeline without finetune: spin-up is its first step's start
    gpu: bool  # some step asked for a GPU (else nothing is billed or projected)

    @property
    def first_step(self) -> bool:
        return "time_to_first_step_s" in self.metrics

    def has(self, metric: str) -> bool:
        return metric in self.metrics

    def terms(self, keys: tuple[str, ...], *, local: bool) -> list[glossary.Term]:
        """The glossary's terms among ``keys`` this report uses, in that order."""
        out = []
        for key in keys:
            if key == "projected" and not (local and self.gpu):
                continue
            if key in _COST_TERMS and not self.gpu:
                continue
            metric = next((m for m, t in _TERM_OF.items() if t == key), None)
            if metric is not None and not self.has(metric) and key not in _ALWAYS:
                continue
            out.append(glossary.term("spinup_first" if key == "spinup" and self.untrained else key))
        return out

    def missing_line(self, labels: dict[str, str]) -> str | None:
        """One sentence naming the headline measures no run has, and why; None when every one was measured."""
        lacking = [label for metric, label in labels.items() if not self.has(metric)]
        if not lacking:
            return None
        why = []
        if self.untrained:
            why.append("the pipeline has no finetune step")
        if not self.gpu:
            why.append("no step asks for a GPU, so nothing is billed")
        return ("Not measured by these runs: " + ", ".join(lacking)
                + (f" ({'; '.join(why)})" if why else " (no succeeded run has them)") + ".")


def shown(result: dict[str, Any]) -> Shown:
    """What the report of ``result`` shows, from its succeeded runs (all runs when none succeeded)."""
    from llmpack.compare.comparison import untrained

    runs = list(result.get("runs", ()))
    ok = [r for r in runs if r.get("status") == "succeeded"] or runs
    metrics = frozenset(k for r in ok for k, v in (r.get("metrics") or {}).items() if v is not None)
    counts = [str((r.get("tags") or {}).get("llmpack.gpu_count", "")) for r in ok]
    gpu = any(c not in ("0", "") for c in counts) or "cost_usd" in metrics
    return Shown(metrics=metrics, untrained=untrained(ok), gpu=gpu)


def facts_line(facts: dict[str, str], show: Shown) -> str:
    """The Markdown line of what every cost figure rests on; without a GPU step, that nothing is billed."""
    if not show.gpu:
        return (f"Mode: {facts['mode']} · GPU: none (no step asks for one) · price: {facts['price_per_gpu_hour']}: "
                "nothing is billed or projected.")
    return (f"Mode: {facts['mode']} · GPU: {facts['gpu_count']}x {facts['gpu_type']} · "
            f"price: ${facts['price_per_gpu_hour']}/GPU-hour ({facts['price_source']}) · {facts['cost_note']}.")


def facts_html(facts: dict[str, str], show: Shown) -> str:
    if not show.gpu:
        return ("<span>GPU <b>none</b> (no step asks for one)</span>\n"
                f"<span>price <b>{html_text(facts['price_per_gpu_hour'])}</b> (nothing is billed or projected)</span>")
    return (f"<span>GPU <b>{html_text(facts['gpu_count'])}&times; {html_text(facts['gpu_type'])}</b></span>\n"
            f"<span>price <b>${html_text(facts['price_per_gpu_hour'])}/GPU-hour</b></span>\n"
            f"<span>price source <b>{html_text(facts['price_source'])}</b></span>")


def money_html(show: Shown, costs: str) -> str:
    return f"<h2>What the money went on</h2><ul>{costs or '<li>no priced runs</li>'}</ul>" if show.gpu else ""


def break_even_html(show: Shown, be: dict[str, Any] | None) -> str:
    if not show.gpu:
        return ""
    sentence = be["sentence"] if be else "No control-plane costs given (use --control-plane-cost kfp=USD ...)."
    return f'<p class="note">{html_text(COST_FORMULA)}</p><h2>Break-even</h2><p>{html_text(sentence)}</p>'
