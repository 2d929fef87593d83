"""What the compiled GPU pods ask of a cluster's capacity and admission, for ``llmpack cluster doctor``.

A GPU count per node is not enough to say a run will start: the scheduler also needs a node whose
allocatable CPU, memory and ephemeral storage hold the pod's requests, and admission refuses a
pod that a namespace's ResourceQuota or LimitRange does not admit. The pods' requests are read
from the compiled artifacts (the MLflow Job template, the Argo Workflow's templates, the TrainJob's
``resourcesPerNode`` times ``numNodes``), never assumed; what they are held to is read from the
cluster: each node's ``status.allocatable``, each ResourceQuota's ``hard`` less its ``used``, each
LimitRange's ``max`` and ``default``. The kinds the artifacts create outside Kubernetes' own API
groups (the TrainJob, the Workflow) are checked as served, and the namespace the artifacts were
compiled for is compared with the one checked.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from llmpack.cluster.doctor.checks import GPU_RESOURCE, Check, GpuPlacement, blocking_taints
from llmpack.cluster.doctor.gang import trainer_install
from llmpack.cluster.doctor.reader import ClusterReader, Missing, Unanswered, unread

_q = shlex.quote

FIT_RESOURCES = ("cpu", "memory", "ephemeral-storage", GPU_RESOURCE)  # what a node's allocatable must hold
BUILTIN_GROUPS = ("", "batch", "apps", "rbac.authorization.k8s.io")  # served by every conformant API server
MLFLOW_TEMPLATE = "mlflow_projects/finetune-k8s/kubernetes_job_template.yaml"


@dataclass(frozen=True)
class GpuPod:
    """One compiled GPU pod: where it comes from, its requests and limits, and how many of it run at once."""

    where: str
    requests: Mapping[str, Decimal]
    limits: Mapping[str, Decimal] = field(default_factory=dict)
    count: int = 1

    def shown(self) -> str:
        return ", ".join(f"{_show(k, v)}" for k, v in self.requests.items())


def _quantity(value: Any) -> Decimal:
    from kubernetes.utils import parse_quantity

    try:
        return Decimal(parse_quantity(str(value)))
    except (ValueError, ArithmeticError):
        return Decimal(0)


def _show(resource: str, amount: Decimal) -> str:
    if resource in ("memory", "ephemeral-storage") and amount >= 2**30:
        return f"{amount / 2**30:g}Gi {resource}"
    return f"{amount.normalize():f} {resource}"


def _amounts(values: Any) -> dict[str, Decimal]:
    return {str(k): _quantity(v) for k, v in (values or {}).items() if "{{" not in str(v)}


def _gpu_container(container: Any, where: str) -> Iterator[GpuPod]:
    res = (container or {}).get("resources") or {} if isinstance(container, Mapping) else {}
    requests, limits = _amounts(res.get("requests")), _amounts(res.get("limits"))
    if max(requests.get(GPU_RESOURCE, 0), limits.get(GPU_RESOURCE, 0)) > 0:
        yield GpuPod(where, {**{k: v for k, v in limits.items() if k == GPU_RESOURCE}, **requests}, limits)


def _containers_with_gpus(doc: Any, path: str) -> Iterator[GpuPod]:
    """Every GPU container in ``doc`` (requests or limits of ``nvidia.com/gpu`` above 0): a pod spec's
    ``containers``, or a template that runs one ``container`` or ``script`` (a workflow's step), named by it."""
    if isinstance(doc, Mapping):
        if isinstance(doc.get("containers"), list):
            for c in doc["containers"]:
                yield from _gpu_container(c, f"{path} pod")
            return
        one = doc.get("container") or doc.get("script")
        if isinstance(one, Mapping) and "image" in one:
            yield from _gpu_container(one, f"{path} template {doc.get('name')}")
            return
        for value in doc.values():
            yield from _containers_with_gpus(value, path)
    elif isinstance(doc, list):
        for item in doc:
            yield from _containers_with_gpus(item, path)


def gpu_pods(root: Path, path: str, *, gang: bool) -> list[GpuPod]:
    """The GPU pods ``path``'s compiled artifact under ``root`` runs, and with ``gang`` the TrainJob's node pods."""
    from llmpack.cluster.doctor.pods import TRAINJOB_ARTIFACT, artifact_of, load_compiled

    pods = list(_containers_with_gpus(load_compiled(root / artifact_of(path)), path))
    if gang:
        for job in load_compiled(root / TRAINJOB_ARTIFACT):
            trainer = ((job or {}).get("spec") or {}).get("trainer") or {}
            res = trainer.get("resourcesPerNode") or {}
            limits = _amounts(res.get("limits"))
            pods.append(GpuPod("TrainJob node pod", {**{k: v for k, v in limits.items() if k == GPU_RESOURCE},
                                                     **_amounts(res.get("requests"))}, limits,
                               count=int(trainer.get("numNodes") or 1)))
    return pods


# --------------------------------------------------------------------------- nodes


def _allocatable(node: Mapping[str, Any]) -> dict[str, Decimal]:
    return _amounts((node.get("status") or {}).get("allocatable"))


def _short(node: Mapping[str, Any], pod: GpuPod, held: Mapping[str, Decimal] | None = None) -> list[str]:
    """What ``node`` lacks for ``pod``'s requests (empty: it fits), the GPUs ``held`` by pods bound there counted."""
    have = _allocatable(node)
    taken = (held or {}).get(node["metadata"]["name"], Decimal(0))
    have[GPU_RESOURCE] = have.get(GPU_RESOURCE, Decimal(0)) - taken
    return [f"{_show(r, pod.requests[r])} (has {_show(r, have.get(r, Decimal(0)))}"
            + (f" free, {taken.normalize():f} held by other pods)" if r == GPU_RESOURCE and taken else ")")
            for r in FIT_RESOURCES if pod.requests.get(r, 0) > have.get(r, Decimal(0))]


def node_fit(cluster: ClusterReader, placement: GpuPlacement, pods: list[GpuPod]) -> list[Check]:
    """Each GPU pod's requests fit the allocatable CPU, memory, ephemeral storage and GPUs of as many
    schedulable, tolerated nodes of the GPU type as run it at once (the gang: ``numNodes`` of them)."""
    from llmpack.cluster.doctor.checks import placed_nodes

    try:
        nodes = [n for n in placed_nodes(cluster, placement)
                 if not blocking_taints(n, placement.tolerations) and not (n.get("spec") or {}).get("unschedulable")]
    except Unanswered as exc:
        return [unread(exc, "Node list")]
    if not nodes:
        return []  # gpu_nodes has said why there is none
    held, note = held_gpus(cluster)
    checks: list[Check] = [note] if note else []
    for pod in pods:
        fits = [n for n in nodes if not _short(n, pod, held)]
        if len(fits) >= pod.count:
            checks.append(Check(True, f"{pod.where} ({pod.shown()}) fits {len(fits)} GPU node(s) (need {pod.count})"))
            continue
        worst = next((n for n in nodes if _short(n, pod, held)), nodes[0])
        name = worst["metadata"]["name"]
        lacks = _short(worst, pod, held)
        if not _short(worst, pod):  # it fits an empty node: other pods hold its GPUs
            fix = (f"kubectl get pods -A --field-selector spec.nodeName={_q(name)},status.phase=Running -o wide  # "
                   "the pods holding its GPUs: wait for them, or move them off the GPU nodes")
        else:
            fix = ("kubectl describe node " + _q(name) + "  # Allocatable; a larger instance type, or llmpack compile "
                   "--gpus fewer (the pod's CPU and memory follow its GPUs)")
        checks.append(Check(False, f"{pod.where} ({pod.shown()}) fits {len(fits)} GPU node(s), needs {pod.count}: "
                            f"{name} lacks {'; '.join(lacks)}", fix))
    return checks


# --------------------------------------------------------------------------- GPUs already held


def held_gpus(cluster: ClusterReader) -> tuple[dict[str, Decimal], Any]:
    """``node -> GPUs`` requested by the pods bound there and not finished (the scheduler counts them), or the
    note saying they were not counted."""
    from llmpack.cluster.doctor.reader import Forbidden
    from llmpack.cluster.doctor.waits import Note

    try:
        pods = cluster.everywhere("", "v1", "pods", "status.phase!=Succeeded,status.phase!=Failed")
    except (Forbidden, Missing) as exc:
        return {}, Note(True, f"GPUs held by other pods not counted: you may not list pods cluster-wide ({exc})")
    except Unanswered as exc:
        return {}, Note(True, f"GPUs held by other pods not counted: the pod list was not answered ({exc})")
    held: dict[str, Decimal] = {}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if not node or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        for container in (pod.get("spec") or {}).get("containers") or []:
            res = container.get("resources") or {}
            asked = max(_amounts(res.get("requests")).get(GPU_RESOURCE, Decimal(0)),
                        _amounts(res.get("limits")).get(GPU_RESOURCE, Decimal(0)))
            held[node] = held.get(node, Decimal(0)) + asked
    return held, None


# --------------------------------------------------------------------------- quota and limits


def _quota_need(key: str, pods: list[GpuPod]) -> tuple[Decimal, list[str]] | None:
    """What the pods together ask of quota key ``key`` (None: a key this does not judge), and the pods that
    do not set a resource the quota tracks (admission refuses them: "must specify")."""
    if key == "pods":
        return Decimal(sum(p.count for p in pods)), []
    kind, _, resource = key.partition(".") if key.startswith(("requests.", "limits.")) else ("requests", "", key)
    if resource not in FIT_RESOURCES:
        return None
    total, unset = Decimal(0), []
    for pod in pods:
        amounts = pod.requests if kind == "requests" else pod.limits
        if resource not in amounts and resource != GPU_RESOURCE:
            unset.append(pod.where)
        total += amounts.get(resource, Decimal(0)) * pod.count
    return total, unset


def _namespaced(cluster: ClusterReader, namespace: str, plural: str, kind: str) -> tuple[list[Any], Check | None]:
    """The ``plural`` objects in ``namespace`` (none where the kind is not served), or the line saying they went
    unread."""
    try:
        return cluster.listed("", "v1", namespace, plural), None
    except Missing:
        return [], None
    except Unanswered as exc:
        return [], unread(exc, f"{kind} list in {namespace}", namespace)


def quotas(cluster: ClusterReader, namespace: str, pods: list[GpuPod]) -> Check:
    """Every ResourceQuota in ``namespace`` admits the run's GPU pods at once (hard less used)."""
    found, unread = _namespaced(cluster, namespace, "resourcequotas", "ResourceQuota")
    if unread is not None:
        return unread
    for quota in found:
        name = quota["metadata"]["name"]
        hard = _amounts((quota.get("status") or {}).get("hard") or (quota.get("spec") or {}).get("hard"))
        used = _amounts((quota.get("status") or {}).get("used"))
        for key, limit in sorted(hard.items()):
            need = _quota_need(key, pods)
            if need is None:
                continue
            amount, unset = need
            left = limit - used.get(key, Decimal(0))
            fix = (f"kubectl -n {_q(namespace)} describe resourcequota {_q(name)}"
                   f"  # ask for {key}: {(amount - max(left, Decimal(0))).normalize():f} more")
            if unset:
                return Check(False, f"ResourceQuota {name} in {namespace} tracks {key}, which {unset[0]} does not set "
                             "(admission refuses it)", fix)
            if amount > left:  # the fix raises the hard limit by the shortfall (an admin's command)
                short = amount - max(left, Decimal(0))
                body = json.dumps({"spec": {"hard": {key: f"{(limit + short).normalize():f}"}}}, separators=(",", ":"))
                fix = (f"kubectl -n {_q(namespace)} patch resourcequota {_q(name)} --type merge -p '{body}'"
                       f"  # ask for {key}: {short.normalize():f} more")
                return Check(False, f"ResourceQuota {name} in {namespace} leaves {left.normalize():f} {key}; the run's "
                             f"GPU pods need {amount.normalize():f}", fix)
    return Check(True, f"ResourceQuota in {namespace}: "
                 + (f"{len(found)} admit the run's GPU pods" if found else "none"))


def limit_ranges(cluster: ClusterReader, namespace: str, pods: list[GpuPod]) -> Check:
    """No LimitRange in ``namespace`` caps a GPU pod's container below what it asks (``max``), nor gives it a
    default limit below its request (the pod is then invalid)."""
    found, unread = _namespaced(cluster, namespace, "limitranges", "LimitRange")
    if unread is not None:
        return unread
    for lr in found:
        name = lr["metadata"]["name"]
        for item in (lr.get("spec") or {}).get("limits") or []:
            if item.get("type") not in ("Container", "Pod"):
                continue
            cap, default = _amounts(item.get("max")), _amounts(item.get("default"))
            for pod in pods:
                for resource, asked in pod.requests.items():
                    top = max(asked, pod.limits.get(resource, asked))
                    fix = f"kubectl -n {_q(namespace)} describe limitrange {_q(name)}"
                    if resource in cap and top > cap[resource]:
                        return Check(False, f"LimitRange {name} in {namespace} caps a {item['type']}'s {resource} at "
                                     f"{_show(resource, cap[resource])}; {pod.where} asks {_show(resource, top)}", fix)
                    if resource in default and resource not in pod.limits and asked > default[resource]:
                        return Check(False, f"LimitRange {name} in {namespace} gives {pod.where} a default {resource} "
                                     f"limit of {_show(resource, default[resource])}, below its request "
                                     f"{_show(resource, asked)}", fix)
    return Check(True, f"LimitRange in {namespace}: " + (f"{len(found)} admit the run's GPU pods" if found else "none"))


# --------------------------------------------------------------------------- served kinds, compiled namespace


def created_kinds(root: Path, path: str, *, gang: bool) -> dict[tuple[str, str], str]:
    """``(apiVersion, kind) -> file`` of each object outside Kubernetes' own groups the artifacts create."""
    from llmpack.cluster.doctor.pods import TRAINJOB_ARTIFACT, artifact_of, load_compiled

    out: dict[tuple[str, str], str] = {}
    for file in (artifact_of(path), *([TRAINJOB_ARTIFACT] if gang else [])):
        for doc in load_compiled(root / file):
            if isinstance(doc, Mapping) and doc.get("apiVersion") and doc.get("kind"):
                group = str(doc["apiVersion"]).rpartition("/")[0]
                if group not in BUILTIN_GROUPS:
                    out.setdefault((str(doc["apiVersion"]), str(doc["kind"])), file)
    return out


def served(cluster: ClusterReader, namespace: str, kinds: Mapping[tuple[str, str], str]) -> list[Check]:
    """Each kind the artifacts create is served by the API server (a list of it answers; 403 still says served)."""
    from llmpack.cluster.doctor.reader import Forbidden

    checks = []
    for (api_version, kind), file in sorted(kinds.items()):
        group, _, version = api_version.rpartition("/")
        try:
            cluster.listed(group, version, namespace, kind.lower() + "s", limit=1)
        except Missing:
            from llmpack.backends import ORCHESTRATORS, doctor_facts
            from llmpack.cluster.doctor.waits import KUEUE_INSTALL

            installs = {"trainer.kubeflow.org": trainer_install(), "kueue.x-k8s.io": KUEUE_INSTALL}
            for name in ORCHESTRATORS:  # each orchestrator's own types (Argo's Workflow), declared on its backend
                own = doctor_facts(name).controller
                if own is not None:
                    installs[own.api_group] = own.install
            fix = installs.get(group) or (f"kubectl api-resources --api-group={group}"
                                          f"  # install the CRDs of {group} (docs/first-run-on-a-cluster.md)")
            checks.append(Check(False, f"{kind} ({api_version}) is not served by this API server; {file} creates one",
                                fix))
            continue
        except Forbidden:
            pass
        except Unanswered as exc:
            checks.append(unread(exc, f"{kind} list in {namespace}", namespace))
            continue
        checks.append(Check(True, f"{kind} ({api_version}) is served"))
    return checks


def compiled_namespace(root: Path) -> str | None:
    """The namespace ``llmpack compile --namespace`` wrote into the artifacts (the MLflow Job's), or None."""
    from llmpack.cluster.doctor.pods import load_compiled

    file = root / MLFLOW_TEMPLATE
    if not file.is_file():
        return None
    docs = load_compiled(file)
    value = ((docs[0] if docs and isinstance(docs[0], Mapping) else {}).get("metadata") or {}).get("namespace")
    return str(value) if value else None


def namespace_match(source: str, compiled: str | None, checked: str) -> Check:
    """The namespace checked is the one the artifacts were compiled for (what ``kubectl apply`` will use)."""
    if compiled is None or compiled == checked:
        return Check(True, f"{source} are compiled for namespace {checked}")
    return Check(False, f"{source} are compiled for namespace {compiled}, not {checked} (the one checked here)",
                 f"llmpack cluster doctor --namespace {_q(compiled)}  # or llmpack compile --namespace {_q(checked)}, "
                 "and doctor --compiled on what it wrote")


@dataclass(frozen=True)
class Needs:
    """What the compiled artifacts ask, per path: its GPU pods, the kinds it creates; and their namespace."""

    pods: Mapping[str, list[GpuPod]] = field(default_factory=dict)
    kinds: Mapping[str, Mapping[tuple[str, str], str]] = field(default_factory=dict)
    namespace: str | None = None
    source: str = "the committed artifacts"  # how the lines name where they were read: --compiled DIR, or these


def needs_of(root: Path, paths: tuple[str, ...], *, gang: bool, source: str | None = None) -> Needs:
    """Read from the artifacts under ``root`` (an unreadable file: an InputError naming it, exit 2)."""
    return Needs({p: gpu_pods(root, p, gang=gang) for p in paths},
                 {p: created_kinds(root, p, gang=gang) for p in paths},
                 compiled_namespace(root), source or "the committed artifacts")


def at_once(pods: list[GpuPod]) -> list[list[GpuPod]]:
    """The GPU pods of one path, as they overlap in time: its steps run one after another, so each step pod
    alone, and the TrainJob's node pods together (while its launcher, a CPU pod, waits; evaluate's GPU comes after).
    A quota must admit each group, not their sum."""
    gang = [p for p in pods if p.where == "TrainJob node pod"]
    return [*([p] for p in pods if p.where != "TrainJob node pod"), *([gang] if gang else [])]


def admission(cluster: ClusterReader, namespace: str, paths: list[str], needs: Needs) -> list[Check]:
    """The namespace's ResourceQuotas and LimitRanges against each path's GPU pods: one line each (the first that
    fails, else the first)."""
    out = []
    for judge, group in ((quotas, [g for p in paths for g in at_once(needs.pods.get(p, []))]),
                         (limit_ranges, [needs.pods.get(p, []) for p in paths])):
        results = [judge(cluster, namespace, pods) for pods in group] or [judge(cluster, namespace, [])]
        out.append(next((c for c in results if not c.ok), results[0]))
    return out
