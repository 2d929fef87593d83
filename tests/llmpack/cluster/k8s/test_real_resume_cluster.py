"""Preemption with the real step: on the loopback cluster the preempted finetune pod and its
retry pod run the REAL finetune step (:mod:`standins.real_pods`), for KFP, Argo and the MLflow Job;
and a 2-node TrainJob gang's node pods run the REAL ranks (:mod:`standins.real_gang`).

``llmpack compare --cluster --checkpoint-pvc ckpt --preempt finetune@4s``: each path's finetune pod
gets its environment from that path's compiled artifact (``LLMPACK_CHECKPOINT_ROOT`` at the claim's
mount, mapped to a temp dir standing for the claim), is SIGTERMed at the preemption moment while the
Kubernetes stand-in marks it ``DisruptionTarget`` and deletes it; it checkpoints in its grace and
exits 143; the retry pod (a fresh output dir) resumes from this run's directory on the volume, and
its adapter is byte-identical to an uninterrupted run's. The record's preempted attempt and its
waste are computed from what the real step wrote (``checkpoint_saved``, ``resumed_from_step``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from standins.loopback import ARGO_TOKEN, KFP_TOKEN, LoopbackCluster, client_env
from standins.preemption import Preemption
from standins.real_gang import RealGang
from standins.real_pods import ADAPTER, REPO, ROOT_ENV, RealFinetune, base_env, finetune_command

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("loopback_env")]
PRICE = 4.0
GRACE_S = 10  # the stand-in's grace period (virtual seconds): the real SIGTERM checkpoint must fit it, in real ones
STEPS, BATCH, EVERY = 16, 4, 4


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The real prepare_data and tokenize, once; and an uninterrupted finetune of the same settings: the reference."""
    root = tmp_path_factory.mktemp("real-upstream")
    for ref, args in (("components.steps.prepare_data:prepare_data", [f"--output=dataset={root / 'data'}",
                                                                      "--param=builtin_size=64"]),
                      ("components.steps.tokenize:tokenize", [f"--input=dataset={root / 'data'}",
                                                              f"--output=tokens={root / 'tokens'}",
                                                              "--param=seq_len=64"])):
        r = subprocess.run([sys.executable, "-m", "components.run", ref, *args], cwd=REPO, env=base_env(),
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
    from tests.sealing import for_run

    ref_tokens = for_run(root / "tokens", root / "ref-tokens", "ref")  # a run takes only its own run's outputs
    cmd = finetune_command(ref_tokens, root / "ref", "ref", steps=STEPS, batch_size=BATCH, every=EVERY)
    r = subprocess.run(cmd, cwd=REPO, env={**base_env(), ROOT_ENV: str(root / "ref-pvc")}, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return {"tokens": root / "tokens", "reference": (root / "ref" / ADAPTER).read_bytes()}


def compare(loop: LoopbackCluster, report: Path, *extra: str) -> None:
    """``llmpack compare --cluster --checkpoint-pvc ckpt`` of the three paths on the loopback cluster, in a
    subprocess."""
    env = client_env()
    env.update(KFP_TOKEN=KFP_TOKEN, ARGO_TOKEN=ARGO_TOKEN, HOME=str(report.parent / "home"), COLUMNS="80")
    r = subprocess.run(
        [sys.executable, "-m", "llmpack", "cluster", "compare", "--backends", "kfp,argo,mlflow",
         "--checkpoint-pvc", "ckpt", "--price-per-gpu-hour", str(PRICE),
         "--kfp-host", loop.kfp.url, "--argo-host", loop.argo.url, "--kubeconfig", str(loop.kubeconfig),
         "--tracking-uri", loop.tracking_uri, "--poll", "0.05", "--timeout", "400", "--report", str(report), *extra],
        env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]


def test_real_finetune_pods_preempted_and_retried_resume_byte_identical_on_every_path(
        upstream: dict[str, Any], tracking_uri: str, tmp_path: Path) -> None:
    real = RealFinetune(tokens=upstream["tokens"], workdir=tmp_path / "pods", steps=STEPS, batch_size=BATCH,
                        every=EVERY)
    plan = Preemption.parse("finetune@4s", grace_s=GRACE_S, retry_gap_s=GRACE_S + 1, real=real)
    report = tmp_path / "report"
    with LoopbackCluster(tmp_path, tracking_uri, preempt=plan) as loop:
        compare(loop, report, "--preempt", "finetune@4s")
    result = json.loads((report / "report.json").read_text())
    assert {run["orchestrator"] for run in result["runs"]} == {"kfp", "argo", "mlflow"}
    pvc = tmp_path / "pods" / "pvc" / "ckpt"
    for run in result["runs"]:
        name, played = run["pipeline_run"], real.played[run["pipeline_run"]]
        # the pod's environment is the compiled artifact's: the claim's mount mapped to the claim's stand-in dir
        assert played["env"][ROOT_ENV] == str(pvc), run["orchestrator"]
        grace = played["env"].get("LLMPACK_GRACE_PERIOD_S")  # what the pod gets: KFP has no field for it
        assert (grace is None) if run["orchestrator"] == "kfp" else grace.isdigit(), run["orchestrator"]
        # attempt 0: SIGTERM -> checkpoint in the grace -> exit 143; attempt 1 resumes this run's checkpoint
        assert played["exit"] == [143, 0]
        kept = played["kept"]
        assert played["at_step"] <= kept < STEPS
        assert f"resumed from {pvc / name / 'finetune' / f'step-{kept:08d}'} at step {kept}" in played["stdout"][1]
        assert played["adapter"] == upstream["reference"]  # byte-identical to the uninterrupted run
        assert not (pvc / name).exists()  # the finished run removed its checkpoints
        # the record: one preempted attempt, from what the real step wrote
        assert run["status"] == "succeeded", run
        finetune = [a for a in run["attempts"] if a["step"] == "finetune"]
        assert [a["outcome"] for a in finetune] == ["preempted", "succeeded"], run["orchestrator"]
        done = next(d for (rid, _), d in plan.done.items() if rid == name)
        assert done["checkpoint"] > done["at"]  # written in the grace, after the moment: nothing since it is lost
        assert finetune[0]["lost_s"] == 0.0
        m = run["metrics"]
        assert m["preemptions"] == 1
        waste_h = finetune[0]["respin_s"] / 3600.0
        assert finetune[0]["respin_s"] > 0 and m["preemption_waste_gpu_hours"] == pytest.approx(waste_h, rel=1e-6)
        assert m["preemption_waste_usd"] == pytest.approx(waste_h * PRICE, rel=1e-6)
        assert m["failure_retry_gpu_hours"] == pytest.approx(0.0, abs=1e-9)
        from components.record import tracking

        data = tracking.client(loop.tracking_uri).get_run(run["artifacts"]["mlflow_run_id"]).data
        assert data.tags["llmpack.preempted_attempts"] == "finetune#0:PreemptionByScheduler"
        # the retry's resumed_from_step in the record is the real step's
        assert played["metrics"]["resumed_from_step"] == kept
        assert loop.fake.scripts[name].metrics["finetune"]["resumed_from_step"] == kept


def test_a_real_two_node_gang_preempted_and_restarted_whole_resumes_byte_identical_on_every_path(
        upstream: dict[str, Any], tracking_uri: str, tmp_path: Path) -> None:
    """A 2 x 1 GPU TrainJob gang per path: its last node pod preempted mid-training, JobSet's restart resumes
    every rank from the run's checkpoint on the claim; the adapter is an uninterrupted gang's, byte for byte."""
    nodes = 2
    real = RealGang(tokens=upstream["tokens"], workdir=tmp_path / "gang", steps=STEPS, batch_size=BATCH, every=EVERY)
    plan = Preemption.parse("finetune@5s", grace_s=GRACE_S, retry_gap_s=GRACE_S + 1, real=real)
    report = tmp_path / "report"
    with LoopbackCluster(tmp_path, tracking_uri, preempt=plan) as loop:
        compare(loop, report, "--preempt", "finetune@5s", "--nodes", str(nodes), "--gpus", "1",
                "--cache-pvc", "shared")
        spec = next(iter(loop.fake.scripts.values())).gang["spec"]
        reference = real.uninterrupted(spec, "reference", nodes)  # the same gang, run whole
        result = json.loads((report / "report.json").read_text())
        assert {run["orchestrator"] for run in result["runs"]} == {"kfp", "argo", "mlflow"}
        pvc = real.claim_dir("ckpt")
        for run in result["runs"]:
            name, played = run["pipeline_run"], real.played[run["pipeline_run"]]
            # the node pods' environment is the TrainJob's: the checkpoint claim's mount mapped to its stand-in
            assert played["env"][ROOT_ENV] == str(pvc), run["orchestrator"]
            # gang 0: the victim SIGTERMed, every rank stopped after the same step, the gang gone; gang 1 whole
            assert all(code != 0 for code in played["exit"][0]) and played["exit"][1] == [0] * nodes
            kept = played["kept"]
            assert played["at_step"] <= kept < STEPS
            rank0 = played["stdout"][1][0]
            assert f"resumed from {pvc / name / 'finetune' / f'step-{kept:08d}'} at step {kept}" in rank0
            assert played["adapter"] == reference  # byte-identical to the uninterrupted gang
            assert not (pvc / name).exists()  # the finished gang removed this run's checkpoints
            # the record: the gang's one preempted attempt, the launcher's one attempt, no failure retry
            assert run["status"] == "succeeded", run
            gangs = [a for a in run["attempts"] if a.get("gang")]
            assert [a["outcome"] for a in gangs] == ["preempted", "succeeded"], run["orchestrator"]
            launcher = [a for a in run["attempts"] if a["step"] == "finetune" and not a.get("gang")]
            assert [a["outcome"] for a in launcher] == ["succeeded"]
            done = next(d for (rid, _), d in plan.done.items() if rid == name)
            assert done["checkpoint"] > done["at"]  # the real checkpoint, written in the grace: nothing lost
            assert gangs[0]["lost_s"] == 0.0 and gangs[0]["respin_s"] > 0
            m = run["metrics"]
            assert m["preemptions"] == 1 and m["preemption_waste_usd"] > 0
            assert m["preemption_waste_usd"] == pytest.approx(m["preemption_waste_gpu_hours"] * PRICE, rel=1e-6)
            assert m["failure_retry_gpu_hours"] == pytest.approx(0.0, abs=1e-9)
            # what the restarted gang says it resumed is the record's
            assert played["metrics"]["resumed_from_step"] == kept
            assert loop.fake.scripts[name].metrics["finetune"]["resumed_from_step"] == kept
            from components.record import tracking

            data = tracking.client(loop.tracking_uri).get_run(run["artifacts"]["mlflow_run_id"]).data
            assert data.tags["llmpack.preempted_attempts"] == "finetune/gang#0:PreemptionByScheduler"
