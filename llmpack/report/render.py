"""The report rendered: report.md, a self-contained report.html, report.json, and where they go.

:func:`write_report` computes the facts (:mod:`llmpack.report.facts`), draws the charts
(:mod:`llmpack.report.charts`) and writes every file into a temp directory renamed into place,
so a reader never sees half a report; :func:`new_report_dir`, :func:`check_report_parent` and
:func:`link_latest` decide where it goes and keep ``latest`` pointing at the newest.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import statistics
import tempfile
from pathlib import Path
from typing import Any

from components.errors import InputError
from components.fusion import path_of
from llmpack.compare.comparison import runs_counted
from llmpack.report import beside, own_metrics, screen, task
from llmpack.report import estimate as estimate_vs_actual
from llmpack.report.charts import chart_boxes, chart_cost, chart_timeline, path_colour
from llmpack.report.escape import blanked_data, html_text, md
from llmpack.report.facts import (
    break_even,
    checkpoint_lines,
    cost_split,
    gpu_steps,
    report_facts,
    retry_lines,
    retry_note,
    summary_sentence,
)
from llmpack.report.page_style import PAGE_STYLE
from llmpack.report.preemption import html_section as preemption_html
from llmpack.report.preemption import markdown_lines as preemption_markdown
from llmpack.report.shown import COST_FORMULA, Shown, break_even_html, facts_html, facts_line, money_html, shown
from llmpack.report.traces import TRACES_FILE, write_traces
from llmpack.ui import glossary
from llmpack.ui.numbers import figure, money

# (metric, header, unit): the Numbers table; the header is the glossary's name of the measure.
TABLE_COLUMNS = (
    ("spinup_s", "spin-up", "s"),
    ("time_to_first_step_s", "time to first step", "s"),
    ("total_s", "total", "s"),
    ("pipeline_overhead_s", "pipeline overhead", "s"),
    ("tokens_per_s", "tokens/s", ""),
    ("cost_usd", "cost", "$"),
    ("usd_per_1m_tokens", "$/1M tokens", "$"),
    ("goodput", "goodput", ""),
)
# The terms the report uses, defined at its end from the one glossary (llmpack.ui.glossary).
REPORT_TERMS = ("spinup", "time_to_first_step", "total", "step_compute", "pipeline_overhead", "percentiles", "cost",
                "projected", "gpu_compute", "billed_non_compute", "goodput", "n", "baseline", "delta", "ci")

def _num(v: Any, unit: str = "") -> str:
    """A table figure: dollars in the one money format, the rest at 3 significant figures."""
    if v is None:
        return "-"
    return money(v) if unit == "$" else figure(v)


def _cell(stats: dict[str, Any], with_p90: bool, unit: str = "") -> str:
    if not stats or stats.get("p50") is None:
        return "-"
    text = _num(stats["p50"], unit)
    if with_p90 and stats["n"] > 1:
        text += f" / {_num(stats['p90'], unit)}"
    return text


def _row_cell(stats: dict[str, Any], key: str, unit: str, n: int) -> str:
    """A Numbers cell; over fewer runs than its row's n (total, cost, goodput: the whole runs, not the start-up
    rounds that count for spin-up and time to first step), it says its own n."""
    own = (stats.get(key) or {}).get("n")
    cell = _cell(stats.get(key, {}), True, unit)
    return f"{cell} (n={own})" if cell != "-" and own and own != n else cell


def _header(name: str, unit: str) -> str:
    return f"{name} ({unit})" if unit and unit != "$" else name


def _header_html(name: str, unit: str) -> str:
    """A Numbers column head on two lines (a long name broken between words, the unit below), so the
    table's cells, none of them wrapped, fit a 1280 px window."""
    words = html_text(name).split()
    half = (len(words) + 1) // 2
    head = " ".join(words[:half]) + "<br>" + " ".join(words[half:]) if len(words) > 2 else " ".join(words)
    return head + (f"<br><span class=unit>({unit})</span>" if unit and unit != "$" else "")


