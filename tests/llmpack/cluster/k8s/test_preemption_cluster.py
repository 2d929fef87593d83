"""Preemption on the loopback cluster: the finetune GPU pod is preempted
mid-training (``DisruptionTarget``, deletion), the orchestrator's retry pod resumes from the
checkpoint, and the record says so: one preempted attempt, its waste priced, time to recover.

The preemption is played by :class:`standins.preemption.Preemption` in the fake cluster's
virtual time; everything measured goes through the real clients, the pod watcher and MLflow.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from standins.loopback import ARGO_TOKEN, KFP_TOKEN, LoopbackCluster, client_env
from standins.preemption import Preemption

from components.errors import InputError
from llmpack.cluster.k8s.preemption import parse_preempt

pytestmark = pytest.mark.usefixtures("loopback_env")
PRICE = 4.0  # USD per GPU-hour: every figure below is priced with it


@pytest.fixture()
def preempting(loopback_env: None, tmp_path: Path, tracking_uri: str) -> Any:
    plan = Preemption.parse("finetune@4s")
    with LoopbackCluster(tmp_path, tracking_uri, preempt=plan) as c:
        yield c, plan


def compare_cli(loop: LoopbackCluster, report: Path, *extra: str, preempt: str = "finetune@4s") -> str:
    """``llmpack compare --cluster --preempt finetune@4s`` (and ``extra`` flags) on the loopback cluster, in a
    subprocess; its stdout."""
    import subprocess
    import sys

    env = client_env()
    env.update(KFP_TOKEN=KFP_TOKEN, ARGO_TOKEN=ARGO_TOKEN, HOME=str(report.parent / "home"), COLUMNS="80")
    r = subprocess.run(
        [sys.executable, "-m", "llmpack", "cluster", "compare", "--backends", "kfp,argo,mlflow", "--preempt", preempt,
         "--price-per-gpu-hour", str(PRICE), "--kfp-host", loop.kfp.url, "--argo-host", loop.argo.url,
         "--kubeconfig", str(loop.kubeconfig), "--tracking-uri", loop.tracking_uri, "--poll", "0.05", "--timeout", "60",
         "--report", str(report), *extra],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


@pytest.mark.slow  # a whole compare --cluster of three paths through the CLI (~40 s)
def test_compare_under_preemption_records_one_preempted_attempt_with_its_waste(preempting: Any, tmp_path: Path) -> None:
    loop, plan = preempting
    report = tmp_path / "report"
    stdout = compare_cli(loop, report)
    result = json.loads((report / "report.json").read_text())
    assert result["preempt"] == "finetune@4s"
    for run in result["runs"]:
        assert run["status"] == "succeeded", run
        # llmpack's own eviction (the real-cluster --preempt) stood by: the cluster preempted first, and a
        # fixed moment preempts once (the loopback's clock runs ahead of this machine's)
        assert run["evictions"] == []
        m = run["metrics"]
        done = next(d for (r, _), d in plan.done.items() if r == run["pipeline_run"])
        finetune = [a for a in run["attempts"] if a["step"] == "finetune"]
        assert [a["outcome"] for a in finetune] == ["preempted", "succeeded"], run["orchestrator"]
        assert finetune[0]["reason"] == "PreemptionByScheduler"
        assert finetune[0]["disrupted_at"] == pytest.approx(done["at"])
        # waste = GPU time since the checkpoint + the retry's spin-up to its first step, priced
        lost = done["at"] - done["checkpoint"]
        assert finetune[0]["lost_s"] == pytest.approx(lost, abs=1e-3)
        retry = done["retry"]
        ev = run["events"]["finetune"]  # the last attempt's events: the retry's
        assert finetune[0]["respin_s"] == pytest.approx(ev["first_step"] - retry["started"], abs=1e-3)
        waste_h = (lost + finetune[0]["respin_s"]) / 3600.0
        assert m["preemptions"] == 1
        assert m["preemption_waste_gpu_hours"] == pytest.approx(waste_h, rel=1e-6)
        assert m["preemption_waste_usd"] == pytest.approx(waste_h * PRICE, rel=1e-6)
        assert m["time_to_recover_s"] == pytest.approx(ev["first_step"] - done["at"], abs=1e-3)
        # the preempted pod is a retried attempt, but no failure: the failure retries cost nothing
        assert m["failure_retry_gpu_hours"] == pytest.approx(0.0, abs=1e-9)
        assert m["preempted_gpu_hours"] > m["preemption_waste_gpu_hours"] - finetune[0]["respin_s"] / 3600.0
        # goodput counts the kept steps: the checkpointed part of the first attempt and the retry's
        assert m["kept_train_s"] == pytest.approx(m["train_s"] + done["kept_s"], abs=1e-3)
        # the record in MLflow carries the same figures
        from components.record import tracking

        data = tracking.client(loop.tracking_uri).get_run(run["artifacts"]["mlflow_run_id"]).data
        logged = data.metrics
        assert data.tags["llmpack.preempted_attempts"] == "finetune#0:PreemptionByScheduler"
        assert logged["preemptions"] == 1
        assert logged["preemption_waste_usd"] == pytest.approx(m["preemption_waste_usd"])
    # the same moment on every path: preempted 4 s into the step's run (the Job's: since the step began in its pod)
    assert all(4 <= d["at"] - d["began"] < 5 for d in plan.done.values())  # whole seconds, as Kubernetes stamps them
    assert len(plan.done) == 3
    assert {r["orchestrator"] for r in result["runs"]} == {"kfp", "argo", "mlflow"}
    recover = {r["orchestrator"]: r["metrics"]["time_to_recover_s"] for r in result["runs"]}
    assert recover["mlflow"] > max(recover["kfp"], recover["argo"])  # the Job's next pod reruns the steps before
    look_at_the_report(result, report, stdout, tmp_path)


def look_at_the_report(result: dict[str, Any], out: Path, stdout: str, tmp_path: Path) -> None:
    """The report's preemption section (markdown, HTML, the terminal's 80 columns); a Chromium screenshot of
    it with LLMPACK_SCREENSHOT=1 (``make report-screenshot``'s switch; written to LLMPACK_SCREENSHOT_OUT)."""
    import os
    import shutil
    import subprocess

    md = (out / "report.md").read_text()
    section = md.split("## Preemption (--preempt finetune@4s)")[1].split("\n## ")[0]
    table = [line for line in section.splitlines() if line.startswith("| ")]
    assert [line.split(" | ")[0] for line in table[1:]] == ["| kfp", "| argo", "| mlflow"], section
    for run in result["runs"]:
        waste = f"${run['metrics']['preemption_waste_usd']:.4f}"
        assert waste in section  # one run per path: the median is the run's
    assert md.count(" first attempt was preempted after") == 3  # the retried attempts say which kind (the Job: main)
    page = (out / "report.html").read_text()
    assert "Preemption (--preempt finetune@4s)" in page and "time to recover" in page
    lines = [line for line in stdout.splitlines() if " preempted 1 · recover " in line]
    assert [line.split()[0] for line in lines] == ["kfp", "argo", "mlflow"], stdout
    assert all(len(line) <= 80 for line in stdout.splitlines()), stdout
    if os.environ.get("LLMPACK_SCREENSHOT"):
        browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
        assert browser, "install Chromium (apt-get install -y chromium)"
        png = Path(os.environ.get("LLMPACK_SCREENSHOT_OUT", tmp_path / "preemption.png"))
        png.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(out / "report.html", png.with_suffix(".html"))
        png.with_suffix(".txt").write_text(stdout)  # the terminal table, as printed at 80 columns
        subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", f"--screenshot={png}",
                        "--window-size=1280,3600", (out / "report.html").as_uri()], check=True, capture_output=True,
                       timeout=120)


def test_preempt_spec_is_checked() -> None:
    steps = ("prepare-data", "finetune")
    assert str(parse_preempt("finetune@30s", steps)) == "finetune@30s"
    assert parse_preempt("finetune@2m", steps).at_s == 120
    spec = parse_preempt("finetune@rate=0.5/h,seed=7", steps)
    assert spec.rate_per_h == 0.5 and spec.seed == 7
    assert spec.moments(3600 * 20) == parse_preempt("finetune@rate=0.5/h,seed=7", steps).moments(3600 * 20)
    for bad, says in (("finetune", "STEP@DURATION"), ("train@30s", "no step 'train'"), ("finetune@0s", "above 0"),
                      ("finetune@soon", "a duration"), ("finetune@rate=0/h", "above 0")):
        with pytest.raises(InputError, match=says) as err:
            parse_preempt(bad, steps)
        assert "\n" not in str(err.value)
