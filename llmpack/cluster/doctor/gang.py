"""The checks of a TrainJob gang (``cluster doctor --nodes N``): Kubeflow Trainer's runtime, the launcher's RBAC,
the shared PersistentVolumeClaim and the Kueue LocalQueue, each a :class:`~llmpack.cluster.doctor.checks.Check`
with its fix; read through a :class:`~llmpack.cluster.doctor.reader.ClusterReader` as every check is.
"""

from __future__ import annotations

from typing import Any

from components.redaction import printable
from llmpack.cluster.doctor.checks import (
    CLUSTER_QUEUE_PLACEHOLDER,
    KUEUE_GROUP,
    KUEUE_VERSIONS,
    RUNTIMES,
    TRAINER_GROUP,
    TRAINER_VERSION,
    Check,
    _q,
)
from llmpack.cluster.doctor.reader import ClusterReader, Missing, Unanswered, unread


def trainer_install(version: str | None = None) -> str:
    """The command that installs Trainer ``version`` (default: the one TrainJobs are compiled for) with its runtimes."""
    from components.trainjob.spec import DEFAULT_TRAINER, TRAINER_RELEASES

    tag = TRAINER_RELEASES[version or DEFAULT_TRAINER]
    return ("kubectl apply --server-side -k 'https://github.com/kubeflow/trainer.git/manifests/overlays/runtimes"
            f"?ref={tag}'  # Kubeflow Trainer {tag} with its runtimes (llmpack compile --trainer-version)")


def training_runtime(cluster: ClusterReader, name: str | None = None, kind: str = "ClusterTrainingRuntime",
                     namespace: str = "") -> Check:
    """The runtime the TrainJob names (its ``runtimeRef``: a ClusterTrainingRuntime, or a TrainingRuntime in the
    run's namespace; Trainer >= 2.2 for ``runtimePatches``)."""
    from components.trainjob.spec import TrainJobSpec

    name = name or TrainJobSpec.__dataclass_fields__["runtime"].default
    install = trainer_install()
    if kind == "TrainingRuntime":
        try:
            found = cluster.namespaced_object(TRAINER_GROUP, (TRAINER_VERSION,), namespace, "trainingruntimes", name)
        except Missing:
            return Check(False, f"Kubeflow Trainer is not installed (trainingruntimes.{TRAINER_GROUP} not served)",
                         install)
        except Unanswered as exc:
            return unread(exc, f"TrainingRuntime {name}", namespace)
        if found is None:
            return Check(False, f"TrainingRuntime {name} missing in {namespace} (the TrainJob's runtimeRef)",
                         f"kubectl apply -n {_q(namespace)} -f build/2x4/trainjob/training-runtime.yaml  # written by "
                         "llmpack compile --nodes N --out build/2x4")
        return Check(True, f"TrainingRuntime {name} exists in {namespace}")
    try:
        found = cluster.cluster_object(TRAINER_GROUP, TRAINER_VERSION, RUNTIMES, name)
    except Missing:
        return Check(False, f"Kubeflow Trainer is not installed ({RUNTIMES}.{TRAINER_GROUP}/{TRAINER_VERSION} not "
                     "served)", install)
    except Unanswered as exc:
        return unread(exc, f"ClusterTrainingRuntime {name}")
    if found is None:
        return Check(False, f"ClusterTrainingRuntime {name} missing (the TrainJob's runtimeRef)", install)
    return Check(True, f"ClusterTrainingRuntime {name} exists")


