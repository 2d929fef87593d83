"""Preemption on the loopback cluster (issue 24 items 3 and 4): the finetune GPU pod is preempted
mid-training (``DisruptionTarget``, deletion), the orchestrator's retry pod resumes from the
checkpoint, and the record says so: one preempted attempt, its waste priced, time to recover.

The preemption is played by :class:`standins.preemption.Preemption` in the fake cluster's
virtual time; everything measured goes through the real clients, the pod watcher and MLflow.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from standins.loopback import LoopbackCluster
from standins.preemption import Preemption

from components.errors import InputError
from llmpack import cluster
from llmpack.k8s.preemption import parse_preempt

pytestmark = pytest.mark.usefixtures("loopback_env")
PRICE = 4.0  # USD per GPU-hour: every figure below is priced with it


@pytest.fixture()
def preempting(loopback_env: None, tmp_path: Path, tracking_uri: str) -> Any:
    plan = Preemption.parse("finetune@4s")
    with LoopbackCluster(tmp_path, tracking_uri, preempt=plan) as c:
        yield c, plan


@pytest.mark.slow
def test_compare_under_preemption_records_one_preempted_attempt_with_its_waste(preempting: Any, tmp_path: Path) -> None:
    loop, plan = preempting
    result = cluster.compare_cluster(**loop.options(backends="kfp,argo", price_per_gpu_hour=PRICE,
                                                    preempt="finetune@4s"))
    assert result["preempt"] == "finetune@4s"
    for run in result["runs"]:
        assert run["status"] == "succeeded", run
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

        logged = tracking.client(loop.tracking_uri).get_run(run["artifacts"]["mlflow_run_id"]).data.metrics
        assert logged["preemptions"] == 1
        assert logged["preemption_waste_usd"] == pytest.approx(m["preemption_waste_usd"])
    paths = {r["orchestrator"]: r for r in result["runs"]}
    # the same moment on both paths: preempted 4 s into the container's run
    assert {round(d["at"] - d["times"]["started"]) for d in plan.done.values()} == {4}
    assert set(paths) == {"kfp", "argo"}


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
