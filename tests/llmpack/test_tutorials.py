"""The tutorials cannot rot: every ``bash`` block of examples/tutorials/*.md runs, in order, as typed.

Each tutorial runs in a fresh directory that holds the repository's top-level folders (as links),
so its commands work as typed from the repository root and leave their outputs (``mlflow.db``,
compiled files, artifacts) in that directory. The cluster endpoints point at the loopback
stand-ins (KFP API, Argo Server, Kubernetes API) that speak the real wire protocols. After the
blocks ran, the MLflow store must hold the record the local run left: closed by the pipeline's own
summarizing task, with the metrics of docs/telemetry-and-cost.md and cost tags, and nothing left RUNNING.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from standins.argo_server import ArgoServerStandIn
from standins.k8s_api import KubeAPIStandIn
from standins.kfp_api import KFPAPIStandIn

REPO = Path(__file__).resolve().parents[2]
TUTORIALS = REPO / "examples" / "tutorials"
LINKED = ("kfp_pipelines", "argo_workflows", "mlflow_projects", "examples", "components", "llmpack")
HEADLINE = ("spinup_s", "time_to_first_step_s", "total_s", "cost_usd", "gpu_hours", "goodput", "eval_loss")
FROM_SUBMIT = ("spinup_s", "time_to_first_step_s", "total_s")
BLOCK = re.compile(r"^```bash\n(.*?)^```", re.S | re.M)
KFP_TOKEN, ARGO_TOKEN, KUBE_TOKEN = "kfp-standin-token", "argo-standin-token", "k8s-standin-token"


def bash_blocks(tutorial: Path) -> list[str]:
    return BLOCK.findall(tutorial.read_text(encoding="utf-8"))


def write_kubeconfig(path: Path, server: str) -> Path:
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: standin\n"
        f"clusters: [{{name: standin, cluster: {{server: '{server}'}}}}]\n"
        f"users: [{{name: standin, user: {{token: {KUBE_TOKEN}}}}}]\n"
        "contexts: [{name: standin, context: {cluster: standin, user: standin, namespace: llmpack}}]\n",
        encoding="utf-8",
    )
    return path


@pytest.fixture(scope="module")
def cluster():
    with KFPAPIStandIn(token=KFP_TOKEN) as kfp, ArgoServerStandIn(token=ARGO_TOKEN) as argo, \
            KubeAPIStandIn(token=KUBE_TOKEN, namespaces=("default", "llmpack")) as kube:
        yield {"kfp": kfp, "argo": argo, "kube": kube}


def run_tutorial(name: str, workdir: Path, cluster: dict) -> subprocess.CompletedProcess[str]:
    for top in LINKED:
        (workdir / top).symlink_to(REPO / top)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "LLMPACK_", "ARGO_", "KFP_"))}
    env.update(
        PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
        HF_HUB_OFFLINE="1",
        KFP_ENDPOINT=cluster["kfp"].url, KFP_TOKEN=KFP_TOKEN,
        ARGO_SERVER=cluster["argo"].url, ARGO_TOKEN=ARGO_TOKEN, ARGO_NAMESPACE="llmpack", ARGO_SECURE="false",
        # not a tutorial output
        KUBECONFIG=str(write_kubeconfig(workdir.parent / f"{workdir.name}.kubeconfig", cluster["kube"].url)),
    )
    script = "set -euo pipefail\n" + "\n".join(bash_blocks(TUTORIALS / name))
    return subprocess.run(["bash", "-c", script], cwd=workdir, env=env, capture_output=True, text=True, timeout=900)


def left_untracked(workdir: Path) -> list[str]:
    """What a tutorial left at the top of a checkout that ``git status`` would show, under the repository's .gitignore.

    The tutorial ran from ``workdir`` as from the repository root; with the repository's own
    .gitignore there, every file or folder it wrote must be ignored (or there already, as the
    linked folders are).
    """
    (workdir / ".gitignore").write_bytes((REPO / ".gitignore").read_bytes())
    subprocess.run(["git", "init", "-q"], cwd=workdir, check=True)
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=normal"], cwd=workdir, check=True,
                            capture_output=True, text=True).stdout
    shown = [line[3:].rstrip("/") for line in status.splitlines()]
    return sorted(name for name in shown if name not in (*LINKED, ".gitignore"))


def closed_record(db: Path, orchestrator: str, source: str):
    from mlflow.tracking import MlflowClient

    mc = MlflowClient(f"sqlite:///{db}")
    runs = mc.search_runs([e.experiment_id for e in mc.search_experiments()])
    # A cluster submission's record stays open until its run ends on the cluster (none runs on a stand-in).
    runs = [r for r in runs if r.data.tags.get("llmpack.mode") != "cluster"]
    assert not [r for r in runs if r.info.status == "RUNNING"], "a record was left RUNNING"
    (rec,) = [r for r in runs if r.data.tags.get("llmpack.record") == "pipeline"
              and r.data.tags.get("llmpack.orchestrator") == orchestrator]
    m, tags = rec.data.metrics, rec.data.tags
    assert rec.info.status == "FINISHED"
    assert tags["llmpack.submit_time_source"] == source
    assert tags["llmpack.gpu_type"] == "nvidia-h100-80gb" and tags["llmpack.price_source"].startswith("aws")
    assert mc.get_experiment(rec.info.experiment_id).name == "llmpack"  # whoever started the run
    assert [p.step for p in mc.get_metric_history(rec.info.run_id, "train_loss")] == [1, 2, 3, 4, 5]  # the loss curve
    # Measured from the submit instant only when there is one; from the first pod, named for it
    # (components.record.uniform).
    named = {k: (k if source != "first_pod" or k not in FROM_SUBMIT else f"{k[:-2]}_from_first_pod_s")
             for k in HEADLINE}
    assert all(named[key] in m for key in HEADLINE), sorted(m)
    assert source != "first_pod" or not [k for k in FROM_SUBMIT if k in m], sorted(m)
    assert 0 < m[named["spinup_s"]] < m[named["time_to_first_step_s"]] < m[named["total_s"]]
    assert m["cost_usd"] > 0 and m["eval_loss"] < m["base_eval_loss"]
    return rec, runs


def test_every_tutorial_has_commands_and_is_listed():
    names = sorted(p.name for p in TUTORIALS.glob("*.md") if p.name != "README.md")
    assert names == ["argo.md", "kfp.md", "mlflow.md"]
    index = (TUTORIALS / "README.md").read_text(encoding="utf-8")
    for name in names:
        assert f"]({name})" in index and len(bash_blocks(TUTORIALS / name)) >= 2


@pytest.mark.slow
def test_kfp_tutorial(tmp_path: Path, cluster: dict):
    proc = run_tutorial("kfp.md", tmp_path, cluster)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert not (left := left_untracked(tmp_path)), left  # `git status` stays clean after the tutorial
    rec, _ = closed_record(tmp_path / "mlflow.db", "kfp", "first_pod")
    assert rec.info.run_id in proc.stdout  # show_record.py printed the record the run left
    created = cluster["kfp"].recorded("POST", "/runs")
    assert len(created) >= 2  # `kfp run create` and `llmpack submit kfp`


@pytest.mark.slow
def test_argo_tutorial(tmp_path: Path, cluster: dict):
    proc = run_tutorial("argo.md", tmp_path, cluster)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert not (left := left_untracked(tmp_path)), left  # `git status` stays clean after the tutorial
    rec, _ = closed_record(tmp_path / "mlflow.db", "argo", "orchestrator")
    assert rec.data.tags["llmpack.pipeline_run"].startswith("llm-finetune-local-")
    assert "created workflow llmpack/llm-finetune-" in proc.stdout
    (post,) = cluster["argo"].recorded("POST")
    assert post.body["workflow"]["spec"]["onExit"] == "close-record"


@pytest.mark.slow
def test_mlflow_tutorial(tmp_path: Path, cluster: dict):
    proc = run_tutorial("mlflow.md", tmp_path, cluster)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert not (left := left_untracked(tmp_path)), left  # `git status` stays clean after the tutorial
    rec, runs = closed_record(tmp_path / "mlflow.db", "mlflow", "orchestrator")
    printed = re.findall(r"=== Run \(ID '([0-9a-f]+)'\) succeeded ===", proc.stderr)
    # The run `mlflow run` printed lives in `Default`; the record, in `llmpack`, and the two link to each other.
    (shell,) = [r for r in runs if r.info.run_id == printed[-1]]
    assert (rec.data.tags["llmpack.mlflow_run_id"] == shell.info.run_id
            and shell.data.tags["llmpack.record_run_id"] == rec.info.run_id)
    assert shell.info.status == "FINISHED" and shell.info.experiment_id != rec.info.experiment_id
    assert len([r for r in runs if r.data.tags.get("mlflow.parentRunId") == rec.info.run_id]) == 5
    assert rec.data.tags["llmpack.pipeline_run"] == f"mlflow-{shell.info.run_id[:12]}"
    run_dir = tmp_path / "llmpack-artifacts" / rec.data.tags["llmpack.pipeline_run"]  # relative to where it was typed
    assert (run_dir / "finetune" / "model" / "adapter" / "adapter_model.safetensors").exists()
    assert not (REPO / "mlflow_projects" / "finetune" / "mlflow.db").exists()
    assert cluster["kube"].recorded("POST", "/jobs")
    # the last step: the registered champion, loaded by MLflow alone, answered one prompt with one string
    answers = json.loads(proc.stdout.strip().splitlines()[-1])
    assert isinstance(answers, list) and len(answers) == 1 and isinstance(answers[0], str)