def launcher_rbac(cluster: ClusterReader, namespace: str) -> Check:
    """The ServiceAccount, Role and RoleBinding of ``trainjob/launcher-rbac.yaml``, the Role allowing the
    launcher's calls."""
    from components.podspec import NODE_SERVICE_ACCOUNT
    from components.trainjob.launch import LAUNCHER_SERVICE_ACCOUNT, RBAC_FILE, RBAC_VERBS
    from components.trainjob.launch import launcher_rbac as wanted

    fix = (f"kubectl apply -n {_q(namespace)} -f build/2x4/{RBAC_FILE}"
           "  # written by llmpack compile --nodes N --out build/2x4")
    name = LAUNCHER_SERVICE_ACCOUNT
    try:
        account = cluster.service_account(namespace, name)
        role = cluster.role(namespace, name)
        binding = cluster.role_binding(namespace, name)
    except Unanswered as exc:
        return unread(exc, f"Role {name} in {namespace}", namespace)
    missing = [kind for kind, obj in (("ServiceAccount", account), ("Role", role), ("RoleBinding", binding))
               if obj is None]
    if missing:
        return Check(False, f"launcher RBAC in {namespace}: {', '.join(missing)} {name} missing (the gang launcher "
                     "creates its TrainJob as it)", fix)
    try:
        node_account = cluster.service_account(namespace, NODE_SERVICE_ACCOUNT)
    except Unanswered as exc:
        return unread(exc, f"ServiceAccount {NODE_SERVICE_ACCOUNT} in {namespace}", namespace)
    if node_account is None:
        return Check(False, f"launcher RBAC in {namespace}: ServiceAccount {NODE_SERVICE_ACCOUNT} missing (the "
                     "TrainJob's node pods run as it: without it none is created)", fix)
    rule = wanted()[1]["rules"][0]
    group, plural = rule["apiGroups"][0], rule["resources"][0]
    granted = {v for r in role.get("rules") or []
               if group in (r.get("apiGroups") or []) or "*" in (r.get("apiGroups") or [])
               if plural in (r.get("resources") or []) or "*" in (r.get("resources") or [])
               for v in r.get("verbs") or []}
    lacking = [v for v in RBAC_VERBS if v not in granted and "*" not in granted]
    if lacking:
        return Check(False, f"launcher RBAC in {namespace}: Role {name} does not allow {', '.join(lacking)} "
                     f"{plural}.{group}", fix)
    ref = binding.get("roleRef") or {}
    bound = any(s.get("kind") == "ServiceAccount" and s.get("name") == name
                and s.get("namespace", namespace) == namespace for s in binding.get("subjects") or [])
    if ref.get("kind") != "Role" or ref.get("name") != name or not bound:
        return Check(False, f"launcher RBAC in {namespace}: RoleBinding {name} does not bind Role {name} to "
                     f"ServiceAccount {name}", fix)
    return Check(True, f"launcher RBAC in {namespace}: {name} may {', '.join(RBAC_VERBS)} {plural}.{group}")


# Why a claim is not Bound, by its phase (a Lost claim will not bind at first use).
PVC_PHASES = {"Pending": "no volume yet, and no PersistentVolume matches it",  # the classes unread: pending_why
              "Lost": "its PersistentVolume is gone: the data on it cannot be reached and it will not bind again"}
WAIT_FOR_FIRST_CONSUMER = "WaitForFirstConsumer"
DEFAULT_CLASS = "storageclass.kubernetes.io/is-default-class"


def pvc_json(name: str, mode: str) -> str:
    """A claim as one line of JSON (valid YAML too): what ``kubectl apply -f -`` reads on every kubectl (1.32
    parses a ``{``-led stdin as JSON, refusing YAML flow style)."""
    import json

    return json.dumps({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name},
                       "spec": {"accessModes": [mode], "resources": {"requests": {"storage": "50Gi"}}}},
                      separators=(",", ":"))


def pv_json(pvc: dict[str, Any]) -> str:
    """A PersistentVolume that binds the Pending claim ``pvc`` (its class, size and access modes), as one JSON line;
    its NFS server and path are the user's to fill in."""
    import json

    spec, meta = pvc.get("spec") or {}, pvc.get("metadata") or {}
    modes = spec.get("accessModes") or ["ReadWriteMany"]
    size = ((spec.get("resources") or {}).get("requests") or {}).get("storage") or "50Gi"
    body = {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": f"{meta.get('name', 'llmpack')}-pv"},
            "spec": {**({"storageClassName": spec["storageClassName"]} if spec.get("storageClassName") else {}),
                     "capacity": {"storage": size}, "accessModes": modes,
                     "nfs": {"server": "NFS_SERVER", "path": "/exports/llmpack"}}}
    return json.dumps(body, separators=(",", ":"))


def _at(obj: object, *keys: str) -> Any:
    """``obj[k1][k2]...`` of a cluster's object read as data: None where any level is not an object (round 27: a
    StorageClass that was a string, ``metadata`` a string or ``annotations`` a list was a traceback)."""
    for key in keys:
        obj = obj.get(key) if isinstance(obj, dict) else None
    return obj