def _terms(result: dict[str, Any]) -> list[glossary.Term]:
    """The glossary's terms this report uses: those of its measures (``projected`` only where a run was local).

    Baseline, Δ and CI only beside verdicts (two paths or more, a run succeeded); with no run succeeded the
    page has no figures, no Numbers table and no verdicts: only the cost terms of its money section, if any."""
    local = any(r.get("mode") == "local" for r in result["runs"])
    ok = any(r["status"] == "succeeded" for r in result["runs"])
    judged = len(result.get("backends") or []) > 1 and ok
    keys = REPORT_TERMS if judged else tuple(k for k in REPORT_TERMS if k not in ("baseline", "delta", "ci"))
    if not ok:
        keys = tuple(k for k in keys if k in ("cost", "projected", "gpu_compute", "billed_non_compute"))
    return shown(result).terms(keys, local=local)


def _columns(show: Shown) -> tuple[tuple[str, str, str], ...]:
    """The Numbers table's columns some run measured (all of them when no run succeeded)."""
    return tuple(c for c in TABLE_COLUMNS if show.has(c[0])) or TABLE_COLUMNS


def _missing(result: dict[str, Any], show: Shown) -> str | None:
    """The sentence naming the headlines no run measured (a pipeline without finetune or GPU), or None."""
    from llmpack.compare.comparison import HEADLINES

    if not any(r["status"] == "succeeded" for r in result["runs"]):
        return None
    return show.missing_line({h.metric: h.label for h in HEADLINES})


def _cost_lines(result: dict[str, Any], splits: dict[str, dict[str, float] | None]) -> list[tuple[str, str]]:
    """Per path: median GPU compute and billed non-compute cost per run, and the non-compute share."""
    out = []
    for orch in result.get("backends") or dict.fromkeys(path_of(r) for r in result["runs"]):
        mine = [splits[r["pipeline_run"]] for r in result["runs"]
                if path_of(r) == orch and splits.get(r["pipeline_run"])]
        if not mine:
            continue
        compute = statistics.median(s["compute_usd"] for s in mine)
        overhead = statistics.median(s["overhead_usd"] for s in mine)
        share = overhead / (compute + overhead) if compute + overhead else 0.0
        out.append((orch, f"GPU compute {money(compute)} + billed non-compute {money(overhead)} per run "
                          f"({share:.0%} non-compute; medians, n={len(mine)})"))
    return out


md_text = md  # the one escaping (llmpack.report.escape): a value from the store as inert Markdown text


def markdown(result: dict[str, Any], facts: dict[str, str], sentence: str, be: dict[str, Any] | None,
             splits: dict[str, dict[str, float] | None]) -> str:
    from llmpack.compare.recommend import recommend

    facts = {k: md_text(v) for k, v in facts.items()}
    rec = recommend(result)
    show = shown(result)
    lines = [
        f"# llmpack comparison — run group {md(result['run_group'])}",
        "",
        "**" + md_text(rec.text) + "**",
        *[f"\n{md_text(x)}" for x in rec.lines()[1:]],
        "",
        md(sentence),
        "",
        facts_line(facts, show),
    ]
    if any(r["status"] == "succeeded" for r in result["runs"]):  # else no verdict, figure or table to show
        lines += _numbers_markdown(result, show, _columns(show))
    failed = [r for r in result["runs"] if r["status"] != "succeeded"]
    if failed:
        lines += ["", "## Failed runs", ""]
        lines += [f"- **{md_text(r['orchestrator'])}** {md_text(r['pipeline_run'])}: "
                  f"{md_text(r.get('error') or r['status'])}" for r in failed]
    lines += screen.markdown_lines(result.get("excluded") or [])
    lines += task.markdown(result["runs"])
    lines += own_metrics.markdown_lines(result["runs"])
    if show.gpu:
        lines += ["", "## What the money went on", ""]
        lines += [f"- **{md(o)}**: {md(text)}" for o, text in _cost_lines(result, splits)] or ["- no priced runs"]
    retries = retry_lines(result["runs"])
    if retries:
        lines += ["", "## Retried attempts", "", retry_note(result["runs"]), ""]
        lines += [f"- **{md(o)}** {md(text)}" for o, text in retries]
    lines += beside.markdown(result["runs"])
    lines += estimate_vs_actual.markdown(result["runs"], md_text)
    lines += preemption_markdown(result)
    saves = checkpoint_lines(result["runs"])  # preemption: the measured checkpoint write against the grace period
    if saves:
        lines += ["", "## Checkpoint write vs grace period", ""] + [f"- **{md(o)}** {md(text)}" for o, text in saves]
    if show.gpu:
        lines += ["", "## Break-even", "",
                  md(be["sentence"]) if be else "No control-plane costs given (use --control-plane-cost kfp=USD ...)."]
    boxes = "spin-up and time to first step" if show.first_step else "spin-up"
    lines += ["", "## Charts", "", "![timeline](timeline.png)", ""]
    if any(r["status"] == "succeeded" for r in result["runs"]):
        lines += [f"![{boxes}](spinup_boxplot.png)", ""]
    if show.gpu:
        lines += ["![cost per run](cost_per_run.png)", "", COST_FORMULA, ""]
    if terms := _terms(result):  # a page defines only the terms it uses: none, no section
        lines += ["## Terms", "", *[f"- **{t.name}**: {t.short}" for t in terms]]
    return "\n".join(lines).rstrip("\n") + "\n"


