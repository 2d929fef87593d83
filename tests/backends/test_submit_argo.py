"""``llmpack submit argo``: Hera's ``WorkflowsService`` against the stand-in Argo Server on 127.0.0.1."""

from __future__ import annotations

import copy
import logging
import socket
import time
from pathlib import Path

import pytest
import yaml
from standins.argo_server import ArgoServerStandIn

from argo_workflows import submit as argo_submit
from components.errors import InputError
from llmpack.cluster import submit

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "argo_workflows" / "finetune.yaml"
TOKEN = "argo-standin-token"
BAD_TOKEN = "wrong-token-Hq93xArg0SECRET"
ENV = ("ARGO_SERVER", "ARGO_TOKEN", "ARGO_NAMESPACE", "ARGO_SECURE", "ARGO_INSECURE_SKIP_VERIFY", "ARGO_BASE_HREF",
       "MLFLOW_TRACKING_URI", "LLMPACK_PRICE_PER_GPU_HOUR")


@pytest.fixture(autouse=True)
def isolated(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture()
def argo():
    with ArgoServerStandIn(token=TOKEN) as server:
        yield server


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def golden() -> dict:
    return yaml.safe_load(GOLDEN.read_text(encoding="utf-8"))


def test_submit_sends_the_committed_workflow_with_run_arguments(argo: ArgoServerStandIn) -> None:
    before = time.time()
    summary = argo_submit.submit(argo_submit.Request(host=argo.url, token=TOKEN,
                                 params={"model": "tiny", "data": "builtin", "max_steps": 7, "seed": 3}))
    after = time.time()

    (post,) = argo.recorded("POST")
    assert post.path == "/api/v1/workflows/llmpack"
    assert post.body["namespace"] == "llmpack"
    sent = post.body["workflow"]
    expected_values = {
        "model": "tiny", "data": "builtin", "max_steps": "7", "seed": "3",
        "submitted_at": repr(summary["submitted_at"]), "run_group": summary["run_group"],
        "pipeline_run": summary["pipeline_run"], "orchestrator": "argo", "mode": "cluster",
    }
    # The request IS the compiled Workflow: its spec, with only the arguments' values set.
    expected = golden()
    for param in expected["spec"]["arguments"]["parameters"]:
        param["value"] = expected_values.get(param["name"], param["value"])
    assert sent["spec"] == expected["spec"]
    assert {p["name"]: p["value"] for p in sent["spec"]["arguments"]["parameters"]} == {
        **{p["name"]: p["value"] for p in golden()["spec"]["arguments"]["parameters"]}, **expected_values}
    assert before <= float(expected_values["submitted_at"]) <= after
    # Metadata: as compiled, plus the per-run labels.
    assert sent["metadata"]["generateName"] == golden()["metadata"]["generateName"]
    assert sent["metadata"]["labels"] == {**golden()["metadata"]["labels"],
                                          "llmpack.io/run-group": summary["run_group"],
                                          "llmpack.io/pipeline-run": summary["pipeline_run"]}
    assert sent["metadata"]["annotations"] == golden()["metadata"]["annotations"]

    ((ns, name),) = argo.workflows
    assert (ns, name) == ("llmpack", summary["workflow_name"]) and summary["server_id"] == name
    assert name.startswith("llm-finetune-")
    assert summary["mode"] == "cluster" and summary["orchestrator"] == "argo"
    assert summary["url"] == f"{argo.url}/workflows/llmpack/{name}"
    assert all(r.authorized for r in argo.requests)
    assert TOKEN not in repr(summary)


def test_server_and_token_from_the_environment_like_the_argo_cli(argo: ArgoServerStandIn,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ARGO_SERVER", argo.url.removeprefix("http://"))  # host:port, as `argo` takes it
    monkeypatch.setenv("ARGO_SECURE", "false")
    monkeypatch.setenv("ARGO_TOKEN", f"Bearer {TOKEN}")
    monkeypatch.setenv("ARGO_NAMESPACE", "argo")
    summary = argo_submit.submit(argo_submit.Request())
    assert summary["namespace"] == "argo" and ("argo", summary["workflow_name"]) in argo.workflows
    assert argo.recorded("POST")[0].path == "/api/v1/workflows/argo"


def test_wait_for_completion_polls_until_the_workflow_ends(argo: ArgoServerStandIn) -> None:
    summary = argo_submit.submit(argo_submit.Request(host=argo.url, token=TOKEN))
    result = submit.wait_for_completion(summary, token=TOKEN, poll_s=0.01, timeout_s=10)
    assert result["status"] == "succeeded" and result["state"] == "Succeeded"
    assert len(argo.recorded("GET", summary["workflow_name"])) == 3


def test_wait_reports_failure_and_timeout() -> None:
    with ArgoServerStandIn(token=TOKEN, phases=("Pending", "Running")) as server:
        summary = argo_submit.submit(argo_submit.Request(host=server.url, token=TOKEN))
        name = summary["workflow_name"]
        stuck = argo_submit.wait_for_workflow(name, host=server.url, token=TOKEN, poll_s=0.01, timeout_s=0.2)
        assert stuck["status"] == "timeout" and stuck["state"] == "Running"
        server.set_phase("llmpack", name, "Failed", message="child 'llm-finetune-x-123' failed")
        failed = argo_submit.wait_for_workflow(name, host=server.url, token=TOKEN, poll_s=0.01, timeout_s=5)
        assert failed["status"] == "failed" and "failed" in failed["error"]


def test_bad_token_is_one_line_without_the_token(argo: ArgoServerStandIn, capsys: pytest.CaptureFixture[str],
                                                 caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    with pytest.raises(InputError) as info:
        argo_submit.submit(argo_submit.Request(host=argo.url, token=BAD_TOKEN))
    message = str(info.value)
    assert "401" in message and "\n" not in message
    out, err = capsys.readouterr()
    for text in (message, out, err, caplog.text):
        assert BAD_TOKEN not in text
    assert argo.workflows == {}


def test_unreachable_endpoint() -> None:
    start = time.monotonic()
    with pytest.raises(InputError, match="unreachable") as info:
        argo_submit.submit(argo_submit.Request(host=f"http://127.0.0.1:{closed_port()}", token=BAD_TOKEN))
    assert time.monotonic() - start < 5
    assert BAD_TOKEN not in str(info.value)


def test_no_endpoint_configured() -> None:
    with pytest.raises(InputError, match="no Argo Server configured.*ARGO_SERVER"):
        argo_submit.submit(argo_submit.Request(token=TOKEN))


def test_namespace_not_found_and_forbidden() -> None:
    with ArgoServerStandIn(token=TOKEN, forbidden_namespaces=("kube-system",)) as server:
        with pytest.raises(InputError, match="namespace 'nope' not found"):
            argo_submit.submit(argo_submit.Request(host=server.url, token=TOKEN, namespace="nope"))
        with pytest.raises(InputError, match="403.*kube-system|kube-system.*403"):
            argo_submit.submit(argo_submit.Request(host=server.url, token=TOKEN, namespace="kube-system"))
        with pytest.raises(InputError, match="--namespace"):
            argo_submit.submit(argo_submit.Request(host=server.url, token=TOKEN, namespace="Not_A_Namespace"))


def test_bad_parameters_fail_before_any_request(argo: ArgoServerStandIn) -> None:
    with pytest.raises(InputError, match="unknown pipeline parameter"):
        argo_submit.submit(argo_submit.Request(host=argo.url, token=TOKEN, params={"epochs": 3}))
    with pytest.raises(InputError, match="must be a positive"):
        argo_submit.submit(argo_submit.Request(host=argo.url, token=TOKEN, params={"max_steps": 0}))
    assert argo.requests == []


def test_workflow_file_checks(argo: ArgoServerStandIn, tmp_path: Path) -> None:
    doc = golden()
    doc["spec"]["arguments"]["parameters"] = [p for p in doc["spec"]["arguments"]["parameters"] if p["name"] != "seed"]
    missing = tmp_path / "missing-seed.yaml"
    missing.write_text(yaml.safe_dump(doc))
    with pytest.raises(InputError, match="the compiled pipeline has no parameter 'seed'"):
        argo_submit.submit(argo_submit.Request(host=argo.url, token=TOKEN, workflow_path=missing, params={"seed": 1}))
    with pytest.raises(InputError, match="not an Argo Workflow"):
        argo_submit.submit(argo_submit.Request(
            host=argo.url, token=TOKEN,
            workflow_path=REPO / "mlflow_projects" / "finetune-k8s" / "kubernetes_job_template.yaml"))
    assert argo.requests == []
    # Not given, seed is still referenced by the tasks: the server refuses to resolve it (400).
    with pytest.raises(InputError,
                       match=r"refused the Workflow \(400\): failed to resolve \{\{workflow.parameters.seed\}\}"):
        argo_submit.submit(argo_submit.Request(host=argo.url, token=TOKEN, workflow_path=missing))

    # What only the server checks: a DAG task naming a template that does not exist (400).
    broken = copy.deepcopy(golden())
    broken["spec"]["templates"][0]["dag"]["tasks"][0]["template"] = "no-such-template"
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(broken))
    with pytest.raises(InputError, match="refused the Workflow \\(400\\).*no-such-template"):
        argo_submit.submit(argo_submit.Request(host=argo.url, token=TOKEN, workflow_path=path))


def test_mlflow_record_when_a_tracking_uri_is_given(argo: ArgoServerStandIn, tracking_uri: str) -> None:
    from components.record import tracking

    summary = argo_submit.submit(argo_submit.Request(host=argo.url, token=TOKEN, tracking_uri=tracking_uri))
    tags = tracking.client(tracking_uri).get_run(summary["mlflow_run_id"]).data.tags
    assert tags["llmpack.mode"] == "cluster" and tags["llmpack.orchestrator"] == "argo"
    assert tags["llmpack.argo.workflow"] == summary["workflow_name"]
    assert tags["llmpack.price_per_gpu_hour"] and tags["llmpack.gpu_type"]
