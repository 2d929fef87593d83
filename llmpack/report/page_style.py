"""The style sheet of report.html (inlined: the report is one self-contained file)."""

PAGE_STYLE = """\
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;max-width:1100px;margin:2em auto;\
padding:0 1em;color:#222}
.summary{font-size:1.15em;line-height:1.45;background:#f6f8fa;border-left:4px solid #1f77b4;\
padding:.8em 1em;margin:1em 0}
.facts{display:flex;flex-wrap:wrap;gap:.4em 1.5em;color:#444;font-size:.95em;margin:.5em 0} .facts b{color:#222}
.hero{display:grid;grid-template-columns:repeat(auto-fit,minmax(440px,1fr));gap:1em;margin:1em 0}
.card{border:1px solid #ddd;border-radius:8px;padding:.8em 1em;min-width:0} \
.card.dim{opacity:.55;border-style:dashed}
.rec{font-size:1.2em;line-height:1.45;background:#eef7ee;border-left:4px solid #2ca02c;padding:.8em 1em;margin:1em 0}
.rec.open{background:#fff6e5;border-left-color:#e6a23c}
.card .label{color:#555;font-size:.95em;font-weight:600;margin-bottom:.4em}
.ct{width:100%;border-collapse:collapse;font-size:.9em} \
.ct td,.ct th{border:0;padding:.25em .4em;text-align:left;vertical-align:top}
.ct th,.ct td,.ct td.w{white-space:nowrap} .ct td.v{font-weight:600;text-align:right}
.ct .n{display:block;color:#666;font-weight:400;font-size:.85em}
.ct td.d{width:100%} .ci{display:block;color:#666;font-size:.85em;white-space:nowrap}
.ct td.w{color:#666} .ct td.w.strong{color:#111;font-weight:700}
.badge{color:#fff;border-radius:4px;padding:.1em .45em;font-weight:600;display:inline-block}
table.num{border-collapse:collapse;width:100%;font-size:.9em}
table.num td,table.num th{border-bottom:1px solid #eee;padding:.35em .5em;text-align:right;white-space:nowrap}
table.num th:first-child{text-align:left} table.num tr:first-child th{vertical-align:bottom;font-weight:600}
table.num .unit{font-weight:400;color:#666}
dl.terms{display:grid;grid-template-columns:max-content 1fr;gap:.2em 1em;font-size:.9em} \
dl.terms dt{font-weight:600}
dl.terms dd{margin:0;color:#444}
img{max-width:100%;margin:1em 0} .note{color:#666;font-size:.85em}
"""