def _classes(cluster: ClusterReader) -> list[dict[str, Any]]:
    """The cluster's StorageClasses that are objects (any other item passed over)."""
    return [c for c in cluster.everywhere("storage.k8s.io", "v1", "storageclasses") if isinstance(c, dict)]


def binding_mode(cluster: ClusterReader, pvc: dict[str, object]) -> str | None:
    """The ``volumeBindingMode`` of the claim's StorageClass (its own, else the cluster's default), None unknown."""
    name = _at(pvc, "spec", "storageClassName")
    try:
        if name:
            found = cluster.cluster_object("storage.k8s.io", "v1", "storageclasses", str(name))
        else:
            found = next((c for c in _classes(cluster) if _at(c, "metadata", "annotations", DEFAULT_CLASS) == "true"),
                         None)
    except (Missing, Unanswered):
        return None
    return None if not isinstance(found, dict) else str(found.get("volumeBindingMode") or "Immediate")


def _available_pv(cluster: ClusterReader, pvc: dict[str, object]) -> str | None:
    """The name of an Available PersistentVolume that would bind ``pvc`` (its class and access modes, not claimed
    by another; its capacity is the binder's to judge); None when none (or the volumes cannot be read)."""
    spec: dict = pvc.get("spec") or {}  # type: ignore[assignment]
    want_class, want_modes = spec.get("storageClassName"), set(spec.get("accessModes") or ())
    try:
        volumes = cluster.everywhere("", "v1", "persistentvolumes")
    except (Missing, Unanswered):
        return None
    def field(obj: object, key: str) -> Any:  # a cluster's object read as data: any other shape is no match
        return obj.get(key) if isinstance(obj, dict) else None

    claim = field(pvc.get("metadata"), "name")
    for pv in volumes:
        pv_spec, ref, modes = field(pv, "spec"), field(field(pv, "spec"), "claimRef"), field(field(pv, "spec"),
                                                                                              "accessModes")
        if field(field(pv, "status"), "phase") != "Available" or (ref and field(ref, "name") != claim):
            continue
        if not isinstance(modes, list) or not all(isinstance(m, str) for m in modes):
            continue
        if (field(pv_spec, "storageClassName") or "") != (want_class or "") or not want_modes <= set(modes):
            continue
        return printable(str(field(field(pv, "metadata"), "name")), 80)
    return None


def pending_why(cluster: ClusterReader, pvc: dict[str, object]) -> str:
    """Why a Pending claim (not under a WaitForFirstConsumer class) has no volume, by the StorageClass it would
    get: none at all in the cluster, none by that name, no default, or one that binds at once (Immediate); an
    Available PersistentVolume that matches it is said (trial 8: the binder takes up to a minute)."""
    found_pv = _available_pv(cluster, pvc)
    if found_pv is not None:
        return (f"no volume yet, though PersistentVolume {found_pv} (Available) matches it: the PV controller binds "
                "it within about a minute; run doctor again then")
    name = _at(pvc, "spec", "storageClassName")
    try:
        classes = _classes(cluster)
    except (Missing, Unanswered):
        return PVC_PHASES["Pending"]
    if name == "":
        return 'no volume yet: the claim asks for no StorageClass (storageClassName ""), and no PersistentVolume ' \
               "without a class matches it"
    if not classes:
        return "no volume yet: the cluster has no StorageClass to provision one, and no PersistentVolume matches it"
    if name:
        found = next((c for c in classes if _at(c, "metadata", "name") == name), None)
        if found is None:
            return f"no volume yet: there is no StorageClass {name}, and no PersistentVolume of that class matches it"
        return f"no volume yet, and its StorageClass {name} binds at once (Immediate): it provisioned none and no " \
               "PersistentVolume matches it"
    default = next((c for c in classes if _at(c, "metadata", "annotations", DEFAULT_CLASS) == "true"), None)
    if default is None:
        return "no volume yet: the claim names no StorageClass and none is the cluster's default, and no " \
               "PersistentVolume matches it"
    shown = printable(str(_at(default, "metadata", "name")), 80)
    return f"no volume yet, and the default StorageClass {shown} binds at once (Immediate): it provisioned none " \
           "and no PersistentVolume matches it"