def _numbers_markdown(result: dict[str, Any], show: Shown, columns: tuple[tuple[str, str, str], ...]) -> list[str]:
    """The verdicts, the Numbers table and the measure tables (a report with a succeeded run)."""
    summary = result["summary"]
    baseline = f" ({md(result.get('baseline'))})" if result.get("baseline") else ""
    alone = len(result.get("backends") or []) < 2  # one path (an `llmpack run`'s group): no verdict to give
    lines = [] if alone else ["", f"## Verdicts against the baseline{baseline}", ""]
    for metric, per_path in result.get("verdicts", {}).items():
        if _is_judged(result, metric) and not alone:
            lines += [f"- {md(e['text'])}" for e in per_path.values()]
    unjudged = [e["text"] for metric, per_path in result.get("verdicts", {}).items() if not _is_judged(result, metric)
                and show.has(metric) and not alone for e in per_path.values() if e["verdict"] != "baseline"]
    if unjudged:
        lines += ["", "Not judged (one run per path: a single noisy figure, not a verdict; `--repeats 5` judges them):",
                  ""]
        lines += [f"- _{md(e)}_" for e in unjudged]
    if (missing := _missing(result, show)) is not None:
        lines += ["", md(missing)]
    lines += [] if alone else ["", f"Method: {md(result.get('verdict_method', ''))}."]
    lines += [
        "",
        f"Cells are p50 / p90 over the n runs of its row, or the n a cell gives ({md(result['percentile_method'])}); "
        "p99 needs n >= 10 and is "
        "reported in report.json only when estimated.",
        "",
        "| orchestrator | n | " + " | ".join(_header(h, u) for _, h, u in columns) + " |",
        "|---|---|" + "---|" * len(columns),
    ]
    for orch, stats in summary.items():
        n = runs_counted(stats, [k for k, _, _ in TABLE_COLUMNS])  # as compare's table counts: start-up rounds too
        lines.append(f"| {md(orch)} | {n} | " + " | ".join(_row_cell(stats, k, u, n) for k, _, u in columns) + " |")
    for title, note, rows in _measure_tables(result):  # gang and queue; GPU utilisation
        lines += ["", f"## {title}", "", note, "",
                  "| measure | " + " | ".join(f"{md(orch)} (n)" for orch in summary) + " |",
                  "|---|" + "---|" * len(summary)]
        for label, per_path in rows:
            cells = [f"{_cell(per_path[o], True, 's')} ({per_path[o]['n']})" if o in per_path else "-" for o in summary]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def _is_judged(result: dict[str, Any], metric: str) -> bool:
    """A headline some path could be judged on (more than one run each); else it is shown apart, dimmed."""
    from llmpack.compare.recommend import judged

    per_path = result.get("verdicts", {}).get(metric, {})
    return any(judged(e) for e in per_path.values() if e.get("verdict") != "baseline")


