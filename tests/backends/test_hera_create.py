"""Hera users' path: import the pipeline's ``Workflow``, parameterize it, ``.create()`` and ``.wait()``.

Driven by Hera's own ``Workflow.create`` / ``Workflow.wait`` against the stand-in Argo Server on
127.0.0.1, configured the way a Hera user's shell is (the ``argo`` CLI's environment, or Hera's
``global_config``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from standins.argo_server import ArgoServerStandIn

from argo_workflows.pipeline import finetune_workflow
from components.errors import InputError
from components.record.close import CLOSE_TASK

REPO = Path(__file__).resolve().parents[2]
TOKEN = "argo-standin-token"
ENV = ("ARGO_SERVER", "ARGO_TOKEN", "ARGO_NAMESPACE", "ARGO_SECURE", "ARGO_INSECURE_SKIP_VERIFY", "ARGO_BASE_HREF")


@pytest.fixture(autouse=True)
def isolated(monkeypatch: pytest.MonkeyPatch):
    from hera.shared import global_config

    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    global_config.reset()
    yield
    global_config.reset()


@pytest.fixture()
def argo():
    with ArgoServerStandIn(token=TOKEN) as server:
        yield server


def test_create_from_the_argo_cli_environment(argo: ArgoServerStandIn, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("ARGO_SERVER", argo.url)
    monkeypatch.setenv("ARGO_TOKEN", TOKEN)
    monkeypatch.setenv("ARGO_NAMESPACE", "llmpack")
    wf = finetune_workflow(max_steps=200, seed=3)
    created = wf.create()
    assert created.metadata.name.startswith("llm-finetune-")

    (post,) = argo.recorded("POST")
    assert post.path == "/api/v1/workflows/llmpack"
    assert post.authorized  # the stand-in checked the bearer token (and never records it)
    sent = post.body["workflow"]
    args = {p["name"]: p["value"] for p in sent["spec"]["arguments"]["parameters"]}
    assert args["max_steps"] == "200" and args["seed"] == "3"
    assert args["mode"] == "cluster" and args["pipeline_run"] == "" and args["submitted_at"] == "0.0"
    assert sent["spec"]["onExit"] == CLOSE_TASK  # the run closes its own record, whoever created it

    # Apart from the arguments, what Hera sent is the committed artifact.
    golden = yaml.safe_load((REPO / "argo_workflows" / "finetune.yaml").read_text())
    assert sent["spec"]["templates"] == golden["spec"]["templates"]


def test_wait_follows_the_workflow_to_its_end(argo: ArgoServerStandIn, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("ARGO_SERVER", argo.url)
    monkeypatch.setenv("ARGO_TOKEN", TOKEN)
    wf = finetune_workflow()
    created = wf.create()
    argo.set_phase("llmpack", created.metadata.name, "Succeeded")
    done = wf.wait(poll_interval=0)
    assert done.status.phase == "Succeeded"


def test_hera_global_config_wins_over_the_environment(argo: ArgoServerStandIn, monkeypatch: pytest.MonkeyPatch):
    from hera.shared import global_config

    monkeypatch.setenv("ARGO_SERVER", "https://127.0.0.1:9")  # would fail if used
    global_config.host = argo.url
    global_config.token = TOKEN
    global_config.namespace = "argo"
    created = finetune_workflow(model="tiny").create()
    assert created.metadata.namespace == "argo"
    assert [p.path for p in argo.recorded("POST")] == ["/api/v1/workflows/argo"]


def test_an_unknown_parameter_is_one_line():
    with pytest.raises(InputError, match="unknown parameter 'max_step'"):
        finetune_workflow(max_step=3, workflows_service=object())


def test_no_server_configured_names_the_fix():
    with pytest.raises(InputError, match="set ARGO_SERVER"):
        finetune_workflow()
