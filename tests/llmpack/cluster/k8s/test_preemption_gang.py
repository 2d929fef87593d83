"""A 2-node TrainJob gang preempted on the loopback cluster: one node pod is preempted
mid-training (``DisruptionTarget``, deletion), JobSet restarts the gang whole (every node pod
created again), the ranks resume from the run's checkpoint, and the record shows one preempted
attempt, the gang's, with its waste priced over all its node pods.

Played by :mod:`standins.gang_preemption` in virtual time; measured through the real clients, the
pod watcher and MLflow, by ``llmpack compare --cluster --nodes 2 --preempt`` in a subprocess.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from standins.gang_preemption import GANG
from standins.loopback import LoopbackCluster
from standins.preemption import Preemption
from test_preemption_cluster import PRICE, compare_cli

pytestmark = pytest.mark.usefixtures("loopback_env")
NODES, GPUS = 2, 4
# 5 s after the gang's last node pod started: its ranks have trained about 2.5-3.5 s, past the first
# checkpoint (every 1.5 s of training), so the waste is the time since that checkpoint, not the whole run.
PREEMPT = "finetune@5s"


@pytest.fixture()
def preempting(loopback_env: None, tmp_path: Path, tracking_uri: str) -> Any:
    plan = Preemption.parse(PREEMPT)
    with LoopbackCluster(tmp_path, tracking_uri, preempt=plan) as c:
        yield c, plan


@pytest.mark.slow  # a whole compare --cluster --nodes 2 of three paths through the CLI
def test_a_preempted_gang_is_restarted_whole_and_priced_as_one_attempt(preempting: Any, tmp_path: Path) -> None:
    loop, plan = preempting
    report = tmp_path / "report"
    stdout = compare_cli(loop, report, "--nodes", str(NODES), "--gpus", str(GPUS), preempt=PREEMPT)
    result = json.loads((report / "report.json").read_text())
    assert {r["orchestrator"] for r in result["runs"]} == {"kfp", "argo", "mlflow"}
    for run in result["runs"]:
        assert run["status"] == "succeeded", run
        assert run["evictions"] == []  # the cluster preempted first: llmpack's own eviction stood by
        done = plan.done[(run["pipeline_run"], GANG)]
        gang_pods = {p["pod"]: p for p in run["pods"] if p.get("gang")}
        assert set(gang_pods) == set(done["old"]) | set(done["new"])  # every node pod, twice: the gang restarted whole
        assert len(done["old"]) == len(done["new"]) == NODES
        victims = [p for p in gang_pods.values() if p.get("disruption")]
        assert [v["disruption"] for v in victims] == ["PreemptionByScheduler"]  # one node pod was preempted
        assert victims[0]["disrupted_at"] == pytest.approx(done["at"])
        assert all(gang_pods[p]["phase"] == "Succeeded" for p in done["new"])
        gangs = [a for a in run["attempts"] if a.get("gang")]
        assert [a["outcome"] for a in gangs] == ["preempted", "succeeded"], run["orchestrator"]
        # the launcher pod is no retry: it ran on, one attempt, succeeded
        assert [a["outcome"] for a in run["attempts"] if a["step"] == "finetune" and not a.get("gang")] == ["succeeded"]
        preempted = gangs[0]
        assert sorted(preempted["pods"]) == sorted(done["old"]) and preempted["gpus"] == NODES * GPUS
        m = run["metrics"]
        assert m["preemptions"] == 1
        # waste: every node pod's GPU time since the gang's checkpoint, plus every new node pod's spin-up and
        # model load up to the restarted gang's first step, at the run's price
        ev = run["events"]["finetune"]  # the last attempt's: the restarted gang's
        lost = done["at"] - done["checkpoint"]
        respin = sum(GPUS * (ev["first_step"] - gang_pods[p]["container_started"]) for p in done["new"])
        waste_h = (NODES * GPUS * lost + respin) / 3600.0
        assert preempted["lost_s"] == pytest.approx(lost, abs=1e-3)
        assert preempted["respin_s"] == pytest.approx(ev["first_step"] - done["retry"]["started"], abs=1e-3)
        assert m["preemption_waste_gpu_hours"] == pytest.approx(waste_h, rel=1e-6)
        assert m["preemption_waste_usd"] == pytest.approx(waste_h * PRICE, rel=1e-6)
        assert m["time_to_recover_s"] == pytest.approx(ev["first_step"] - done["at"], abs=1e-3)
        assert m["kept_train_s"] == pytest.approx(m["train_s"] + done["kept_s"], abs=1e-3)
        assert m["failure_retry_gpu_hours"] == pytest.approx(0.0, abs=1e-9)  # a preemption is no failure
        from components.record import tracking

        data = tracking.client(loop.tracking_uri).get_run(run["artifacts"]["mlflow_run_id"]).data
        assert data.tags["llmpack.preempted_attempts"] == "finetune/gang#0:PreemptionByScheduler"
        assert data.metrics["preemption_waste_usd"] == pytest.approx(m["preemption_waste_usd"])
    assert all(5 <= d["at"] - d["began"] < 6 for (_, key), d in plan.done.items() if key == GANG)
    assert all(d["checkpoint"] is not None for d in plan.done.values())
    md = (report / "report.md").read_text()
    section = md.split(f"## Preemption (--preempt {PREEMPT})")[1].split("\n## ")[0]
    for run in result["runs"]:
        assert f"${run['metrics']['preemption_waste_usd']:.4f}" in section, section
    lines = [line for line in stdout.splitlines() if " preempted 1 · recover " in line]
    assert [line.split()[0] for line in lines] == ["kfp", "argo", "mlflow"], stdout
