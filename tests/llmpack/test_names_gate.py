"""The parameter gate for names (components.names) and the late-failing values it catches early.

The one-line, exit-2 cases through ``llmpack`` and the local runners' own entry points are rows of
``tests/llmpack/test_hostile_input.py`` (ids ``gate-*``). Here: the rules themselves, ``mlflow
run`` (the real MLflow CLI, whose own exit code is 1 when its entry point fails), the record
lookup's filter, ``report.md`` with hostile tag values, and ``sync`` with garbage JSONL lines.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from components.errors import InputError
from components.names import check_values, filter_literal, identity_problem, model_name_problem
from tests.conftest import REPO


@pytest.mark.parametrize("value", ["../../X", "..", ".hidden", "it's", "a/b", "a\nb", "A-upper", "x" * 64, "a\0b"])
def test_identity_refuses_what_would_escape_a_directory_or_a_filter(value: str) -> None:
    assert identity_problem(value) is not None
    with pytest.raises(InputError, match="pipeline_run"):
        check_values({"pipeline_run": value}, "--param")


@pytest.mark.parametrize("value", ["", "mlflow-0123456789ab", "direct-20261204-230644-4f6db9", "x" * 63])
def test_identity_takes_every_id_the_paths_make(value: str) -> None:
    assert identity_problem(value) is None


@pytest.mark.parametrize("value", [".", ".x", "a\\b", "x/", "/abs", "a\r", "-lead", "trail-", "ü"])
def test_identity_is_at_least_a_path_segment_rule(value: str) -> None:
    """No separator, no dot-name, no control character, bounded: what a directory name needs, and more."""
    assert identity_problem(value) is not None


@pytest.mark.parametrize(("value", "ok"), [("team/llama", False), ("a:b", False), ("  ", False), ("..", False),
                                           ("m" * 257, False), ("x\ny", False), ("llmpack-finetuned", True),
                                           ("Team Llama v2", True), ("m" * 256, True)])
def test_model_name_is_mlflows_registered_model_rule(value: str, ok: bool) -> None:
    assert (model_name_problem(value) is None) is ok


def test_the_registry_agrees_with_the_rule_on_what_it_refuses(tmp_path: Path) -> None:
    """MLflow's own check refuses what the gate refuses (so refusing up front loses no valid name)."""
    from mlflow.exceptions import MlflowException
    from mlflow.utils.validation import _validate_model_name

    for bad in ("team/llama", "a:b", "..", "x/../y"):
        assert model_name_problem(bad) is not None
        with pytest.raises(MlflowException):
            _validate_model_name(bad)


def test_filter_values_are_quoted_or_refused() -> None:
    assert filter_literal("direct-1") == "'direct-1'"
    for bad in ("it's", 'say "x"', "a`b", "a\\b", "a\nb"):
        with pytest.raises(InputError, match="cannot be searched for"):
            filter_literal(bad)


def test_the_record_lookup_never_pastes_a_quote_into_a_filter(tmp_path: Path) -> None:
    from components.record import tracking

    mc = tracking.client(f"sqlite:///{tmp_path / 'm.db'}")
    assert tracking.find_pipeline_run(mc, "no-such-run") is None
    with pytest.raises(InputError, match="cannot be searched for"):
        tracking.find_pipeline_run(mc, "x' or tags.`llmpack.record` = 'pipeline")


@pytest.mark.slow
@pytest.mark.parametrize("value", ["../../X", "it's"], ids=["dotdot", "apostrophe"])
def test_mlflow_run_refuses_a_pipeline_run_that_escapes(value: str, tmp_path: Path) -> None:
    """``mlflow run ... -P pipeline_run=../../X -P artifacts_dir=a/A``: one llmpack line, nothing outside, no step."""
    mlflow = shutil.which("mlflow", path=str(Path(sys.executable).parent))
    assert mlflow, "the mlflow CLI is installed with llmpack"
    work = tmp_path / "w"
    (work / "a").mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLMPACK_", "MLFLOW_"))}
    env.update(PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 'm.db'}")
    proc = subprocess.run([mlflow, "run", str(REPO / "mlflow_projects" / "finetune"), "--env-manager", "local",
                           "-P", f"pipeline_run={value}", "-P", "artifacts_dir=a/A"], cwd=work, env=env, text=True,
                          capture_output=True, timeout=300)
    ours = [line for line in proc.stderr.splitlines() if "llmpack: error:" in line]
    assert proc.returncode != 0
    assert ours == [f"llmpack: error: parameter pipeline_run: {value!r} must be a DNS-1123 label (lower-case letters, "
                    "digits, '-'; at most 63): it names the run's directory and its record"], proc.stderr
    assert "Traceback" not in proc.stderr
    # nothing made: no run directory, no X two levels up, no step log
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")
                  if "m.db" not in p.name and "mlruns" not in p.parts) == [Path("w"), Path("w/a")]


