"""What would make a run wait for ever although every object it names exists: a controller that does not
reconcile, GPUs already held by other pods, a Kueue LocalQueue whose ClusterQueue is missing or smaller than the
gang, a PriorityClass or ServiceAccount the pods name that is not there. Each a
:class:`~llmpack.cluster.doctor.checks.Check` with the command that fixes it; read through a
:class:`~llmpack.cluster.doctor.reader.ClusterReader`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from llmpack.cluster.doctor.checks import GPU_RESOURCE, KUEUE_GROUP, KUEUE_VERSIONS, Check, _q
from llmpack.cluster.doctor.reader import ClusterReader, Forbidden, Missing, Unanswered, unread

KUEUE_INSTALL = ("helm install kueue oci://registry.k8s.io/kueue/charts/kueue --version 0.17.0 -n kueue-system "
                 "--create-namespace")


class Note(Check):
    """A line that is neither ✓ nor ✗: what doctor did not check, and why (rendered ``·``, never fails)."""


@dataclass(frozen=True)
class Controller:
    """A controller Deployment a kind needs reconciled (its name in the project's own install manifests)."""

    what: str  # "Kubeflow Trainer"
    deployment: str
    waits: str  # what waits for ever without it
    install: str
    lease: str | None = None  # its leader-election Lease (each release elects one): renewed while it runs


def controllers(*, gang: bool, queue: bool, paths: list[str]) -> list[Controller]:
    from llmpack.cluster.doctor.gang import trainer_install

    out = []
    if gang:
        out += [Controller("Kubeflow Trainer", "kubeflow-trainer-controller-manager",
                           "the TrainJob gets no JobSet", trainer_install(), "trainer.kubeflow.org"),
                Controller("JobSet", "jobset-controller-manager", "the TrainJob's JobSet gets no pods",
                           trainer_install(), "6d4f6a47.jobset.x-k8s.io")]
    if queue:
        out.append(Controller("Kueue", "kueue-controller-manager", "the TrainJob stays suspended, never admitted",
                              KUEUE_INSTALL, "c1f6bfd2.kueue.x-k8s.io"))
    from llmpack.backends import doctor_facts

    for path in paths:  # an orchestrator's own controller, declared on its backend (Argo's workflow-controller)
        own = doctor_facts(path).controller
        if own is not None:
            out.append(Controller(own.what, own.deployment, own.waits, own.install))
    return out


def controller_ready(cluster: ClusterReader, ctl: Controller) -> Check:
    """The controller's Deployment exists (in any namespace) with a ready replica: served CRDs alone reconcile
    nothing."""
    try:
        found = cluster.everywhere("apps", "v1", "deployments", f"metadata.name={ctl.deployment}")
    except Forbidden as exc:
        return Note(True, f"{ctl.what} controller not checked: you may not list Deployments cluster-wide ({exc})")
    except (Unanswered, Missing) as exc:
        return unread(exc if isinstance(exc, Unanswered) else Unanswered(str(exc)), "Deployment list")
    if not found and ctl.lease:  # installed under another name, or not as a Deployment: its Lease says
        return _leader(cluster, ctl)
    if not found:
        return Check(False, f"{ctl.what} controller not running: no Deployment {ctl.deployment} in any namespace "
                     f"({ctl.waits})", ctl.install)
    for dep in found:
        if int((dep.get("status") or {}).get("readyReplicas") or 0) >= 1:
            ns = dep["metadata"].get("namespace", "")
            return Check(True, f"{ctl.what} controller {ns}/{ctl.deployment} is ready")
    dep = found[0]
    ns = _q(str(dep["metadata"].get("namespace", "")))
    wanted = (dep.get("spec") or {}).get("replicas", 1)
    return Check(False, f"{ctl.what} controller {dep['metadata'].get('namespace')}/{ctl.deployment} has 0 of {wanted} "
                 f"replicas ready ({ctl.waits})",
                 f"kubectl -n {ns} scale deployment {ctl.deployment} --replicas=1 && kubectl -n {ns} rollout status "
                 f"deployment {ctl.deployment} --timeout=5m  # not ready still: kubectl -n {ns} describe deployment "
                 f"{ctl.deployment}")


def _leader(cluster: ClusterReader, ctl: Controller, poll_s: float = 0.5) -> Check:
    """The controller's leader Lease, renewed while doctor watches (a leader renews it every few seconds, within
    its ``leaseDurationSeconds``): no clock is compared, so a skewed laptop clock cannot make it look alive."""
    import time

    def read() -> list[dict[str, Any]]:
        return cluster.everywhere("coordination.k8s.io", "v1", "leases", f"metadata.name={ctl.lease}")

    try:
        leases = read()
    except Forbidden as exc:
        return Note(True, f"{ctl.what} controller not checked: no Deployment {ctl.deployment}, and you may not "
                    f"list Leases cluster-wide ({exc})")
    except Missing:  # Leases not served: no leader to read
        leases = []
    except Unanswered as exc:
        return unread(exc, "Lease list")
    if not leases:
        return Check(False, f"{ctl.what} controller not running: no Deployment {ctl.deployment} in any namespace, "
                     f"and no leader Lease {ctl.lease} ({ctl.waits})", ctl.install)
    lease = leases[0]
    where = f"{lease['metadata'].get('namespace', '')}/{ctl.lease}"
    seen = (lease.get("spec") or {}).get("renewTime")
    wait_s = min(float((lease.get("spec") or {}).get("leaseDurationSeconds") or 15), 30.0)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        time.sleep(poll_s)
        try:
            now = read()
        except (Unanswered, Missing, Forbidden) as exc:
            return unread(exc if isinstance(exc, Unanswered) else Unanswered(str(exc)), "Lease list")
        if now and (now[0].get("spec") or {}).get("renewTime") != seen:
            return Check(True, f"{ctl.what} controller runs: it renews its leader Lease {where}")
    holder = (lease.get("spec") or {}).get("holderIdentity") or "none"
    return Check(False, f"{ctl.what} controller not running: its leader Lease {where} was not renewed in "
                 f"{wait_s:g} s (last holder {holder}; {ctl.waits})", ctl.install)


# --------------------------------------------------------------------------- Kueue's chain


def _cluster_queue(cluster: ClusterReader, name: str) -> dict[str, Any] | None:
    for version in KUEUE_VERSIONS:
        try:
            return cluster.cluster_object(KUEUE_GROUP, version, "clusterqueues", name)
        except Missing:
            continue
    raise Missing(f"clusterqueues.{KUEUE_GROUP} is not served")


def _quantity(value: Any) -> Decimal:
    from kubernetes.utils import parse_quantity

    try:
        return Decimal(parse_quantity(str(value)))
    except (ValueError, ArithmeticError):
        return Decimal(0)


def _apply(obj: Mapping[str, Any]) -> str:
    """``kubectl apply`` of ``obj`` as one JSON here-string (kubectl 1.32 reads a ``{``-led stdin as JSON)."""
    return f"kubectl apply -f - <<< '{json.dumps(obj, separators=(',', ':'))}'"


def cluster_queue(cluster: ClusterReader, namespace: str, local: Mapping[str, Any],
                  needs: Mapping[str, Decimal]) -> Check:
    """The ClusterQueue LocalQueue ``local`` points at exists and its nominal quota holds the whole gang at once
    (``needs``: resource -> amount; Kueue admits all of a TrainJob or none of it)."""
    queue = local["metadata"]["name"]
    name = str((local.get("spec") or {}).get("clusterQueue") or "")
    gpus = needs.get(GPU_RESOURCE, Decimal(0))
    try:
        found = _cluster_queue(cluster, name)
    except Missing as exc:
        return Check(False, f"Kueue ClusterQueue {name}: {exc}", KUEUE_INSTALL)
    except Unanswered as exc:
        return unread(exc, f"ClusterQueue {name}")
    if found is None:
        flavor = {"apiVersion": f"{KUEUE_GROUP}/v1beta1", "kind": "ResourceFlavor", "metadata": {"name": "default"}}
        quota = [{"name": r, "nominalQuota": f"{v.normalize():f}"} for r, v in sorted(needs.items())]
        cq = {"apiVersion": f"{KUEUE_GROUP}/v1beta1", "kind": "ClusterQueue", "metadata": {"name": name},
              "spec": {"namespaceSelector": {}, "resourceGroups": [
                  {"coveredResources": sorted(needs), "flavors": [{"name": "default", "resources": quota}]}]}}
        both = _apply({"apiVersion": "v1", "kind": "List", "items": [flavor, cq]})
        return Check(False, f"Kueue ClusterQueue {name} missing (LocalQueue {queue} in {namespace} points at it: the "
                     "TrainJob would wait for ever)", both)
    nominal, where = Decimal(0), None
    for g, group in enumerate((found.get("spec") or {}).get("resourceGroups") or []):
        for f, flavor in enumerate(group.get("flavors") or []):
            for r, resource in enumerate(flavor.get("resources") or []):
                if resource.get("name") == GPU_RESOURCE:
                    nominal += _quantity(resource.get("nominalQuota", 0))
                    where = where or f"/spec/resourceGroups/{g}/flavors/{f}/resources/{r}/nominalQuota"
    if nominal >= gpus:
        return Check(True, f"Kueue ClusterQueue {name} (of LocalQueue {queue}) has {nominal.normalize():f} "
                     f"{GPU_RESOURCE} nominal quota (the gang needs {gpus.normalize():f})")
    short = gpus - nominal
    if where is None:
        fix = (f"kubectl edit clusterqueue {_q(name)}  # add {GPU_RESOURCE} to coveredResources and a flavor with "
               f"nominalQuota {gpus.normalize():f}")
    else:
        patch = [{"op": "replace", "path": where, "value": f"{gpus.normalize():f}"}]
        fix = f"kubectl patch clusterqueue {_q(name)} --type json -p '{json.dumps(patch, separators=(',', ':'))}'"
    return Check(False, f"Kueue ClusterQueue {name} (of LocalQueue {queue}) has {nominal.normalize():f} {GPU_RESOURCE} "
                 f"nominal quota; the gang needs {gpus.normalize():f} at once ({short.normalize():f} short: it would "
                 "wait for ever)", fix)


# --------------------------------------------------------------------------- what the pods name


def priority_class(cluster: ClusterReader, name: str) -> Check:
    """A PriorityClass the compiled pods name (``llmpack compile --priority-class``): without it the API server
    refuses every pod."""
    try:
        found = cluster.cluster_object("scheduling.k8s.io", "v1", "priorityclasses", name)
    except (Missing, Unanswered) as exc:
        return unread(exc if isinstance(exc, Unanswered) else Unanswered(str(exc)), f"PriorityClass {name}")
    if found is None:
        return Check(False, f"PriorityClass {name} missing (the compiled pods name it: admission refuses them)",
                     f"kubectl create priorityclass {_q(name)} --value=1000 --description='llmpack training runs'")
    return Check(True, f"PriorityClass {name} exists (value {found.get('value', '?')})")


def service_account(cluster: ClusterReader, namespace: str, name: str) -> Check:
    """A ServiceAccount a compiled pod runs as: without it the pod is never created."""
    try:
        found = cluster.service_account(namespace, name)
    except Unanswered as exc:
        return unread(exc, f"ServiceAccount {name} in {namespace}", namespace)
    if found is None:
        return Check(False, f"ServiceAccount {name} missing in {namespace} (a compiled pod runs as it: none is "
                     "created without it)", f"kubectl -n {_q(namespace)} create serviceaccount {_q(name)}  # or "
                     "kubectl apply the compiled RBAC file that defines it")
    return Check(True, f"ServiceAccount {name} in {namespace} exists")