def _measure_tables(result: dict[str, Any]) -> list[tuple[str, str, list[tuple[str, dict[str, dict[str, Any]]]]]]:
    """The measure-by-path tables some run measured: (title, note, rows); none that no run has."""
    from llmpack.compare.comparison import gang_rows, gpu_rows

    tables = [("Gang and queue", "Multi-node finetune (a TrainJob gang) on a cluster; p50 / p90 seconds.",
               gang_rows(result)),
              ("GPU utilisation", "Sampled on the GPU steps (NVML or nvidia-smi, per node for a gang); idle is below "
               "LLMPACK_GPU_IDLE_UTIL_PCT from the step's process start to its first step; p50 / p90.",
               gpu_rows(result))]
    return [t for t in tables if t[2]]


def _card(label: str, unit: str, per_path: dict[str, dict[str, Any]], *, judged: bool = True) -> str:
    """One headline card: per path, its median, Δ vs baseline with the CI, n, and the verdict.

    A headline measured from one run per path says "not judged" (:func:`~llmpack.compare.recommend.verdict_word`),
    as the terminal and the summary sentence do, whether the report is the compare's or rebuilt."""
    from llmpack.compare.comparison import confidence_text, quantity
    from llmpack.compare.recommend import verdict_word

    rows = []
    for orch, e in per_path.items():
        if e["verdict"] in ("baseline", "no baseline"):
            delta = "baseline" if e["verdict"] == "baseline" else ""
        elif e["delta"] is None:
            delta = "—"
        else:
            ci = (f" <span class=ci>{confidence_text(e['confidence'])} CI [{quantity(e['ci'][0], unit, signed=True)}, "
                  f"{quantity(e['ci'][1], unit, signed=True)}]</span>") if e.get("ci") else ""
            delta = f"Δ {quantity(e['delta'], unit, signed=True)}{ci}"
        verdict = verdict_word(e) if e["verdict"] not in ("baseline", "no baseline") else ""
        strong = " strong" if verdict in ("faster", "slower", "cheaper", "costlier", "equivalent") else ""
        rows.append(
            f"<tr><th>{_badge(orch)}</th><td class=v>{html_text(quantity(e['value'], unit))}"
            f"<span class=n>n={e['n']}</span></td><td class=d>{delta}</td>"
            f"<td class='w{strong}'>{html_text(verdict)}</td></tr>")
    dim = "" if judged else " dim"
    return (f'<div class="card{dim}"><div class="label">{html_text(label)}</div>'
            f'<table class="ct">{"".join(rows)}</table></div>')


def _badge(orch: str | None) -> str:
    if not orch:
        return "—"
    return f'<span class="badge" style="background:{path_colour(orch)}">{html_text(orch)}</span>'