def test_report_md_escapes_tag_values_and_errors(tmp_path: Path) -> None:
    from llmpack.compare.comparison import comparison
    from llmpack.report import write_report
    from tests.synthetic_runs import runs

    planted = runs({"argo": 3.0}, n=2)
    for r in planted:
        r["tags"]["llmpack.price_source"] = "<script>alert(1)</script> | col"
    planted[0].update(status="failed", error="<img src=x onerror=alert(1)>\n# not a heading [x](javascript:y)")
    out = write_report(comparison("rg-synthetic", ["direct", "kfp", "argo", "mlflow"], planted), tmp_path / "rep")
    md = (out / "report.md").read_text()
    assert "<script>" not in md and "<img" not in md
    assert "&lt;script&gt;alert\\(1\\)&lt;/script&gt; \\| col" in md
    assert not any(line.startswith("# not a heading") for line in md.splitlines())
    assert "\\[x\\]\\(javascript:y\\)" in md  # Markdown's link syntax escaped whole (llmpack.report.escape)


def _run_dir(root: Path, lines: list[str]) -> Path:
    run = root / "direct-1"
    (run / "finetune").mkdir(parents=True)
    base = {"kind": "event", "step": "finetune", "run_group": "rg-1", "pipeline_run": "direct-1",
            "orchestrator": "direct", "mode": "local", "attempt": 0}
    good = [json.dumps({**base, "key": f"direct-1/finetune/event/{n}", "name": n, "value": 10.0 + i})
            for i, n in enumerate(("process_started", "model_loaded", "finished"))]
    (run / "events.jsonl").write_text("\n".join(good + lines) + "\n")
    from llmpack.run.orphans import seal

    (run / "summary.json").write_text(json.dumps(seal(run, {  # sealed with the user's key, as llmpack writes it
        "run_group": "rg-1", "pipeline_run": "direct-1", "orchestrator": "direct", "mode": "local",
        "status": "succeeded", "submitted_at": 1.0, "finished_at": 20.0, "metrics": {}, "tags": {}, "params": {},
        "tracking": "not sent"})))
    return run


def _sync(run: Path, uri: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("LLMPACK_", "MLFLOW_")) or k == "LLMPACK_SIGNING_KEY_FILE"}  # the test's own key
    return subprocess.run([sys.executable, "-m", "llmpack", "sync", str(run), "--tracking-uri", uri], cwd=run.parent,
                          env={**env, "PYTHONPATH": str(REPO)}, text=True, capture_output=True, timeout=180)


def test_sync_counts_and_reports_garbage_lines(tmp_path: Path) -> None:
    run = _run_dir(tmp_path, ["not json at all", '{"key": "cut short', "[1, 2]", '{"key": 1}'])
    result = _sync(run, f"sqlite:///{tmp_path / 'm.db'}")
    assert result.returncode == 0, result.stderr
    assert "3 record(s) sent" in result.stdout and "4 line(s) skipped" in result.stdout, result.stdout


def test_sync_rejects_only_the_event_whose_name_has_a_newline(tmp_path: Path) -> None:
    bad = json.dumps({"key": "direct-1/finetune/event/evil\n", "kind": "event", "step": "finetune", "name": "evil\n",
                      "value": 12.5, "run_group": "rg-1", "pipeline_run": "direct-1", "orchestrator": "direct",
                      "mode": "local", "attempt": 0})
    run = _run_dir(tmp_path, [bad])
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    result = _sync(run, uri)
    assert result.returncode == 0, result.stderr
    assert "3 record(s) sent" in result.stdout and "1 line(s) skipped" in result.stdout, result.stdout
    from mlflow.tracking import MlflowClient

    run_id = json.loads((run / "summary.json").read_text())["artifacts"]["mlflow_run_id"]
    metrics = MlflowClient(tracking_uri=uri).get_run(run_id).data.metrics
    assert {"event.finetune.process_started", "event.finetune.model_loaded", "event.finetune.finished"} <= set(metrics)
    assert not any("evil" in k for k in metrics)
