"""A finetune pod killed with SIGKILL (no grace, no SIGTERM checkpoint) resumes from its last periodic checkpoint.

On the real control plane, with the process kubelet (``process_kubelet.py``) running the real step:
a batch/v1 Job (the compiled MLflow Job's retry rules: ``backoffLimit``, ``podFailurePolicy`` failing
the Job only on exit codes 1 and 2) runs ``python -m components.run components.steps.finetune:finetune``
with a checkpoint volume as ``llmpack compile --checkpoint-pvc`` sets it (``LLMPACK_CHECKPOINT_ROOT``
at the claim's mount, ``LLMPACK_CHECKPOINT_MINUTES``) and ``checkpoint_every=0``: it checkpoints by
time alone, as the compiled default does. Once a checkpoint of step 4 or later is on the volume the
container's process is sent SIGKILL, as an OOM kill or a lost node would end it. The real Job
controller sees the pod failed and makes a new one; the step in it resumes from the newest complete
checkpoint on the claim, and its adapter is byte-identical to an uninterrupted run's.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from components import settings
from components.training.checkpointing import newest_checkpoint, run_checkpoint_dir
from tests.conftest import REPO, SESSION_SIGNING_KEY_FILE
from tests.realcluster.apiserver import make_namespace, wait_until
from tests.realcluster.conftest import RealCluster
from tests.realcluster.process_kubelet import PROCESS_LABEL, ProcessKubelet, ProcessNode

pytestmark = pytest.mark.cluster
NS = "llmpack-sigkill"
NODE = "proc-sigkill-0"
IMAGE = "registry.example.com/llmpack/llmpack"
RUN = "run-sigkill"
# long enough that a quiet machine cannot finish before the kill (16 steps of the 2-layer tiny could)
STEPS, BATCH = 120, 4
EVERY_MINUTES = 0.1 / 60  # a checkpoint whenever 0.1 s have passed since the last: by time, not by step count
ADAPTER = Path("adapter") / "adapter_model.safetensors"
RESTRICTED = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "runAsNonRoot": True,
              "runAsUser": 1000, "readOnlyRootFilesystem": True}


def base_env() -> dict[str, str]:
    """What the image would have installed: this interpreter, this checkout, offline, one thread."""
    return {"LLMPACK_SIGNING_KEY_FILE": str(SESSION_SIGNING_KEY_FILE),  # one key for every pod, as a Secret gives
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), "/usr/bin", "/bin"]), "PYTHONPATH": str(REPO),
            "HF_HUB_OFFLINE": "1", "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def step_args(tokens: str, out: str) -> list[str]:
    return ["-m", "components.run", "components.steps.finetune:finetune", f"--input=tokens={tokens}",
            f"--output=model={out}", f"--param=max_steps={STEPS}", f"--param=batch_size={BATCH}",
            "--param=checkpoint_every=0", f"--param=pipeline_run={RUN}"]


@pytest.fixture(scope="module")
def kubelet(real_cluster: RealCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessKubelet]:
    root = tmp_path_factory.mktemp("sigkill-kubelet")
    (root / "image").mkdir()
    node = ProcessNode(name=NODE, cpu="16", memory="64Gi", labels={},
                       taints=({"key": PROCESS_LABEL, "value": "true", "effect": "NoSchedule"},))
    make_namespace(real_cluster.api, NS, {"pod-security.kubernetes.io/enforce": "restricted"})
    with ProcessKubelet(real_cluster.api, [node], root=root / "kubelet", images={IMAGE: root / "image"},
                        base_env=base_env(), deadline_s=600) as k:
        yield k
        assert not k.errors, k.errors


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The real prepare_data and tokenize once, and an uninterrupted finetune of the same settings (the reference)."""
    root = tmp_path_factory.mktemp("sigkill-upstream")
    env = {**os.environ, **base_env(), "LLMPACK_MLFLOW_LOGGING": "0"}
    for ref, args in (("components.steps.prepare_data:prepare_data", [f"--output=dataset={root / 'data'}",
                                                                      "--param=builtin_size=64"]),
                      ("components.steps.tokenize:tokenize", [f"--input=dataset={root / 'data'}",
                                                              f"--output=tokens={root / 'tokens'}",
                                                              "--param=seq_len=64"])):
        # in the run the finetune pods are of: a run's steps take only its own run's outputs
        r = subprocess.run([sys.executable, "-m", "components.run", ref, *args, f"--param=pipeline_run={RUN}"],
                           cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run([sys.executable, *step_args(str(root / "tokens"), str(root / "ref"))], cwd=REPO,
                       env={**env, settings.CHECKPOINT_ROOT.name: str(root / "ref-pvc"),
                            settings.CHECKPOINT_MINUTES.name: str(EVERY_MINUTES)},
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return {"tokens": root / "tokens", "reference": (root / "ref" / ADAPTER).read_bytes()}


def _claim(real_cluster: RealCluster) -> None:
    """PersistentVolume ``sigkill-work`` and claim ``work``: the real PV controller binds them."""
    from kubernetes import client

    core = client.CoreV1Api(real_cluster.api)
    core.create_persistent_volume({"metadata": {"name": "sigkill-work"},
                                   "spec": {"capacity": {"storage": "10Gi"}, "accessModes": ["ReadWriteOnce"],
                                            "storageClassName": "", "nfs": {"server": "127.0.0.1", "path": "/w"}}})
    core.create_namespaced_persistent_volume_claim(NS, {"metadata": {"name": "work"}, "spec": {
        "accessModes": ["ReadWriteOnce"], "storageClassName": "", "volumeName": "sigkill-work",
        "resources": {"requests": {"storage": "1Gi"}}}})


def _job() -> dict[str, Any]:
    """The finetune Job: the compiled Job's retry rules and checkpoint settings, on the process node."""
    container = {
        "name": "finetune", "image": f"{IMAGE}:0.1.0",
        "command": ["python", *step_args("$(TOKENS)", "$(OUT_ROOT)/$(POD_NAME)")],
        # paths by variable, as a compiled step names its volumes' paths: the kubelet maps env values onto volumes
        "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                {"name": "TOKENS", "value": "/work/tokens"}, {"name": "OUT_ROOT", "value": "/work/out"},
                {"name": settings.CHECKPOINT_ROOT.name, "value": "/work/checkpoints"},
                {"name": settings.CHECKPOINT_MINUTES.name, "value": str(EVERY_MINUTES)},
                {"name": "LLMPACK_MLFLOW_LOGGING", "value": "0"}],
        "volumeMounts": [{"name": "work", "mountPath": "/work"}, {"name": "tmp", "mountPath": "/tmp"}],
        "resources": {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"cpu": "1", "memory": "2Gi"}},
        "securityContext": RESTRICTED,
    }
    pod = {"restartPolicy": "Never", "automountServiceAccountToken": False, "containers": [container],
           "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
           "volumes": [{"name": "work", "persistentVolumeClaim": {"claimName": "work"}},
                       {"name": "tmp", "emptyDir": {}}],
           "nodeSelector": {PROCESS_LABEL: "true"},
           "tolerations": [{"key": PROCESS_LABEL, "operator": "Exists", "effect": "NoSchedule"}]}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "finetune-sigkill"}, "spec": {
        "backoffLimit": 2,
        "podFailurePolicy": {"rules": [
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
            {"action": "FailJob", "onExitCodes": {"operator": "In", "values": [1, 2]}}]},
        "template": {"metadata": {"labels": {"app": "finetune-sigkill"}}, "spec": pod}}}