def html_page(result: dict[str, Any], facts: dict[str, str], sentence: str, be: dict[str, Any] | None,
              charts: dict[str, Path], splits: dict[str, dict[str, float] | None]) -> str:
    from llmpack.compare.comparison import HEADLINES
    from llmpack.compare.recommend import recommend

    summary = result["summary"]
    show = shown(result)
    columns = _columns(show)

    def img(name: str) -> str:
        if name not in charts:
            return ""
        data = base64.b64encode(charts[name].read_bytes()).decode()
        return f'<img alt="{name}" src="data:image/png;base64,{data}">'

    rows = []
    for orch, stats in summary.items():
        n = runs_counted(stats, [k for k, _, _ in TABLE_COLUMNS])
        cells = "".join(f"<td>{html_text(_row_cell(stats, k, u, n))}</td>" for k, _, u in columns)
        rows.append(f"<tr><th>{_badge(orch)}</th><td>{n}</td>{cells}</tr>")
    failed = "".join(
        f"<li>{_badge(r['orchestrator'])} <code>{html_text(r['pipeline_run'])}</code>: "
        f"{html_text(str(r.get('error')))}</li>"
        for r in result["runs"]
        if r["status"] != "succeeded"
    )
    verdicts = result.get("verdicts", {})
    shown_headlines = [h for h in HEADLINES if h.metric in verdicts]
    cards = "".join(_card(h.label, h.unit, verdicts[h.metric]) for h in shown_headlines
                    if _is_judged(result, h.metric))
    unjudged = [h for h in shown_headlines if not _is_judged(result, h.metric) and show.has(h.metric)]
    if unjudged:  # one run each: shown apart and dimmed, never as a headline
        cards += ('</div><p class="note">Not judged (one run per path: a single noisy figure, not a verdict; '
                  '--repeats 5 judges them):</p><div class="hero">'
                  + "".join(_card(h.label, h.unit, verdicts[h.metric], judged=False) for h in unjudged))
    missing = _missing(result, show)
    missing = f'<p class="note">{html_text(missing)}</p>' if missing else ""
    rec = recommend(result)
    costs = "".join(f"<li>{_badge(o)} {html_text(text)}</li>" for o, text in _cost_lines(result, splits))
    retries = "".join(f"<li>{_badge(o)} {html_text(text)}</li>" for o, text in retry_lines(result["runs"]))
    if retries:
        retries = f"<h2>Retried attempts</h2><p class=note>{retry_note(result['runs'])}</p><ul>{retries}</ul>"
    saves = "".join(f"<li>{_badge(o)} {html_text(text)}</li>" for o, text in checkpoint_lines(result["runs"]))
    if saves:  # preemption: the measured checkpoint write against the grace period
        retries += f"<h2>Checkpoint write vs grace period</h2><ul>{saves}</ul>"
    gangs = ""  # gang and queue; GPU utilisation
    for title, note, measures in _measure_tables(result):
        body = "".join(
            f"<tr><th>{html_text(label)}</th>"
            + "".join(f"<td>{html_text(_cell(per_path[o], True))} <span class=note>n={per_path[o]['n']}</span></td>"
                      if o in per_path else "<td>-</td>" for o in summary) + "</tr>"
            for label, per_path in measures)
        gangs += (f"<h2>{html_text(title)}</h2><p class=note>{html_text(note)}</p>"
                  "<table class=num><tr><th>measure</th>"
                  + "".join(f"<th>{_badge(o)}</th>" for o in summary) + f"</tr>{body}</table>")
    baseline = result.get("baseline")
    ok = any(r["status"] == "succeeded" for r in result["runs"])  # else no verdict, figure or table to show
    verdicts_html = (f'<div class="hero">{cards}</div>\n{missing}\n<p class="note">'
                     f'{html_text(glossary.define("delta"))}; {html_text(glossary.define("ci"))}. '
                     f'Method: {html_text(result.get("verdict_method", ""))}.</p>')
    numbers = (f'<h2>Numbers</h2>\n<p class="note">p50 / p90 over the n runs of its row, or the n a cell gives '
               f'({html_text(result["percentile_method"])}); p99 only '
               'with n &ge; 10 (see report.json).</p>\n<table class="num"><tr><th>orchestrator</th><th>n</th>'
               + "".join(f"<th>{_header_html(h, u)}</th>" for _, h, u in columns) + f"</tr>\n{''.join(rows)}</table>\n"
               + gangs)
    terms = "".join(f"<dt>{html_text(t.name)}</dt><dd>{html_text(t.short)}</dd>" for t in _terms(result))
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>llmpack comparison {html_text(result['run_group'])}</title>
<style>
{PAGE_STYLE}</style></head><body>
<h1>llmpack comparison</h1>
<p class="rec{'' if rec.path else ' open'}"><b>{html_text(rec.text)}</b>\
{''.join(f'<br>{html_text(x)}' for x in rec.lines()[1:])}</p>
<p class="summary">{html_text(sentence)}</p>
<div class="facts"><span>mode <b>{html_text(facts['mode'])}</b></span>
{facts_html(facts, show)}
<span>baseline <b>{html_text(baseline or 'none')}</b></span>
<span>run group <code>{html_text(result['run_group'])}</code></span></div>
{f'<p class="note">{html_text(facts["cost_note"])}.</p>' if show.gpu else ''}
{verdicts_html if ok and len(result.get('backends') or []) > 1 else missing}
{img('timeline')}
{img('spinup_boxplot')}
{task.html_section(result['runs'], _badge)}
{own_metrics.html_section(result['runs'], _badge)}
{money_html(show, costs)}
{retries}
{beside.html_section(result['runs'])}
{estimate_vs_actual.html_section(result['runs'])}
{preemption_html(result, _badge)}
{img('cost_per_run')}
{break_even_html(show, be)}
{numbers if ok else ''}
{('<h2>Failed runs</h2><ul>' + failed + '</ul>') if failed else ''}
{screen.html_section(result.get('excluded') or [])}
{f'<h2>Terms</h2>{chr(10)}<dl class="terms">{terms}</dl>' if terms else ''}
</body></html>
"""


def write_report(result: dict[str, Any], out_dir: Path, control_plane: dict[str, float] | None = None, *,
                 replace: bool = False, follow_links: bool = True) -> Path:
    """Write the whole report into ``out_dir`` atomically (a temp dir renamed at the end).

    An existing report there is replaced only with ``replace=True``; a directory that is not a
    report is never touched. ``follow_links=False`` (a name llmpack chose): a link there is refused, never
    followed, and the rename lands on the name itself (round 31: a planted link sent the report elsewhere).
    """
    if not follow_links and os.path.islink(out_dir):
        raise InputError(f"report directory {out_dir}: a symlink where a new report goes; not followed, not written")
    out_dir = Path(out_dir).resolve() if follow_links else Path(os.path.abspath(out_dir))
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"report directory {out_dir}: exists and is not a directory")
    if out_dir.is_dir() and any(out_dir.iterdir()):
        if not (out_dir / "report.json").exists():
            raise InputError(f"report directory {out_dir}: not empty and not an llmpack report; choose another")
        if not replace:
            raise InputError(f"report directory {out_dir}: holds a report already; choose another")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    try:
        from llmpack.compare.comparison import is_startup_run

        runs = result["runs"]
        whole = [r for r in runs if not is_startup_run(r)]  # a start-up round's run says nothing of cost
        be = break_even(whole, control_plane) if control_plane else None
        steps = gpu_steps()
        splits = {r["pipeline_run"]: cost_split(r, steps) for r in whole}
        facts = report_facts(result)
        sentence = summary_sentence(result, be)
        show = shown(result)
        charts = {"timeline": tmp / "timeline.png"}
        chart_timeline(runs, charts["timeline"])
        if any(r["status"] == "succeeded" for r in runs):  # a figure to draw
            charts["spinup_boxplot"] = tmp / "spinup_boxplot.png"
            chart_boxes(runs, charts["spinup_boxplot"], first_step=show.first_step, untrained=show.untrained)
        if show.gpu:  # a pipeline with no GPU step bills nothing: no empty chart
            charts["cost_per_run"] = tmp / "cost_per_run.png"
            chart_cost(whole, charts["cost_per_run"], splits)
        full = {**result, "summary_sentence": sentence, "facts": facts, "cost_split": splits, "break_even": be}
        (tmp / "report.json").write_text(json.dumps(blanked_data(full), indent=2, sort_keys=True, default=str) + "\n")
        (tmp / "report.md").write_text(markdown(result, facts, sentence, be, splits))
        (tmp / "report.html").write_text(html_page(result, facts, sentence, be, charts, splits))
        write_traces(runs, tmp / TRACES_FILE)
        os.chmod(tmp, 0o755)  # mkdtemp makes it private
        if out_dir.exists():
            old = out_dir.with_name(f".{out_dir.name}.old-{os.getpid()}")
            os.replace(out_dir, old)
            os.replace(tmp, out_dir)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir
