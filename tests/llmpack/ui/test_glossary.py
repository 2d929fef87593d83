"""One glossary (llmpack.ui.glossary) behind docs/glossary.md and every legend; money written one way."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from llmpack.compare import table
from llmpack.run import show
from llmpack.ui import display, glossary
from llmpack.ui.numbers import figure, money
from tests.conftest import REPO
from tests.synthetic_runs import runs


def test_glossary_page_is_the_rendered_glossary() -> None:
    page = (REPO / "docs" / "glossary.md").read_text(encoding="utf-8")
    assert page == glossary.render(), ("docs/glossary.md is stale: "
                                       "regenerate it with `python -m llmpack.ui.glossary > docs/glossary.md`")


def test_every_legend_line_fits_80_columns_and_the_two_overheads_have_two_names() -> None:
    for t in glossary.TERMS:
        assert len(glossary.define(t.key)) <= 80, t.key
    names = [t.name for t in glossary.TERMS]
    assert len(names) == len(set(names))
    assert "pipeline overhead" in names and "billed non-compute" in names and "overhead" not in names
    for key in ("delta", "ci", "equivalence_margin", "decided", "projected", "goodput"):  # the lead's verdict words too
        assert glossary.term(key).short


@pytest.mark.parametrize(("usd", "text"), [(0.0133, "$0.0133"), (0.000633, "$0.000633"), (1.5, "$1.50"),
                                           (1234.567, "$1,234.57"), (None, "-"),
                                           # one precision beside each other: $0.200 next to $0.294, never $0.2
                                           (0.2, "$0.200"), (0.294, "$0.294"), (0.011, "$0.0110"), (0.99971, "$1.00")])
def test_money_has_one_format(usd: float | None, text: str) -> None:
    from llmpack.compare.comparison import quantity

    assert money(usd) == text
    assert quantity(usd, "$") == text  # compare's table writes dollars the same way


@pytest.mark.parametrize(("value", "text"),
                         [(5625.648, "5,626"), (12.345, "12.3"), (2.1934, "2.19"), (0.026194, "0.0262"),
                          (900.0, "900"), (0.0, "0")])
def test_figures_at_three_significant_figures(value: float, text: str) -> None:
    assert figure(value) == text


def _run_summary(fuse: str, nproc: int = 1) -> dict:
    s = runs(n=1, paths=("direct",))[0]
    s.update(fuse=fuse, params={"nproc_per_node": nproc} if nproc > 1 else {}, mode="local")
    s["tags"].update({"llmpack.gpu_count": "2", "llmpack.mode": "local"})
    s["artifacts"] = {"model_dir": "runs/x/finetune/model"}
    return s


def _printed(summary: dict, monkeypatch: pytest.MonkeyPatch) -> str:
    console = Console(width=80, file=io.StringIO(), force_terminal=False)
    monkeypatch.setattr(display, "out", console)
    show.summary_table([summary])
    return console.file.getvalue()


def test_run_summary_says_what_it_ran_and_that_a_local_cost_is_projected(monkeypatch: pytest.MonkeyPatch) -> None:
    text = _printed(_run_summary("all"), monkeypatch)
    assert "fused: prepare-data+tokenize+finetune+evaluate+register in 1 process" in " ".join(text.split())
    assert "$0.0486 projected" in text and "0.048600" not in text  # the one money format, never 6 decimals
    assert "projected as if on 2x nvidia-h100-80gb" in " ".join(text.split())
    assert glossary.define("projected") in " ".join(text.split())
    assert max(len(line) for line in text.splitlines()) <= 80
    text = _printed(_run_summary("none", nproc=2), monkeypatch)
    assert "each step in its own process; finetune: 2 processes (ranks) per node on 1 node" in " ".join(text.split())


def test_compare_table_prints_its_terms_from_the_glossary() -> None:
    from llmpack.compare.comparison import comparison

    buf = io.StringIO()
    table.compare_table(comparison("rg-synthetic", ["direct", "kfp"], runs(n=1, paths=("direct", "kfp"))),
                          console=Console(width=80, file=buf, force_terminal=False))
    text = buf.getvalue()
    for key in (*table.COMPARE_TERMS, "projected"):
        assert glossary.define(key) in text, key
