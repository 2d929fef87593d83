"""``llmpack compare``: the JSON schema, the statistics, the report, and the instrument's accuracy."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from components.errors import InputError
from llmpack.compare.comparison import (
    DEFAULT_BACKENDS,
    GANG_METRICS,
    comparison,
    parse_backends,
    percentile,
    summarize_runs,
)
from llmpack.compare.rounds import parse_start_delays
from llmpack.report import break_even, parse_control_plane, write_report
from llmpack.run.local import RunOptions, run_pipeline
from tests.conftest import llmpack
from tests.synthetic_runs import runs as synthetic_runs

FAST = ("--max-steps", "3")


def test_percentile_is_numpy_linear() -> None:
    import numpy as np

    xs = [3.0, 1.0, 4.0, 1.5, 9.0, 2.6]
    for q in (50, 90, 99):
        assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))


def test_p99_is_not_pretended_below_ten_runs() -> None:
    runs = [{"orchestrator": "kfp", "status": "succeeded", "metrics": {"total_s": float(i)}} for i in range(9)]
    s = summarize_runs(runs)["kfp"]["total_s"]
    assert s["n"] == 9 and s["p99"] is None and "p99 not estimated" in s["p99_note"]
    runs.append({"orchestrator": "kfp", "status": "succeeded", "metrics": {"total_s": 9.0}})
    assert summarize_runs(runs)["kfp"]["total_s"]["p99"] == pytest.approx(8.91)


def _priced(orch: str, cost: float, n: int = 5) -> list[dict]:
    # n runs of one training GPU-hour each, costs spread by +-1% around ``cost``.
    return [{"orchestrator": orch, "status": "succeeded",
             "metrics": {"cost_usd": cost * (1 + (i - n // 2) / 100), "train_s": 3600.0},
             "tags": {"llmpack.gpu_count": "1"}} for i in range(n)]


def test_break_even_finds_where_the_cheapest_flips() -> None:
    # kfp: $500/month control plane, $4/training GPU-hour; argo: $100/month, $6/training GPU-hour.
    be = break_even(_priced("kfp", 4.0) + _priced("argo", 6.0), {"kfp": 500.0, "argo": 100.0})
    assert be["significant"] is True
    assert be["segments"][0]["cheapest"] == "argo"
    assert be["segments"][0]["to_gpu_hours"] == pytest.approx(200.0)
    assert be["segments"][1]["cheapest"] == "kfp"
    assert "argo is cheapest up to 200 training GPU-hours/month, then kfp" in be["sentence"]
    assert "kfp $500/month" in be["sentence"]


def test_break_even_within_noise_is_not_claimed() -> None:
    # 19.99 vs 19.82 $/GPU-h with 1% noise and one run each: the case. No break-even sentence.
    be = break_even(_priced("kfp", 19.99, n=1) + _priced("argo", 19.82, n=1), {"kfp": 450.0, "argo": 120.0})
    assert be["significant"] is False and not be["segments"]
    assert be["sentence"].startswith("No break-even claimed") and "too few runs" in be["sentence"]
    noisy = [dict(r, metrics={"cost_usd": c, "train_s": 3600.0}) for r, c in
             zip(_priced("kfp", 1.0) + _priced("argo", 1.0),
                 [20.0, 19.5, 20.5, 19.8, 20.2, 19.9, 20.4, 19.6, 20.1, 19.7], strict=True)]
    be = break_even(noisy, {"kfp": 450.0, "argo": 120.0})
    assert be["significant"] is False and "no clear difference" in be["sentence"]
    assert "control-plane cost decides: argo ($120/month)" in be["sentence"]


def test_a_single_paths_control_plane_cost_is_used() -> None:
    be = break_even(_priced("kfp", 4.0) + _priced("argo", 6.0), {"kfp": 450.0})
    assert be is not None and be["assumed_zero"] == ["argo"] and be["control_plane_usd_month"]["kfp"] == 450.0
    assert ("argo $0/month (not given: $0)" in be["sentence"]
            and "cheapest up to 225 training GPU-hours/month" in be["sentence"])


@pytest.mark.parametrize(("flag", "message"), [
    ("airflow=100", "unknown orchestrator 'airflow'"),
    ("Argo=120", "did you mean 'argo'"),
    ("kfp=-5", "must be >= 0"),
    ("kfp=lots", "is not a number"),
    ("kfp=nan", "is not a number"),
    ("kfp", "expected ORCHESTRATOR=USD_PER_MONTH"),
    ("direct=0", "direct has no control plane"),
])
def test_bad_control_plane_costs_are_refused_before_any_run(flag: str, message: str, tmp_path: Path) -> None:
    with pytest.raises(InputError, match=re.escape(message)):
        parse_control_plane([flag])
    r = llmpack("compare", "--control-plane-cost", flag, "--output-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert r.returncode == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "runs").exists() and not (tmp_path / "llmpack-report").exists()


def test_a_cost_for_a_path_not_compared_is_refused(tmp_path: Path) -> None:
    r = llmpack("compare", "--backends", "direct,argo", "--control-plane-cost", "kfp=450",
                "--output-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert r.returncode == 2 and "kfp is not among the compared paths (direct, argo)" in r.stderr
    assert not (tmp_path / "runs").exists()


def test_inject_start_delay_learns_the_per_path_form() -> None:
    assert parse_start_delays("2", ["direct", "argo"]) == {"direct": 2.0, "argo": 2.0}
    assert parse_start_delays("argo=3", ["direct", "argo"]) == {"argo": 3.0}
    assert parse_start_delays("argo=3,direct=0.5", ["direct", "argo"]) == {"argo": 3.0, "direct": 0.5}
    assert parse_start_delays(None, ["direct"]) == {}
    for bad, message in (("kfp=3", "not among the compared paths"), ("argo=x", "expected SECONDS"),
                         ("-1", ">= 0"), ("2,argo=3", "either SECONDS")):
        with pytest.raises(InputError, match=message):
            parse_start_delays(bad, ["direct", "argo"])


def test_a_second_compare_never_silently_replaces_a_report(tmp_path: Path) -> None:
    rep = tmp_path / "rep"
    rep.mkdir()
    (rep / "report.json").write_text("{}")
    r = llmpack("compare", "--report", str(rep), "--output-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert r.returncode == 2 and "holds a report already; pass --force" in r.stderr, r.stderr
    assert not (tmp_path / "runs").exists() and (rep / "report.json").read_text() == "{}"
    f = tmp_path / "afile"
    f.write_text("x")
    r = llmpack("compare", "--report", str(f / "rep"), "--output-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert r.returncode == 2 and "cannot write a report there" in r.stderr, r.stderr
    assert not (tmp_path / "runs").exists()


def test_default_reports_are_timestamped_and_latest_points_at_the_newest(tmp_path: Path) -> None:
    from llmpack.report import target

    result = comparison("rg-synthetic", ["direct", "argo"], synthetic_runs(n=2, paths=("direct", "argo")))
    old = target.DEFAULT_REPORTS
    target.DEFAULT_REPORTS = tmp_path / "llmpack-report"
    try:
        first = target.write_report_to(result, None, {}, force=False)
        second = target.write_report_to(result, None, {}, force=False)
    finally:
        target.DEFAULT_REPORTS = old
    assert first != second and first.exists() and second.exists()
    assert (tmp_path / "llmpack-report" / "latest").resolve() == second.parent.resolve()


def test_unknown_backend_and_bad_repeats_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="unknown backend 'nosuch'"):
        parse_backends("kfp,nosuch")
    for args, message in (
        (("--repeats", "0"), "--repeats 0: must be at least 1"),
        (("--backends", "kfp,nosuch"), "--backends: unknown backend 'nosuch'"),
    ):
        r = llmpack("compare", *args, "--output-dir", str(tmp_path / "runs"), cwd=tmp_path)
        assert r.returncode == 2 and r.stderr.strip().startswith(f"llmpack: error: {message}"), r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
        assert not (tmp_path / "runs").exists()
    f = tmp_path / "afile"
    f.write_text("x")
    r = llmpack("compare", "--report", str(f), cwd=tmp_path)
    assert r.returncode == 2 and "exists and is not a directory" in r.stderr and f.read_text() == "x"


def test_a_tracking_uri_that_is_not_mlflow_is_one_line_before_any_run(tmp_path: Path) -> None:
    """A server that answers, but with 404 to MLflow's API (a wrong URL), is bad input: exit 2 before any step.

    (A server that does not answer is an outage, not bad input: the run goes on and says how to
    send its records later; tests/components/test_tracking_outage.py.)
    """
    import http.server
    import threading

    class NotMLflow(http.server.BaseHTTPRequestHandler):
        def _404(self) -> None:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_POST = _404

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotMLflow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        uri = f"http://127.0.0.1:{server.server_address[1]}"
        r = llmpack("run", "--tracking-uri", uri, "--output-dir", str(tmp_path / "runs"), cwd=tmp_path)
    finally:
        server.shutdown()
    assert r.returncode == 2, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("llmpack: error:") and uri in lines[0], r.stderr
    assert not (tmp_path / "runs").exists()


def test_report_for_a_missing_run_group(tmp_path: Path, tracking_uri: str) -> None:
    from components.record import tracking

    tracking.experiment_id(tracking.client(tracking_uri))  # the store exists; the group does not
    r = llmpack("report", "--run-group", "rg-nope", "--tracking-uri", tracking_uri, "--out", str(tmp_path / "rep"),
                cwd=tmp_path)
    assert r.returncode == 2 and "run group 'rg-nope': no llmpack runs" in r.stderr
    assert not (tmp_path / "rep").exists()


@pytest.fixture(scope="module")
def repeated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("compare")
    r = llmpack("compare", "--repeats", "3", "--json", *FAST, "--report", str(root / "report"),
                "--control-plane-cost", "kfp=450", "--control-plane-cost", "argo=120",
                "--control-plane-cost", "mlflow=200",
                "--tracking-uri", f"sqlite:///{root / 'mlflow.db'}", cwd=root, timeout=1800)
    assert r.returncode == 0, r.stderr[-3000:]
    return root, json.loads(r.stdout)


@pytest.mark.slow
def test_compare_json_schema(repeated: tuple[Path, dict]) -> None:
    _, out = repeated
    assert set(out) >= {"run_group", "runs", "summary", "percentile_method"}
    assert len(out["runs"]) == 3 * len(DEFAULT_BACKENDS)
    assert set(out["summary"]) == set(DEFAULT_BACKENDS)
    for run in out["runs"]:
        assert run["run_group"] == out["run_group"] and run["status"] == "succeeded"
        assert set(run) >= {"pipeline_run", "orchestrator", "mode", "metrics", "tags", "artifacts"}
        m = run["metrics"]
        assert m["time_to_first_step_s"] > m["spinup_s"] > 0
        gpus = int(run["tags"]["llmpack.gpu_count"])
        price = float(run["tags"]["llmpack.price_per_gpu_hour"])
        billed_h = m["gpu_hours"] / gpus
        assert m["cost_usd"] == pytest.approx(gpus * billed_h * price, rel=1e-9)
    for orch, metrics in out["summary"].items():
        for name, stats in metrics.items():
            assert set(stats) >= {"p50", "p90", "p99", "n"}, (orch, name)
            if name in GANG_METRICS:  # measured for a TrainJob gang on a cluster only: none locally
                assert stats["n"] == 0 and stats["p50"] is None, (orch, name)
                continue
            assert stats["n"] == 3 and stats["p99"] is None


@pytest.mark.slow
def test_all_paths_give_identical_weights_and_metrics(repeated: tuple[Path, dict]) -> None:
    _, out = repeated
    weights = {Path(r["artifacts"]["model_dir"], "adapter", "adapter_model.safetensors").read_bytes()
               for r in out["runs"]}
    assert len(weights) == 1, "every path and repeat must produce byte-identical adapter weights"
    assert len({(r["metrics"]["eval_loss"], r["metrics"]["base_eval_loss"]) for r in out["runs"]}) == 1


@pytest.mark.slow
def test_report_files_and_rebuild_from_mlflow(repeated: tuple[Path, dict]) -> None:
    root, out = repeated
    rep = root / "report"
    for name in ("report.md", "report.html", "report.json", "timeline.png", "spinup_boxplot.png", "cost_per_run.png"):
        assert (rep / name).stat().st_size > 0, name
    html = (rep / "report.html").read_text()
    assert "data:image/png;base64," in html and "http://" not in html and "https://" not in html
    md = (rep / "report.md").read_text()
    # Three runs per path are too few for a cost verdict, so no break-even may be claimed.
    assert "No break-even claimed" in md and "too few runs" in md
    assert "cheapest up to" not in md and "cheapest at every volume" not in md
    rebuilt = root / "rebuilt"
    r = llmpack("report", "--run-group", out["run_group"], "--tracking-uri", f"sqlite:///{root / 'mlflow.db'}",
                "--out", str(rebuilt), cwd=root)
    assert r.returncode == 0, r.stderr
    again = json.loads((rebuilt / "report.json").read_text())
    assert len(again["runs"]) == len(out["runs"])
    for orch in DEFAULT_BACKENDS:
        assert again["summary"][orch]["spinup_s"]["p50"] == pytest.approx(out["summary"][orch]["spinup_s"]["p50"])
    assert {m: {o: e["verdict"] for o, e in p.items()} for m, p in again["verdicts"].items()} == \
        {m: {o: e["verdict"] for o, e in p.items()} for m, p in out["verdicts"].items()}
    # issue 52: the compare's recommendation, --repeats and --warmup come back too (from its recorded flags)
    assert {k: again[k] for k in ("recommendation", "repeats", "warmup")} == \
        {k: out[k] for k in ("recommendation", "repeats", "warmup")} and out["warmup"] == 1


@pytest.mark.slow  # whole runs on two paths: the slow tier
def test_a_failed_path_keeps_the_others(tmp_path: Path) -> None:
    # prepare-data fails every attempt (data of one prompt is refused up front since Issue 52: exit 2, no run)
    env = {**os.environ, "LLMPACK_INJECT_FAILURES": "prepare-data=99"}
    r = llmpack("compare", "--backends", "direct,argo", "--json", *FAST, "--report", str(tmp_path / "rep"),
                "--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}", cwd=tmp_path, env=env, timeout=600)
    assert r.returncode == 1
    out = json.loads(r.stdout)
    assert {f["orchestrator"] for f in out["failed"]} == {"direct", "argo"}
    assert all("failed on purpose" in f["error"] for f in out["failed"]), out["failed"]
    assert (tmp_path / "rep" / "report.html").exists()


@pytest.mark.slow
@pytest.mark.parametrize("backend", DEFAULT_BACKENDS)
def test_injected_start_delay_reaches_the_finetune_step_on_every_path(backend: str, tmp_path: Path,
                                                                      tracking_uri: str) -> None:
    """A delay planted through each orchestrator reaches the finetune process and moves its recorded start.

    The injection sleeps inside the step process and records the start that much later (see
    components/runtime.py), so the planted delay is exact by construction; what can break is the
    way there: the variable must cross kfp.local, the Argo executor and ``mlflow run`` into the
    finetune process, the step must log what it slept, and the derived spin-up must contain it.
    One run per path; nothing here compares two runs' timings, so machine load cannot fail it
    (the paired timing figures are benchmarks/injection_bias.py's job).
    """
    delay = 2.0
    s = run_pipeline(RunOptions(backend=backend, max_steps=1, output_dir=tmp_path, tracking_uri=tracking_uri),
                     env={"LLMPACK_INJECT_START_DELAY": f"finetune={delay}"})
    assert s["status"] == "succeeded", s["error"]
    records = [json.loads(line) for line in Path(s["artifacts"]["events_file"]).read_text().splitlines()]
    slept = {(r["step"], r["name"]): r["value"] for r in records
             if r["kind"] == "metric" and r["name"] == "injected_start_delay_s"}
    assert list(slept) == [("finetune", "injected_start_delay_s")], slept
    assert delay <= slept["finetune", "injected_start_delay_s"] < delay + 0.5
    assert s["metrics"]["spinup_s"] >= slept["finetune", "injected_start_delay_s"]
    ev = s["events"]["finetune"]
    assert ev["process_started"] < ev["model_loaded"] < ev["first_step"] < ev["finished"]


def test_injection_moves_the_recorded_start_by_what_was_slept(tmp_path: Path) -> None:
    """The step process records its start the slept seconds after the OS start; unplanted steps are untouched."""
    got = {}
    for delay in (None, 1.5):
        env = {**os.environ, "LLMPACK_MLFLOW_LOGGING": "0"}
        if delay:
            env["LLMPACK_INJECT_START_DELAY"] = f"prepare-data={delay},finetune=9"
        out = tmp_path / f"out-{delay}"
        before = time.time()
        r = subprocess.run([sys.executable, "-m", "components.run", "components.steps.prepare_data:prepare_data",
                            "--output", f"dataset={out}", "--param", "builtin_size=50"],
                           env=env, capture_output=True, text=True, timeout=120)
        after = time.time()
        assert r.returncode == 0, r.stderr
        recs = [json.loads(line) for line in (out / "llmpack-events.jsonl").read_text().splitlines()]
        got[delay] = ({r["name"]: r["value"] for r in recs if r["kind"] == "event"},
                      {r["name"]: r["value"] for r in recs if r["kind"] == "metric"}, before, after)
    base_ev, base_m, _, _ = got[None]
    ev, m, before, after = got[1.5]
    assert "injected_start_delay_s" not in base_m
    assert 1.5 <= m["injected_start_delay_s"] < 1.5 + 0.5  # what was slept: a loaded machine oversleeps
    # The OS start lies between before and after the spawn; the recorded start is that plus the sleep.
    assert before + m["injected_start_delay_s"] - 0.05 <= ev["process_started"] <= after
    assert ev["process_started"] < ev["finished"]


def test_report_is_atomic_and_replaces_an_old_one_only_when_asked(tmp_path: Path) -> None:
    runs = [{"orchestrator": "kfp", "pipeline_run": "kfp-1", "status": "succeeded", "submitted_at": 0.0,
             "metrics": {"spinup_s": 1.0, "time_to_first_step_s": 2.0, "total_s": 3.0, "cost_usd": 0.1},
             "tags": {"llmpack.gpu_count": "1", "llmpack.price_per_gpu_hour": "6.88", "llmpack.price_source": "x"},
             "events": {"finetune": {"process_started": 1.0, "model_loaded": 1.5, "first_step": 2.0, "finished": 3.0}}}]
    result = {"run_group": "rg", "runs": runs, "failed": [], "percentile_method": "t7", "summary": summarize_runs(runs)}
    out = tmp_path / "rep"
    out.mkdir()
    (out / "report.json").write_text("{}")  # an earlier llmpack report
    (out / "stale.txt").write_text("old")
    with pytest.raises(InputError, match="holds a report already"):
        write_report(result, out)
    assert (out / "stale.txt").exists()
    write_report(result, out, replace=True)
    assert not (out / "stale.txt").exists() and (out / "report.html").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_report_never_replaces_a_directory_that_is_not_a_report(tmp_path: Path) -> None:
    runs = [{"orchestrator": "kfp", "pipeline_run": "kfp-1", "status": "succeeded", "submitted_at": 0.0,
             "metrics": {"total_s": 3.0}, "tags": {}, "events": {}}]
    result = {"run_group": "rg", "runs": runs, "failed": [], "percentile_method": "t7", "summary": summarize_runs(runs)}
    precious = tmp_path / "notes"
    precious.mkdir()
    (precious / "thesis.txt").write_text("keep me")
    with pytest.raises(InputError, match="not empty and not an llmpack report"):
        write_report(result, precious)
    assert (precious / "thesis.txt").read_text() == "keep me"
