"""The twenty-fifth independent round's findings (helper sec25, issue 46); each test fails on b31f271.

F1 (medium): the mlflow driver's copy of a step's output (``driver_output.copy_redacted``) cuts a line with no end at
    64 KiB and redacts each piece apart: a known secret across the cut is written whole to the log and the terminal.
F2 (medium): ``submit --wait``'s timeout reason (``servers.pending``) blanks only the API client's secrets: a pod
    message's URI userinfo, the user's MLFLOW_TRACKING_PASSWORD and raw escape sequences (OSC 52) reach stderr.
F3 (medium): ``--plan``'s size check reads the run's size from the close task's ``--uses`` billing annotation and is
    skipped when it says nothing: a Workflow without ``--uses`` (or ``--uses=[]``), an MLflow project without
    ``pipeline.json``, goes out with ``--param nnodes=64`` under a 2-node row; a gang spec of 8 GPUs a node too.
F4 (low): ``--param nnodes=inf`` (or ``max_steps=1e400``, a compiled ``.inf``) with ``--plan``: OverflowError
    traceback, exit 1 (``plan.record._whole`` catches TypeError and ValueError only).
F5 (low): ``cluster timeline --json`` skips ``redact_data``: a dump's condition reason prints a URI password whole.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import os
import re
import shutil
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

SECRET = "Zq7pW2xK9vLm"


def test_f1_a_secret_across_the_64k_cut_is_blanked(monkeypatch: pytest.MonkeyPatch) -> None:
    from mlflow_projects.driver_output import copy_redacted

    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", SECRET)
    chunks = iter([b"x" * 65530 + SECRET[:6].encode(), SECRET[6:].encode() + b" more\n", b""])
    log = io.BytesIO()
    sink = os.open(os.devnull, os.O_WRONLY)
    try:
        copy_redacted(lambda: next(chunks), sink, log)
    finally:
        os.close(sink)
    leaked = SECRET.encode() in log.getvalue()
    assert not leaked, "the password, split across the 64 KiB cut, is in the step log"


def test_f1_a_real_step_writing_a_long_line_through_tee_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess
    import sys

    from mlflow_projects.driver_output import tee_output

    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", SECRET)
    log = tmp_path / "step.log"
    code = f"import os; os.write(1, b'x' * 65533 + b'{SECRET}' + b'\\n')"
    with tee_output(log):
        subprocess.run([sys.executable, "-c", code], check=True)
    leaked = SECRET.encode() in log.read_bytes()
    assert not leaked, "a step's one long line kept the password in its log"


def _pending_pod_message() -> str:
    return ('Failed to pull image "reg.example/x": 401 from https://robot:Rb7xQ2zK9wLp@reg.example/v2/ '
            f'retried with {SECRET} \x1b]52;c;ZWNobyBvd25lZA==\x07\x1b[2J')


def test_f2_the_pending_reason_is_redacted_and_printable(monkeypatch: pytest.MonkeyPatch) -> None:
    from kubernetes import client as k8s

    from components.servers.pending import pending_reason

    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", SECRET)
    waiting = k8s.V1ContainerStateWaiting(reason="ErrImagePull", message=_pending_pod_message())
    status = k8s.V1ContainerStatus(name="main", image="x", image_id="", ready=False, restart_count=0,
                                   state=k8s.V1ContainerState(waiting=waiting))
    pod = k8s.V1Pod(metadata=k8s.V1ObjectMeta(name="j-abc"),
                    status=k8s.V1PodStatus(phase="Pending", container_statuses=[status]))

    class Core:
        def __init__(self, _api: object) -> None: ...

        def list_namespaced_pod(self, _ns: str, **_kw: object) -> k8s.V1PodList:
            return k8s.V1PodList(items=[pod])

    monkeypatch.setattr(k8s, "CoreV1Api", Core)
    said = pending_reason(object(), "ns", "job-name=j", ["api-token-xyz123"]) or ""
    assert "ErrImagePull" in said
    assert "Rb7xQ2zK9wLp" not in said, f"a registry URI's password: {said!r}"
    assert SECRET not in said, f"the user's MLFLOW_TRACKING_PASSWORD: {said!r}"
    assert "\x1b" not in said and "\x07" not in said, f"escape sequences for the terminal: {said!r}"


def test_f2_cli_submit_wait_prints_the_pods_message_redacted(tmp_path: Path, tracking_uri: str,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from standins.k8s_api import KubeAPIStandIn

    from llmpack.cli import main
    from tests.backends.test_submit_mlflow import ENV, TOKEN, write_kubeconfig

    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", SECRET)
    with KubeAPIStandIn(token=TOKEN, namespaces=("default", "llmpack")) as kube:
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", kube.url, TOKEN)
        stop = threading.Event()

        def pod_for_the_job() -> None:  # the Job's pod, Pending on an image pull, once the Job exists
            while not stop.is_set() and not kube.jobs:
                time.sleep(0.01)
            for (ns, job) in list(kube.jobs):
                kube.apply_pod({"metadata": {"name": f"{job}-x", "namespace": ns, "labels": {"job-name": job}},
                                "spec": {"containers": [{"name": "main", "image": "x"}]},
                                "status": {"phase": "Pending", "containerStatuses": [{
                                    "name": "main", "image": "x", "imageID": "", "ready": False, "restartCount": 0,
                                    "state": {"waiting": {"reason": "ErrImagePull",
                                                          "message": _pending_pod_message()}}}]}})

        thread = threading.Thread(target=pod_for_the_job, daemon=True)
        thread.start()
        res = CliRunner().invoke(main, ["cluster", "submit", "mlflow", "--kubeconfig", kubeconfig, "--tracking-uri",
                                        tracking_uri, "--wait", "--timeout", "1.5"])
        stop.set()
        thread.join(5)
    assert "still waiting: pod" in res.output and "ErrImagePull" in res.output, res.output
    assert "Rb7xQ2zK9wLp" not in res.output and SECRET not in res.output, res.output
    assert "\x1b" not in res.output, repr(res.output[-400:])


def _plan(tmp_path: Path, path: str) -> tuple[Path, float]:
    from llmpack.cluster.plan import run
    from llmpack.cluster.plan.history import samples_of_runs
    from tests.llmpack.cluster.plan.plan_runs import history as make_history

    samples = samples_of_runs(make_history({(path, "nvidia-h200"): {"provision": (20.0, 40.0), "price": 7.9}}))
    plan = run.plan(samples, run.PlanInputs(capacities=("on-demand",)), today=dt.date(2026, 12, 5)).as_json()
    row = next(o for o in plan["options"] if o["path"] == path)
    assert (row["nodes"], row["gpus"]) == (2, 2)
    out = tmp_path / "plan.json"
    out.write_text(json.dumps(plan))
    return out, float(row["cost_usd"]["total"]["ci"][1])


def _compiled(tmp_path: Path) -> Path:
    from llmpack.cli import main

    out = tmp_path / "c"
    res = CliRunner().invoke(main, ["compile", "--out", str(out), "--nodes", "2", "--gpus", "1", "--cache-pvc",
                                    "shared", "--gpu-type", "nvidia-h200"])
    assert res.exit_code == 0, res.output
    return out


def _gpus_per_node_8(text: str) -> str:
    from components.trainjob.gang import GangSpec, spec_digest

    found = re.search(r"- name: trainjob\n      value: '(.*)'", text)
    assert found
    spec = {**json.loads(found.group(1)), "gpus_per_node": 8}
    text = text.replace(found.group(1), json.dumps(spec, sort_keys=True, separators=(",", ":")))
    return re.sub(r"(LLMPACK_GANG_SPECS\n\s*value: )(\w+)",
                  lambda m: f"{m.group(1)}{m.group(2)},{spec_digest(GangSpec(**spec))}", text)


@pytest.mark.parametrize("edit, extra", [
    (lambda t: re.sub(r"\n\s*- --uses=.*", "", t), ["--param", "nnodes=64"]),
    (lambda t: re.sub(r"--uses=.*", "--uses=[]", t), ["--param", "nnodes=64"]),
    (lambda t: t.replace('"gpus":2,"step":"finetune"', '"gpus":0,"step":"finetune"'), ["--param", "nnodes=64"]),
    (_gpus_per_node_8, []),
], ids=["no-uses", "uses-empty", "uses-finetune-0-gpus", "gang-8-gpus-a-node"])
def test_f3_the_size_check_never_passes_a_run_it_cannot_size(tmp_path: Path, edit, extra: list[str]) -> None:
    from llmpack.cli import main

    plan, high = _plan(tmp_path, "argo")
    workflow = tmp_path / "wf.yaml"
    workflow.write_text(edit((_compiled(tmp_path) / "argo_workflows/finetune.yaml").read_text()))
    res = CliRunner().invoke(main, ["cluster", "submit", "argo", "--host", "http://127.0.0.1:9", "--workflow",
                                    str(workflow), "--plan", str(plan), "--max-cost", f"{high * 1.1:.2f}", *extra])
    assert "unreachable" not in res.output, f"sent under the plan's 2 x 1-GPU row: {res.output.strip()}"
    assert res.exit_code == 2 and "not submitted" in res.output, res.output


def test_f3_an_mlflow_project_without_pipeline_json_is_not_sized_as_unknown(tmp_path: Path) -> None:
    from llmpack.cli import main

    plan, high = _plan(tmp_path, "mlflow")
    project = tmp_path / "proj"
    shutil.copytree(_compiled(tmp_path) / "mlflow_projects/finetune-k8s", project)
    (project / "pipeline.json").unlink()
    (tmp_path / "kc.yaml").write_text(
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'http://127.0.0.1:9'}}]\n"
        "users: [{name: u, user: {token: abcdefgh12345678}}]\n"
        "contexts: [{name: x, context: {cluster: c, user: u, namespace: default}}]\ncurrent-context: x\n")
    res = CliRunner().invoke(main, ["cluster", "submit", "mlflow", "--kubeconfig", str(tmp_path / "kc.yaml"),
                                    "--tracking-uri", f"sqlite:///{tmp_path}/m.db", "--project", str(project),
                                    "--plan", str(plan), "--max-cost", f"{high * 1.1:.2f}", "--param", "nnodes=64"])
    assert "unreachable" not in res.output, f"64 nodes sent under the plan's 2-node row: {res.output.strip()}"
    assert res.exit_code == 2 and "not submitted" in res.output, res.output


@pytest.mark.parametrize("extra", [["--param", "nnodes=inf"], ["--param", "max_steps=1e400"]],
                         ids=["nnodes-inf", "max-steps-1e400"])
def test_f4_an_infinite_size_is_one_line_not_a_traceback(tmp_path: Path, extra: list[str]) -> None:
    from llmpack.cli import main

    plan, high = _plan(tmp_path, "argo")
    res = CliRunner().invoke(main, ["cluster", "submit", "argo", "--host", "http://127.0.0.1:9", "--workflow",
                                    str(_compiled(tmp_path) / "argo_workflows/finetune.yaml"), "--plan", str(plan),
                                    "--max-cost", f"{high * 1.1:.2f}", *extra])
    assert not isinstance(res.exception, OverflowError), f"{type(res.exception).__name__}: {res.exception}"
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output


def test_f5_cluster_timeline_json_is_redacted_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from llmpack.cli import main

    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", SECRET)
    dump = json.loads((Path(__file__).parents[1] / "fixtures/k8s/pods.json").read_text())
    dump["items"][0]["status"].setdefault("conditions", []).append({
        "type": "DisruptionTarget", "status": "True", "lastTransitionTime": "2025-03-14T09:10:00Z",
        "reason": f"Evicted by https://ops:Rb7xQ2zK9wLp@hook.example/ ({SECRET})"})
    pods = tmp_path / "pods.json"
    pods.write_text(json.dumps(dump))
    res = CliRunner().invoke(main, ["cluster", "timeline", "--pods", str(pods), "--json"])
    assert res.exit_code == 0 and "Evicted by" in res.output, res.output
    shown = [row["disruption"] for row in json.loads(res.stdout) if row.get("disruption")]
    assert "Rb7xQ2zK9wLp" not in res.output and SECRET not in res.output, f"printed whole: {shown}"
