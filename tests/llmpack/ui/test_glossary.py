"""One glossary (llmpack.ui.glossary) behind docs/glossary.md and every legend; money written one way."""

from __future__ import annotations

import io
from pathlib import Path

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
    table.compare_table(comparison("rg-synthetic", ["direct", "kfp"], runs(n=5, paths=("direct", "kfp"))),
                          console=Console(width=80, file=buf, force_terminal=False))
    text = buf.getvalue()
    assert "p50" in text  # the table the legend explains
    for key in (*table.COMPARE_TERMS, "projected"):
        assert glossary.define(key) in text, key


def test_a_compare_of_one_round_prints_no_legend_without_its_table() -> None:
    """newcomer5: a --budget compare of 1 round printed the terms' legend but no table (one run per path is a
    line and the dimmed "not judged" figures): the legend comes only with the table it explains."""
    from llmpack.compare.comparison import comparison

    buf = io.StringIO()
    table.compare_table(comparison("rg-synthetic", ["direct", "kfp"], runs(n=1, paths=("direct", "kfp"))),
                        console=Console(width=80, file=buf, force_terminal=False))
    text = buf.getvalue()
    assert "runs per path: direct 1 · kfp 1" in text and "not judged" in text and "p50" not in text
    for key in (*table.COMPARE_TERMS, "projected"):
        assert glossary.define(key) not in text, key


def test_a_run_without_training_shows_no_training_rows_terms_or_gpu_price(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 52: a pipeline of one's own with no training got eval-loss and tokens/s rows of dashes, their
    legend lines, and "cost projected as if on 0x none at $unknown/GPU-h"."""
    s = _run_summary("none")
    s["metrics"] = {"total_s": 0.37, "pipeline_overhead_s": 0.085}
    s["tags"].update({"llmpack.gpu_count": "0", "llmpack.gpu_type": "none", "llmpack.price_per_gpu_hour": "unknown"})
    s["artifacts"] = {}
    text = " ".join(_printed(s, monkeypatch).split())
    assert "pipeline overhead s" in text and glossary.define("pipeline_overhead") in text
    for word in ("eval loss", "tokens/s", "goodput", "spin-up", "0x none", "$unknown", "model: -"):
        assert word not in text, (word, text)
    assert "no step asks for a GPU: price n/a, no cost" in text


def test_a_failed_steps_error_line_names_its_log_and_debug_prints_its_end(tmp_path: Path) -> None:
    from llmpack.run.show import failed_step_log

    run_dir = tmp_path / "direct-1.failed"
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "logs" / "boom.log").write_text("Traceback...\nValueError: no column 'label'\n")
    summary = {"failed_step": "boom", "artifacts": {"run_dir": str(run_dir)}}
    assert failed_step_log(summary) == run_dir / "logs" / "boom.log"
    assert failed_step_log({**summary, "failed_step": "../../etc/passwd"}) is None  # a name, never a path
    (run_dir / "logs" / "boom.log").unlink()
    (run_dir / "logs" / "boom.log").symlink_to("/etc/hostname")
    assert failed_step_log(summary) is None


def test_the_mlflow_paths_failed_step_names_the_steps_own_log_not_mlflow_log(tmp_path: Path) -> None:
    """newcomer5: the mlflow path's error named ``logs/mlflow.log`` (mlflow run's whole output) while the others
    name ``logs/<step>.log``; its driver writes the step's own under ``artifacts/<pipeline_run>/logs/``."""
    from llmpack.run.show import failed_step_log

    run_dir = tmp_path / "mlflow-1.failed"
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "logs" / "mlflow.log").write_text("mlflow run ...\n")
    own = run_dir / "artifacts" / "mlflow-1" / "logs" / "strict-check.log"
    own.parent.mkdir(parents=True)
    own.write_text("Traceback...\nRuntimeError: nc5: too many rows\n")
    summary = {"failed_step": "strict-check", "orchestrator": "mlflow", "pipeline_run": "mlflow-1",
               "artifacts": {"run_dir": str(run_dir)}}
    assert failed_step_log(summary) == own
    assert failed_step_log({**summary, "pipeline_run": ".."}) == run_dir / "logs" / "mlflow.log"
    own.unlink()  # mlflow run failed before the step wrote its log: the runner's
    assert failed_step_log(summary) == run_dir / "logs" / "mlflow.log"
