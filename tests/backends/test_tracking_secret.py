"""Every cluster pod reads the tracking server and its credentials from one Secret, and never logs to a sqlite file.

The compiled KFP, Argo and MLflow artifacts (the committed default, fuse-gpu and multinode copies)
each map the Secret ``llmpack-mlflow`` the same way in every pod: key ``tracking-uri`` to
``MLFLOW_TRACKING_URI``, required (no Secret, no pod), and ``username``/``password``/``token`` to
``MLFLOW_TRACKING_USERNAME``/``PASSWORD``/``TOKEN``, each optional. A step or the summarizing task
run in cluster mode with no tracking URI (the Secret missing where the pod ran anyway, or its key
empty) fails with one line naming the Secret and key, and writes no ``mlflow.db``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from components import settings
from components.record import close as record
from components.record.cost import GpuUse
from tests.conftest import REPO

VARIANT_DIRS = (Path("."), Path("tests/fixtures/golden/fuse-gpu"), Path("examples/multinode"))
SECRET = "llmpack-mlflow"
EXPECTED = {  # env var -> (secret key, optional)
    "MLFLOW_TRACKING_URI": ("tracking-uri", False),
    "MLFLOW_TRACKING_USERNAME": ("username", True),
    "MLFLOW_TRACKING_PASSWORD": ("password", True),
    "MLFLOW_TRACKING_TOKEN": ("token", True),
    "LLMPACK_SIGNING_KEY": ("signing-key", True),  # the provenance key every pod of a run shares
}

Mapping = dict[str, tuple[str, bool]]


def _from_env_list(env: list[dict[str, Any]], secret: str = SECRET) -> Mapping:
    out: Mapping = {}
    for var in env:
        ref = (var.get("valueFrom") or {}).get("secretKeyRef")
        if ref is not None:
            assert ref["name"] == secret, var
            out[var["name"]] = (ref["key"], bool(ref.get("optional", False)))
    return out


def kfp_pods(base: Path, secret: str = SECRET) -> dict[str, Mapping]:
    _, platform = yaml.safe_load_all((base / "kfp_pipelines" / "finetune.yaml").read_text())
    pods = {}
    for name, cfg in platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"].items():
        found: Mapping = {}
        for entry in cfg.get("secretAsEnv", []):
            assert entry["secretName"] == secret, name
            for pair in entry["keyToEnv"]:
                found[pair["envVar"]] = (pair["secretKey"], bool(entry.get("optional", False)))
        pods[name] = found
    return pods


def argo_pods(base: Path, secret: str = SECRET) -> dict[str, Mapping]:
    wf = yaml.safe_load((base / "argo_workflows" / "finetune.yaml").read_text())
    return {t["name"]: _from_env_list(t["container"].get("env", []), secret) for t in wf["spec"]["templates"]
            if "container" in t}


def mlflow_pods(base: Path, secret: str = SECRET) -> dict[str, Mapping]:
    job = yaml.safe_load((base / "mlflow_projects" / "finetune-k8s" / "kubernetes_job_template.yaml").read_text())
    (container,) = job["spec"]["template"]["spec"]["containers"]
    return {"job": _from_env_list(container["env"], secret)}


@pytest.mark.parametrize("base", VARIANT_DIRS, ids=str)
def test_every_pod_of_every_path_maps_the_same_secret_keys(base: Path) -> None:
    pods = {f"kfp {k}": v for k, v in kfp_pods(REPO / base).items()}
    pods |= {f"argo {k}": v for k, v in argo_pods(REPO / base).items()}
    pods |= {f"mlflow {k}": v for k, v in mlflow_pods(REPO / base).items()}
    # every task's pod and the summarizing task's on KFP and Argo (fewer when fused), and the MLflow Job
    assert (sum(k.startswith("kfp ") for k in pods) == sum(k.startswith("argo ") for k in pods) >= 5
            and "mlflow job" in pods)
    for where, found in pods.items():
        assert found == EXPECTED, where


def test_tracking_secret_names_the_secret_every_pod_of_every_path_reads(tmp_path: Path) -> None:
    """``llmpack compile --tracking-secret team-mlflow``: the same keys, from that Secret, on every pod of every
    path (the gang's launcher and the summarizing tasks included); a bad name is one line, exit 2."""
    from tests.conftest import llmpack

    done = llmpack("compile", "--out", str(tmp_path / "out"), "--tracking-secret", "team-mlflow", "--nodes", "2",
                   "--cache-pvc", "shared", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    base = tmp_path / "out"
    pods = {f"kfp {k}": v for k, v in kfp_pods(base, "team-mlflow").items()}
    pods |= {f"argo {k}": v for k, v in argo_pods(base, "team-mlflow").items()}
    pods |= {f"mlflow {k}": v for k, v in mlflow_pods(base, "team-mlflow").items()}
    assert len(pods) >= 11 and all(found == EXPECTED for found in pods.values()), pods
    assert "Secret 'team-mlflow'" in (base / "mlflow_projects/finetune-k8s/kubernetes_job_template.yaml").read_text()
    bad = llmpack("compile", "--out", str(tmp_path / "bad"), "--tracking-secret", "Team_MLflow", cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "llmpack: error: --tracking-secret 'Team_MLflow': not a Secret name (lower-case letters, digits, '-' and '.')"]
    assert not (tmp_path / "bad").exists()


def _step_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_TRACKING_") and not k.startswith("LLMPACK_")}
    return {**env, "HOME": str(tmp_path), **extra}


def _one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    return lines[0]


def test_a_cluster_step_without_a_tracking_uri_fails_in_one_line_and_writes_no_sqlite(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "components.run", "components.steps.prepare_data:prepare_data",
            f"--output=dataset={tmp_path / 'out'}", "--param=builtin_size=8", "--param=orchestrator=argo"]
    proc = subprocess.run([*argv, "--param=mode=cluster"], cwd=tmp_path, env=_step_env(tmp_path),
                          capture_output=True, text=True, timeout=300)
    line = _one_error_line(proc)
    assert f"Secret {SECRET!r} key 'tracking-uri'" in line and "sqlite" in line, line
    assert not list(tmp_path.rglob("*.db")) and not (tmp_path / "out" / "llmpack-events.jsonl").exists()

    # an empty key is no URI either
    proc = subprocess.run([*argv, "--param=mode=cluster"], cwd=tmp_path,
                          env=_step_env(tmp_path, MLFLOW_TRACKING_URI=" "),
                          capture_output=True, text=True, timeout=300)
    assert "MLFLOW_TRACKING_URI is empty" in _one_error_line(proc)
    # the same step that does not log to MLflow (or runs locally) needs no server
    for extra, mode in (({settings.MLFLOW_LOGGING.name: "0"}, "cluster"),
                        ({settings.MLFLOW_LOGGING.name: "0"}, "local")):
        proc = subprocess.run([*argv, f"--param=mode={mode}"], cwd=tmp_path, env=_step_env(tmp_path, **extra),
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
    assert not list(tmp_path.rglob("*.db"))


def test_the_summarizing_task_in_cluster_mode_refuses_to_log_to_a_sqlite_file(tmp_path: Path) -> None:
    args = record.record_args(status="Succeeded",
                              uses=record.uses_json([GpuUse(step="finetune", gpus=1, gpu_type="x")]),
                              run_id="wf-1", created_at="", params={"submitted_at": "0.0", "pipeline_run": "",
                                                                   "run_group": "", "orchestrator": "kfp",
                                                                   "mode": "cluster"})
    # inside a pod (Kubernetes sets KUBERNETES_SERVICE_HOST); outside one a KFP package run is kfp.local's, mode local
    proc = subprocess.run([sys.executable, *args], cwd=tmp_path,
                          env=_step_env(tmp_path, KUBERNETES_SERVICE_HOST="10.96.0.1"),
                          capture_output=True, text=True, timeout=300)
    assert f"Secret {SECRET!r} key 'tracking-uri'" in _one_error_line(proc)
    assert not list(tmp_path.rglob("*.db"))


def test_the_argo_and_kfp_close_tasks_pass_the_credentials_too() -> None:
    """The summarizing task's pod is a pod like the others: same Secret, same keys (it logs the summary)."""
    assert argo_pods(REPO)["close-record"] == EXPECTED
    assert kfp_pods(REPO)["exec-close-record"] == EXPECTED