def test_a_sigkilled_finetune_resumes_from_its_last_periodic_checkpoint_byte_identical(
        real_cluster: RealCluster, kubelet: ProcessKubelet, upstream: dict[str, Any]) -> None:
    from kubernetes import client

    core, batch = client.CoreV1Api(real_cluster.api), client.BatchV1Api(real_cluster.api)
    claim = kubelet.root / "claims" / NS / "work"
    shutil.copytree(upstream["tokens"], claim / "tokens")
    _claim(real_cluster)
    batch.create_namespaced_job(NS, _job())
    ckpts = run_checkpoint_dir(claim / "checkpoints", RUN, "finetune")

    def pods() -> list[Any]:
        return sorted(core.list_namespaced_pod(NS, label_selector="job-name=finetune-sigkill").items,
                      key=lambda p: p.metadata.creation_timestamp)

    def running_with_a_checkpoint() -> Any:
        first = pods()[:1]
        if not first or first[0].status.phase != "Running":
            return None
        newest = newest_checkpoint(ckpts)
        return (first[0], newest) if newest is not None and int(newest.name.split("-")[1]) >= 4 else None

    first, seen = wait_until(running_with_a_checkpoint, timeout_s=300, what="the first pod running with a checkpoint")
    (state,) = first.status.container_statuses
    pid = int(state.container_id.removeprefix("process://"))
    os.kill(pid, signal.SIGKILL)  # no SIGTERM, no grace: nothing is saved on the way out

    def finished() -> Any:
        job = batch.read_namespaced_job("finetune-sigkill", NS)
        done = [c.type for c in job.status.conditions or [] if c.status == "True" and c.type in ("Complete", "Failed")]
        return (job, done) if done else None

    job, done = wait_until(finished, timeout_s=400, what="the Job complete or failed")
    killed, *retries = pods()
    logs = {p.metadata.name: "\n".join(f.read_text()[-3000:]
                                       for f in (kubelet.root / "logs" / NS / p.metadata.name).glob("*.log"))
            for p in (killed, *retries)}
    assert done == ["Complete"], logs
    assert killed.metadata.name == first.metadata.name and killed.status.phase == "Failed"
    # the process kubelet's code, as a container runtime reports a SIGKILL: 128 + 9 = 137
    assert killed.status.container_statuses[0].state.terminated.exit_code == 128 + signal.SIGKILL
    (retry,) = retries  # the real Job controller's one replacement pod
    assert retry.status.phase == "Succeeded" and retry.metadata.owner_references[0].kind == "Job"
    resumed = [line for line in logs[retry.metadata.name].splitlines() if "finetune: resumed from" in line]
    assert len(resumed) == 1, logs[retry.metadata.name]
    step = int(resumed[0].rsplit("at step ", 1)[1])
    assert step >= int(seen.name.split("-")[1]) and str(ckpts) in resumed[0], resumed
    out = claim / "out" / retry.metadata.name / ADAPTER
    assert out.read_bytes() == upstream["reference"]  # byte-identical to the uninterrupted run
