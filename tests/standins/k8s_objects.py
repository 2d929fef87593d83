"""Kubernetes objects for the stand-in API and the tests that drive it: selectors, ``Status``
objects, realistic pod states (:func:`pod_states`), nodes, kubelet pull events, and the
synthetic run group the watcher benchmarks play (:func:`synthetic_run_group`).

Pure functions: no server here (:mod:`standins.k8s_api` serves them; it re-exports these names).
"""

from __future__ import annotations

import copy
import hashlib
import heapq
import re
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import datetime, timezone
from typing import Any

# --------------------------------------------------------------------------- selectors

_REQ = re.compile(
    r"^\s*(?P<not>!)?\s*(?P<key>[A-Za-z0-9_./-]+)\s*"
    r"(?:(?P<op>==|=|!=)\s*(?P<value>[A-Za-z0-9_.-]*)|\s+(?P<setop>in|notin)\s*\((?P<values>[^)]*)\))?\s*$"
)


def _split_selector(selector: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in selector:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    return parts


def parse_label_selector(selector: str | None) -> Callable[[Mapping[str, str]], bool]:
    """A predicate on labels for a Kubernetes label selector (equality- and set-based)."""
    reqs = []
    for part in _split_selector(selector or ""):
        m = _REQ.match(part)
        if not m:
            raise ValueError(f"unable to parse requirement: {part!r}")
        key = m.group("key")
        if m.group("not"):
            reqs.append(lambda labels, k=key: k not in labels)
        elif m.group("op") in ("=", "=="):
            reqs.append(lambda labels, k=key, v=m.group("value"): labels.get(k) == v)
        elif m.group("op") == "!=":
            reqs.append(lambda labels, k=key, v=m.group("value"): labels.get(k) != v)
        elif m.group("setop"):
            values = {v.strip() for v in m.group("values").split(",") if v.strip()}
            if m.group("setop") == "in":
                reqs.append(lambda labels, k=key, vs=values: labels.get(k) in vs)
            else:
                reqs.append(lambda labels, k=key, vs=values: labels.get(k) not in vs)
        else:
            reqs.append(lambda labels, k=key: k in labels)
    return lambda labels: all(r(labels or {}) for r in reqs)


def parse_field_selector(selector: str | None) -> Callable[[Mapping[str, Any]], bool]:
    """A predicate on an object for ``a.b=v`` / ``a.b!=v`` field selectors."""
    reqs = []
    for part in _split_selector(selector or ""):
        m = re.match(r"^\s*([A-Za-z0-9_.]+)\s*(==|=|!=)\s*(.*?)\s*$", part)
        if not m:
            raise ValueError(f"unable to parse field selector requirement: {part!r}")
        path, op, value = m.group(1).split("."), m.group(2), m.group(3)

        def get(obj: Mapping[str, Any], path: list[str] = path) -> str:
            for key in path:
                obj = obj.get(key) if isinstance(obj, Mapping) else None
            return "" if obj is None else str(obj)

        if op == "!=":
            reqs.append(lambda obj, g=get, v=value: g(obj) != v)
        else:
            reqs.append(lambda obj, g=get, v=value: g(obj) == v)
    return lambda obj: all(r(obj) for r in reqs)


# --------------------------------------------------------------------------- objects


def status_object(code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        obj["details"] = details
    return obj


def _uid_for(*parts: str) -> str:
    return str(uuid.UUID(hashlib.md5("/".join(parts).encode()).hexdigest()))


def namespace_object(name: str, labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    return {
        "kind": "Namespace",
        "apiVersion": "v1",
        "metadata": {"name": name, "uid": _uid_for("ns", name),
                     "labels": {"kubernetes.io/metadata.name": name, **(labels or {})}},
        "spec": {"finalizers": ["kubernetes"]},
        "status": {"phase": "Active"},
    }


# --------------------------------------------------------------------------- realistic pod states


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def pod_states(name: str, **kwargs: Any) -> list[dict[str, Any]]:
    """The successive states of one pod (see :func:`iter_pod_states`), as a list."""
    return list(iter_pod_states(name, **kwargs))


def iter_pod_states(
    name: str,
    *,
    namespace: str = "llmpack",
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    created: float,
    scheduled: float | None = None,
    node: str | None = None,
    sandbox: float | None = None,
    initialized: float | None = None,
    started: float | None = None,
    finished: float | None = None,
    failed: bool = False,
    main: str = "main",
    argo: bool = True,
    image: str = "ghcr.io/llmpack/llmpack:0.1.0-cuda12.4",
    extra_running_updates: int = 0,
) -> Iterator[dict[str, Any]]:
    """The successive states of one pod, as the API server would publish them (each a full object).

    Pending, then scheduled, initialized, running (plus ``extra_running_updates`` status-only
    updates) and terminated, as far as the given times go. ``argo`` adds Argo's init/wait
    containers; otherwise the single container is named ``main`` (pass ``main=`` to rename it).
    After termination the sandbox is torn down, so PodReadyToStartContainers turns False.
    """
    uid = _uid_for("pod", namespace, name)
    containers: list[dict[str, Any]] = []
    if argo:
        containers.append({"name": "wait", "image": "quay.io/argoproj/argoexec:v3.5.10",
                           "command": ["argoexec", "wait"]})
    containers.append(
        {
            "name": main,
            "image": image,
            "command": ["python", "-m", "components.runtime"],
            "env": [{"name": "LLMPACK_STEP", "value": (labels or {}).get("llmpack.io/step", "")}],
            "resources": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"cpu": "4", "memory": "16Gi"}},
        }
    )
    base: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid,
            "creationTimestamp": _iso(created),
            "labels": dict(labels or {}),
            "annotations": dict(annotations or {}),
        },
        "spec": {
            "containers": containers,
            "initContainers": [{"name": "init", "image": "quay.io/argoproj/argoexec:v3.5.10"}] if argo else [],
            "restartPolicy": "Never",
            "schedulerName": "default-scheduler",
        },
        "status": {"phase": "Pending", "qosClass": "Burstable", "conditions": []},
    }

    def cond(ctype: str, status: bool, t: float, reason: str | None = None) -> dict[str, Any]:
        c = {"type": ctype, "status": "True" if status else "False", "lastProbeTime": None,
             "lastTransitionTime": _iso(t)}
        if reason:
            c["reason"] = reason
        return c

    def snapshot(
        conditions: list[dict[str, Any]], phase: str, statuses: list[dict[str, Any]] | None, counter: int = 0
    ) -> dict[str, Any]:
        obj = copy.deepcopy(base)
        if node and any(c["type"] == "PodScheduled" for c in conditions):
            obj["spec"]["nodeName"] = node
        obj["status"]["phase"] = phase
        obj["status"]["conditions"] = conditions
        if statuses is not None:
            obj["status"]["containerStatuses"] = statuses
        if counter:
            obj["metadata"]["annotations"]["llmpack.io/progress"] = str(counter)
        return obj

    def cstatus(cname: str, state: dict[str, Any], ready: bool) -> dict[str, Any]:
        return {"name": cname, "image": image, "imageID": "", "ready": ready, "restartCount": 0, "started": ready,
                "state": state}

    yield snapshot([], "Pending", None)
    if scheduled is None:
        return
    sched = [cond("PodScheduled", True, scheduled)]
    yield snapshot(sched, "Pending", None)
    if initialized is None:
        return
    sb = sandbox if sandbox is not None else initialized
    waiting = {"waiting": {"reason": "PodInitializing"}}
    pre = [cond("PodReadyToStartContainers", True, sb), cond("Initialized", True, initialized), *sched]
    yield snapshot(pre, "Pending", [cstatus(c["name"], waiting, False) for c in containers])
    if started is None:
        return
    running = [
        cond("PodReadyToStartContainers", True, sb),
        cond("Initialized", True, initialized),
        cond("Ready", True, started),
        cond("ContainersReady", True, started),
        *sched,
    ]
    run_statuses = [cstatus(c["name"], {"running": {"startedAt": _iso(started)}}, True) for c in containers]
    yield snapshot(running, "Running", run_statuses)
    for k in range(extra_running_updates):
        yield snapshot(running, "Running", run_statuses, counter=k + 1)
    if finished is None:
        return
    done = [
        cond("PodReadyToStartContainers", False, finished + 1),
        cond("Initialized", True, initialized, "PodCompleted"),
        cond("Ready", False, finished + 1, "PodCompleted"),
        cond("ContainersReady", False, finished + 1, "PodCompleted"),
        *sched,
    ]
    term = {
        "terminated": {
            "exitCode": 1 if failed else 0,
            "reason": "Error" if failed else "Completed",
            "startedAt": _iso(started),
            "finishedAt": _iso(finished),
        }
    }
    yield snapshot(done, "Failed" if failed else "Succeeded", [cstatus(c["name"], term, False) for c in containers])


