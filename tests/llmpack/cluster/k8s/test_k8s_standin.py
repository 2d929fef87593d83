"""The stand-in Kubernetes API itself, driven by the real kubernetes client (Jobs, lists, selectors)."""

from __future__ import annotations

import json

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from standins.k8s_api import KubeAPIStandIn, parse_field_selector, parse_label_selector, pod_states, synthetic_run_group

from llmpack.cluster.k8s.api import build_api_client

TOKEN = "standin-token-b3"


@pytest.fixture
def api():
    with KubeAPIStandIn(token=TOKEN, namespaces=("default", "llmpack")) as server:
        yield server


@pytest.fixture
def batch(api):
    return k8s.BatchV1Api(build_api_client(host=api.url, token=TOKEN))


def _job(name: str) -> dict:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": "llmpack", "labels": {"llmpack.io/orchestrator": "mlflow"}},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": {"llmpack.io/run-group": "g1"}},
                "spec": {"restartPolicy": "Never", "containers": [{"name": "llmpack-finetune", "image": "img:1"}]},
            },
        },
    }


def test_jobs_are_stored_returned_and_recorded(api, batch):
    created_hook = []
    api.on_job_created = created_hook.append
    job = batch.create_namespaced_job(namespace="llmpack", body=_job("llmpack-finetune-2025-03-14-09-00-02-417305"))
    assert job.metadata.uid and job.metadata.resource_version
    assert job.spec.template.spec.containers[0].name == "llmpack-finetune"
    [request] = api.recorded("POST", "/apis/batch/v1/namespaces/llmpack/jobs")
    assert request.body["spec"]["template"]["metadata"]["labels"] == {"llmpack.io/run-group": "g1"}
    assert "Authorization" not in request.headers and request.authorized
    assert created_hook[0]["metadata"]["name"] == job.metadata.name

    assert batch.read_namespaced_job_status(job.metadata.name, "llmpack").status.start_time is None
    api.set_job_status("llmpack", job.metadata.name, {"startTime": "2025-03-14T09:00:03Z", "succeeded": 1,
                                                     "conditions": [{"type": "Complete", "status": "True"}]})
    status = batch.read_namespaced_job_status(job.metadata.name, "llmpack").status
    assert status.succeeded == 1 and status.conditions[0].type == "Complete"
    assert [j.metadata.name for j in batch.list_namespaced_job("llmpack").items] == [job.metadata.name]

    with pytest.raises(ApiException) as info:
        batch.create_namespaced_job(namespace="llmpack", body=_job(job.metadata.name))
    assert info.value.status == 409 and json.loads(info.value.body)["reason"] == "AlreadyExists"
    with pytest.raises(ApiException) as info:
        batch.create_namespaced_job(namespace="nowhere", body=_job("x"))
    assert info.value.status == 404

    batch.delete_namespaced_job(job.metadata.name, "llmpack", body=k8s.V1DeleteOptions())
    with pytest.raises(ApiException) as info:
        batch.read_namespaced_job(job.metadata.name, "llmpack")
    assert info.value.status == 404


def test_wrong_token_is_401(api):
    core = k8s.CoreV1Api(build_api_client(host=api.url, token="nope"))
    with pytest.raises(ApiException) as info:
        core.list_namespaced_pod("llmpack")
    assert info.value.status == 401 and json.loads(info.value.body)["kind"] == "Status"


def test_list_pages_and_selectors_through_the_client(api):
    for i in range(7):
        api.apply_pod(pod_states(f"p{i}", labels={"llmpack.io/run-group": "g" if i % 2 else "h"}, created=0.0)[0])
    core = k8s.CoreV1Api(build_api_client(host=api.url, token=TOKEN))
    page = core.list_namespaced_pod("llmpack", label_selector="llmpack.io/run-group=g", limit=2)
    assert [p.metadata.name for p in page.items] == ["p1", "p3"] and page.metadata._continue
    rest = core.list_namespaced_pod("llmpack", label_selector="llmpack.io/run-group=g", limit=2,
                                    _continue=page.metadata._continue)
    assert [p.metadata.name for p in rest.items] == ["p5"] and not rest.metadata._continue
    assert int(page.metadata.resource_version) == api.resource_version
    assert core.read_namespace("llmpack").status.phase == "Active"
    with pytest.raises(ApiException) as info:
        core.read_namespace("nope")
    assert info.value.status == 404


def test_selector_parsers():
    match = parse_label_selector("a=1,b!=2,c,!d,e in (x, y),f notin (z)")
    assert match({"a": "1", "b": "3", "c": "", "e": "x", "f": "q"})
    assert not match({"a": "1", "b": "3", "c": "", "e": "x", "f": "z"})
    assert not match({"a": "1", "b": "3", "c": "", "d": "", "e": "x"})
    assert parse_label_selector("")({})
    with pytest.raises(ValueError):
        parse_label_selector("a=(")
    by_field = parse_field_selector("involvedObject.kind=Pod,reason!=Started")
    assert by_field({"involvedObject": {"kind": "Pod"}, "reason": "Pulled"})
    assert not by_field({"involvedObject": {"kind": "Pod"}, "reason": "Started"})


def test_synthetic_run_group_shape():
    nodes, pulls, stream = synthetic_run_group(20, 130)
    states = list(stream)
    assert len(states) == 130 and len(nodes) == 3 and len(pulls) == 40
    last = {}
    for s in states:
        last[s["metadata"]["name"]] = s["status"]["phase"]
    assert len(last) == 20 and set(last.values()) == {"Succeeded"}
    with pytest.raises(ValueError):
        synthetic_run_group(10, 20)

    _, none_apart, stream = synthetic_run_group(20, 130, pulls_in_stream=True)
    items = list(stream)
    assert none_apart == [] and len(items) == 130 + 40
    for pod in last:  # each pod's pulls come after its initialized state and before its container starts
        kinds = [("Event", i["reason"]) if i.get("kind") == "Event"
                 else ("Pod", bool(i["status"].get("containerStatuses")
                                   and "running" in i["status"]["containerStatuses"][0].get("state", {})))
                 for i in items if (i.get("involvedObject") or i["metadata"])["name"] == pod]
        pulling, pulled = kinds.index(("Event", "Pulling")), kinds.index(("Event", "Pulled"))
        assert 2 < pulling < pulled < kinds.index(("Pod", True))
