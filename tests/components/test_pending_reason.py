"""A ``--wait`` that ran out of time says why the run's pod never started (trial 7: a Job whose claim did not
exist waited two minutes and said only ``timeout``): the scheduler's reason, the kubelet's, or no pod at all."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client as k8s

from components.servers.pending import pending_reason


def _pod(name: str, phase: str, *, scheduled: str | None = None, waiting: str | None = None) -> k8s.V1Pod:
    conditions = [k8s.V1PodCondition(type="PodScheduled", status="False", reason="Unschedulable",
                                      message=scheduled)] if scheduled else None
    statuses = [k8s.V1ContainerStatus(name="main", image="x", image_id="", ready=False, restart_count=0,
                                      state=k8s.V1ContainerState(waiting=k8s.V1ContainerStateWaiting(
                                          reason=waiting, message="Back-off pulling image")))] if waiting else None
    return k8s.V1Pod(metadata=k8s.V1ObjectMeta(name=name),
                     status=k8s.V1PodStatus(phase=phase, conditions=conditions, container_statuses=statuses))


def _with_pods(monkeypatch: pytest.MonkeyPatch, pods: list[k8s.V1Pod] | Exception) -> list[dict[str, Any]]:
    asked: list[dict[str, Any]] = []

    class Core:
        def __init__(self, _api: Any) -> None: ...

        def list_namespaced_pod(self, namespace: str, **kw: Any) -> k8s.V1PodList:
            asked.append({"namespace": namespace, **kw})
            if isinstance(pods, Exception):
                raise pods
            return k8s.V1PodList(items=pods)

    monkeypatch.setattr(k8s, "CoreV1Api", Core)
    return asked


def test_the_schedulers_reason_is_said_redacted(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = _with_pods(monkeypatch, [_pod("done", "Succeeded"), _pod("j-abc", "Pending", scheduled=(
        '0/2 nodes are available: persistentvolumeclaim "llmpack-artifacts" not found. s3cr3t-t0ken'))])
    said = pending_reason(object(), "llmpack", "job-name=j", ["s3cr3t-t0ken"])
    assert said == ('pod j-abc is Pending: Unschedulable: 0/2 nodes are available: persistentvolumeclaim '
                    '"llmpack-artifacts" not found. ***')
    assert asked[0]["namespace"] == "llmpack" and asked[0]["label_selector"] == "job-name=j"


def test_the_kubelets_reason_no_pod_and_an_unreadable_list(monkeypatch: pytest.MonkeyPatch) -> None:
    _with_pods(monkeypatch, [_pod("j-abc", "Pending", waiting="ImagePullBackOff")])
    assert pending_reason(object(), "ns", "s") == "pod j-abc is Pending: ImagePullBackOff: Back-off pulling image"
    _with_pods(monkeypatch, [])
    assert pending_reason(object(), "ns", "s") == "no pod was created yet"
    _with_pods(monkeypatch, [_pod("j", "Running")])
    assert pending_reason(object(), "ns", "s") is None
    _with_pods(monkeypatch, k8s.ApiException(status=403))
    assert pending_reason(object(), "ns", "s") is None