def node_object(name: str, *, created: float, ready: float, instance_type: str,
                gpu_product: str | None = None) -> dict[str, Any]:
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "node.kubernetes.io/instance-type": instance_type,
        "topology.kubernetes.io/zone": "us-east-1a",
    }
    if gpu_product:
        labels.update({"nvidia.com/gpu.product": gpu_product, "nvidia.com/gpu.count": "8",
                       "nvidia.com/gpu.present": "true"})
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "uid": _uid_for("node", name), "creationTimestamp": _iso(created), "labels": labels},
        "spec": {"providerID": f"aws:///us-east-1a/i-{hashlib.md5(name.encode()).hexdigest()[:17]}"},
        "status": {
            "conditions": [
                {"type": "MemoryPressure", "status": "False", "lastTransitionTime": _iso(created)},
                {"type": "Ready", "status": "True", "lastTransitionTime": _iso(ready), "reason": "KubeletReady"},
            ],
            "capacity": {"cpu": "192", "memory": "2097017968Ki", "nvidia.com/gpu": "8" if gpu_product else "0"},
        },
    }


def pull_events(
    pod: str,
    *,
    namespace: str = "llmpack",
    container: str = "main",
    image: str = "ghcr.io/llmpack/llmpack:0.1.0-cuda12.4",
    pulling: float,
    pulled: float,
    message_seconds: str | None = None,
) -> list[dict[str, Any]]:
    """A kubelet ``Pulling`` / ``Pulled`` pair for one container of a pod."""
    uid = _uid_for("pod", namespace, pod)
    field_path = f"spec.containers{{{container}}}"
    msg = f'Successfully pulled image "{image}"'
    if message_seconds:
        msg += f" in {message_seconds} ({message_seconds} including waiting). Image size: 9876543210 bytes."
    out = []
    for reason, t, text in (("Pulling", pulling, f'Pulling image "{image}"'), ("Pulled", pulled, msg)):
        out.append(
            {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": f"{pod}.{hashlib.md5((pod + reason + container).encode()).hexdigest()[:16]}",
                             "namespace": namespace},
                "involvedObject": {"kind": "Pod", "name": pod, "namespace": namespace, "uid": uid,
                                   "fieldPath": field_path},
                "reason": reason,
                "message": text,
                "type": "Normal",
                "count": 1,
                "eventTime": None,
                "firstTimestamp": _iso(t),
                "lastTimestamp": _iso(t),
                "source": {"component": "kubelet"},
            }
        )
    return out


