"""The checks of a TrainJob gang (``cluster doctor --nodes N``): Kubeflow Trainer's runtime, the launcher's RBAC,
the shared PersistentVolumeClaim and the Kueue LocalQueue, each a :class:`~llmpack.cluster.doctor.checks.Check`
with its fix; read through a :class:`~llmpack.cluster.doctor.reader.ClusterReader` as every check is.
"""

from __future__ import annotations

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
    from components.servers.trainjob import DEFAULT_TRAINER, TRAINER_RELEASES

    tag = TRAINER_RELEASES[version or DEFAULT_TRAINER]
    return ("kubectl apply --server-side -k 'https://github.com/kubeflow/trainer.git/manifests/overlays/runtimes"
            f"?ref={tag}'  # Kubeflow Trainer {tag} with its runtimes (llmpack compile --trainer-version)")


def training_runtime(cluster: ClusterReader) -> Check:
    """The ClusterTrainingRuntime the TrainJob names (Trainer >= 2.2 for ``runtimePatches``)."""
    from components.servers.trainjob import TrainJobSpec

    name = TrainJobSpec.__dataclass_fields__["runtime"].default
    install = trainer_install()
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
    from components.servers.trainjob_launch import LAUNCHER_SERVICE_ACCOUNT, RBAC_FILE, RBAC_VERBS
    from components.servers.trainjob_launch import launcher_rbac as wanted

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
PVC_PHASES = {"Pending": "no volume yet; a WaitForFirstConsumer class binds at first use, else none matches it",
              "Lost": "its PersistentVolume is gone: the data on it cannot be reached and it will not bind again"}


def shared_pvc(cluster: ClusterReader, namespace: str, name: str, *, shared: bool) -> Check:
    """The PVC ``name`` exists and is Bound; ReadWriteMany when ``shared`` (the gang's nodes and launcher mount it)."""
    mode = "ReadWriteMany" if shared else "ReadWriteOnce"
    example = (f"kubectl -n {_q(namespace)} apply -f - <<< '{{apiVersion: v1, kind: PersistentVolumeClaim, metadata: "
               f"{{name: {name}}}, spec: {{accessModes: [{mode}], resources: {{requests: {{storage: 50Gi}}}}}}}}'")
    try:
        pvc = cluster.pvc(namespace, name)
    except Unanswered as exc:
        return unread(exc, f"PersistentVolumeClaim {name} in {namespace}", namespace)
    if pvc is None:
        return Check(False, f"PersistentVolumeClaim {name} missing in {namespace}", example)
    modes = (pvc.get("spec") or {}).get("accessModes") or []
    if shared and "ReadWriteMany" not in modes:
        return Check(False, f"PersistentVolumeClaim {name} in {namespace} is {', '.join(modes) or 'no access mode'}, "
                     "not ReadWriteMany (every node pod of the gang mounts it)",
                     f"kubectl -n {_q(namespace)} delete pvc {name} && {example}  # with a ReadWriteMany storage class")
    phase = (pvc.get("status") or {}).get("phase") or "Pending"
    if phase != "Bound":
        return Check(False, f"PersistentVolumeClaim {name} in {namespace} is {phase}, not Bound "
                     f"({PVC_PHASES.get(phase, 'a phase Kubernetes does not define')})",
                     f"kubectl -n {_q(namespace)} describe pvc {name}"
                     + ("  # then delete and recreate it, restoring its data" if phase == "Lost" else ""))
    return Check(True, f"PersistentVolumeClaim {name} in {namespace} is Bound"
                 + (", ReadWriteMany" if shared else ""))


def local_queue(cluster: ClusterReader, namespace: str, name: str) -> Check:
    """The Kueue LocalQueue the TrainJob is labelled with (Kueue >= 0.17 manages TrainJobs)."""
    example = (f"kubectl -n {_q(namespace)} apply -f - <<< '{{apiVersion: {KUEUE_GROUP}/v1beta1, kind: LocalQueue, "
               f"metadata: {{name: {name}}}, spec: {{clusterQueue: {CLUSTER_QUEUE_PLACEHOLDER}}}}}'")
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