def shared_pvc(cluster: ClusterReader, namespace: str, name: str, *, shared: bool,
               modes: tuple[str, ...] | None = None, why: str = "every node pod of the gang mounts it") -> Check:
    """The PVC ``name`` exists and is Bound (or Pending under a WaitForFirstConsumer class: it binds when the first
    pod is scheduled); one of ``modes`` (default: ReadWriteMany when ``shared``, any otherwise)."""
    modes = modes if modes is not None else (("ReadWriteMany",) if shared else ())
    mode = modes[0] if modes else "ReadWriteOnce"
    example = f"kubectl -n {_q(namespace)} apply -f - <<< '{pvc_json(name, mode)}'"
    try:
        pvc = cluster.pvc(namespace, name)
    except Unanswered as exc:
        return unread(exc, f"PersistentVolumeClaim {name} in {namespace}", namespace)
    if pvc is None:
        return Check(False, f"PersistentVolumeClaim {name} missing in {namespace}", example)
    has = (pvc.get("spec") or {}).get("accessModes") or []
    if modes and not set(modes) & set(has):
        return Check(False, f"PersistentVolumeClaim {name} in {namespace} is {', '.join(has) or 'no access mode'}, "
                     f"not {' or '.join(modes)} ({why})",
                     f"kubectl -n {_q(namespace)} delete pvc {name} && {example}  # with a {mode} storage class")
    phase = (pvc.get("status") or {}).get("phase") or "Pending"
    shown = f", {'/'.join(m for m in modes if m in has)}" if modes else ""
    if phase == "Pending" and binding_mode(cluster, pvc) == WAIT_FOR_FIRST_CONSUMER:
        return Check(True, f"PersistentVolumeClaim {name} in {namespace} is Pending until its first pod "
                     f"({WAIT_FOR_FIRST_CONSUMER}){shown}")
    if phase != "Bound":
        why = pending_why(cluster, pvc) if phase == "Pending" else \
            PVC_PHASES.get(phase, "a phase Kubernetes does not define")
        waiting = phase == "Pending" and "(Available) matches it" in why  # trial 9: the PV fix was given again
        fix = ("nothing to apply: wait about a minute, then llmpack cluster doctor again (the PV controller binds "
               "it)" if waiting else
               f"kubectl apply -f - <<< '{pv_json(pvc)}'  # a volume for it (your NFS export), or a StorageClass "
               "that provisions one" if phase == "Pending" else
               f"kubectl -n {_q(namespace)} describe pvc {name}"
               + ("  # then delete and recreate it, restoring its data" if phase == "Lost" else ""))
        return Check(False, f"PersistentVolumeClaim {name} in {namespace} is {phase}, not Bound ({why})", fix)
    return Check(True, f"PersistentVolumeClaim {name} in {namespace} is Bound{shown}")


def local_queue(cluster: ClusterReader, namespace: str, name: str) -> Check:
    """The Kueue LocalQueue the TrainJob is labelled with (Kueue >= 0.17 manages TrainJobs)."""
    import json

    body = json.dumps({"apiVersion": f"{KUEUE_GROUP}/v1beta1", "kind": "LocalQueue", "metadata": {"name": name},
                       "spec": {"clusterQueue": CLUSTER_QUEUE_PLACEHOLDER}}, separators=(",", ":"))
    example = f"kubectl -n {_q(namespace)} apply -f - <<< '{body}'"
    try:
        found = cluster.namespaced_object(KUEUE_GROUP, KUEUE_VERSIONS, namespace, "localqueues", name)
    except Missing:
        return Check(False, f"Kueue is not installed (localqueues.{KUEUE_GROUP} not served); --queue {name} needs it",
                     "helm install kueue oci://registry.k8s.io/kueue/charts/kueue --version 0.17.0 "
                     "-n kueue-system --create-namespace")
    except Unanswered as exc:
        return unread(exc, f"LocalQueue {name} in {namespace}", namespace)
    if found is None:
        return Check(False, f"Kueue LocalQueue {name} missing in {namespace}", example)
    return Check(True, f"Kueue LocalQueue {name} in {namespace} (ClusterQueue "
                 f"{(found.get('spec') or {}).get('clusterQueue', '?')})")