# --------------------------------------------------------------------------- synthetic run group (benchmark)

SYNTHETIC_T0 = 1741946400.0  # 2025-03-14T10:00:00Z


def synthetic_run_group(
    pods: int,
    events: int,
    *,
    run_group: str = "bench",
    namespace: str = "llmpack",
    pods_per_node: int = 8,
    pulls_in_stream: bool = False,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], Iterator[dict[str, Any]]]:
    """Nodes, pull events, and a lazy time-ordered stream of ``events`` pod states for ``pods`` pods.

    Every pod goes Pending -> scheduled -> initialized -> running -> Succeeded (5 states); the
    rest of the ``events`` budget is spread as running-status updates, so the last state of every
    pod is terminal whatever the count. Half the nodes are created after their pods (autoscaled).
    Each pod's ``Pulling``/``Pulled`` events are returned apart, to be stored first, or, with
    ``pulls_in_stream``, come in the stream at their times (as a kubelet makes them: after the
    pod is initialized, before its container starts), and the list returned is empty.
    """
    if events < 5 * pods:
        raise ValueError(f"need at least 5 events per pod ({5 * pods}), got {events}")
    extra, remainder = divmod(events - 5 * pods, pods)
    n_nodes = max(1, -(-pods // pods_per_node))
    nodes, pulls, streams = [], [], []
    for n in range(n_nodes):
        first_created = SYNTHETIC_T0 + n * pods_per_node * 0.5
        autoscaled = n % 2 == 1
        created = first_created + 30 if autoscaled else SYNTHETIC_T0 - 86400
        nodes.append(
            node_object(
                f"ip-10-1-{n // 250}-{n % 250}.ec2.internal",
                created=created,
                ready=created + 90,
                instance_type="p5.48xlarge",
                gpu_product="NVIDIA-H100-80GB-HBM3",
            )
        )
    for i in range(pods):
        node = nodes[i // pods_per_node]
        node_ready = _parse_iso(node["status"]["conditions"][1]["lastTransitionTime"])
        created = SYNTHETIC_T0 + i * 0.5
        scheduled = max(created + 1, node_ready + 2)
        initialized = scheduled + 4
        started = initialized + 20
        finished = started + 600 + (i % 17)
        name = f"llm-finetune-b{i // 5:04d}-step{i % 5}-{1000000000 + i * 7919}"
        labels = {
            "llmpack.io/run-group": run_group,
            "llmpack.io/pipeline-run": f"argo-b{i // 5:04d}",
            "llmpack.io/orchestrator": "argo",
            "llmpack.io/step": ("prepare-data", "tokenize", "finetune", "evaluate", "register")[i % 5],
            "llmpack.io/mode": "cluster",
            "workflows.argoproj.io/workflow": f"llm-finetune-b{i // 5:04d}",
        }
        annotations = {"workflows.argoproj.io/node-name": f"llm-finetune-b{i // 5:04d}.{labels['llmpack.io/step']}"}
        n_extra = extra + (1 if i < remainder else 0)
        states = iter_pod_states(
            name,
            namespace=namespace,
            labels=labels,
            annotations=annotations,
            created=created,
            scheduled=scheduled,
            node=node["metadata"]["name"],
            sandbox=scheduled + 2,
            initialized=initialized,
            started=started,
            finished=finished,
            extra_running_updates=n_extra,
        )
        times = [created, scheduled, initialized, started] + [
            started + (finished - started) * (k + 1) / (n_extra + 1) for k in range(n_extra)
        ] + [finished]
        pod_stream: Iterable[tuple[tuple[float, int, float], dict[str, Any]]] = _keyed(i, times, states)
        pod_pulls = pull_events(name, namespace=namespace, pulling=initialized, pulled=started - 1,
                                message_seconds="18.5s")
        if pulls_in_stream:  # Pulling just after the initialized state (k 2), Pulled a second before the start (k 3)
            pod_stream = heapq.merge(pod_stream,
                                     [((initialized, i, 2.5), pod_pulls[0]), ((started - 1, i, 2.7), pod_pulls[1])],
                                     key=lambda item: item[0])
        else:
            pulls.extend(pod_pulls)
        streams.append(pod_stream)
    merged = (state for _, state in heapq.merge(*streams, key=lambda item: item[0]))
    return nodes, pulls, merged


def _keyed(i: int, times: list[float],
           states: Iterable[dict[str, Any]]) -> Iterator[tuple[tuple[float, int, float], dict[str, Any]]]:
    """Pod ``i``'s states keyed (time, pod, index) for the merge (a function: ``i`` bound now, not late)."""
    for k, (t, state) in enumerate(zip(times, states, strict=True)):
        yield (t, i, k), state


def _parse_iso(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()


def present_event(pod: dict[str, Any], namespace: str, container: str, when: float, *,
                  image: str) -> dict[str, Any]:
    """The kubelet's ``Pulled`` event for a container whose image was already on the node."""
    name = pod["metadata"]["name"]
    t = _iso(when)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{name}.present.{container}", "namespace": namespace},
        "involvedObject": {"kind": "Pod", "name": name, "namespace": namespace, "uid": pod["metadata"]["uid"],
                           "fieldPath": f"spec.containers{{{container}}}"},
        "reason": "Pulled",
        "message": f'Container image "{image}" already present on machine',
        "type": "Normal",
        "count": 1,
        "eventTime": None,
        "firstTimestamp": t,
        "lastTimestamp": t,
        "source": {"component": "kubelet"},
    }
