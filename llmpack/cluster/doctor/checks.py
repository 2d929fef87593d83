"""The checks of ``llmpack cluster doctor``: everything a first cluster run needs, each a :class:`Check` with its fix.

Each function reads through a :class:`~llmpack.cluster.doctor.reader.ClusterReader` and returns its
checks; none raises for what it finds (a 403 is a failed check saying so). What they hold the
cluster to comes from where the compiled artifacts get it: the GPU steps' node selector,
tolerations and GPUs from the pipeline's step specs (:func:`gpu_placement`), the Secret's name and
keys from :mod:`components.record.tracking`, the launcher's RBAC from
:func:`components.trainjob.launch.launcher_rbac`, the runtime's name from
:class:`components.trainjob.spec.TrainJobSpec`.
"""

from __future__ import annotations

import base64
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from components.doctor_facts import DoctorCheck
from components.dsl import Toleration
from llmpack.cluster.doctor.reader import ClusterReader, Unanswered, unread

DOCS = "docs/first-run-on-a-cluster.md"
# The pod watcher's calls in a run's namespace (llmpack.cluster.k8s.watcher), and each path's own.
WATCHER_VERBS = (("list", "pods", ""), ("watch", "pods", ""), ("list", "events", ""), ("watch", "events", ""))


def path_verbs(path: str) -> tuple[tuple[str, str, str], ...]:
    """What a path's submission and the pod watcher need in its namespace (the backend's ``doctor.verbs``)."""
    from llmpack.backends import doctor_facts

    return (*doctor_facts(path).verbs, *WATCHER_VERBS)

NODE_VERBS = (("list", "nodes", ""),)  # node provisioning and GPU product, cluster-wide
GPU_RESOURCE = "nvidia.com/gpu"
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"  # what `kubectl cordon` (spec.unschedulable) shows as
TRAINER_GROUP, TRAINER_VERSION, RUNTIMES = "trainer.kubeflow.org", "v1alpha1", "clustertrainingruntimes"
KUEUE_GROUP, KUEUE_VERSIONS = "kueue.x-k8s.io", ("v1beta2", "v1beta1")
EXAMPLE_URI = "http://mlflow.mlflow.svc.cluster.local:5000"
SIGNING_KEY_KEY = "signing-key"  # the tracking Secret's provenance key (tracking.TRACKING_CREDENTIALS)
NEW_KEY = '"$(openssl rand -hex 32)"'  # a fresh key, made by the shell that runs the fix line
# The fix line's ClusterQueue: a valid name (lower case), so the line pasted as printed is accepted and
# the queue it names stays Pending with "ClusterQueue your-cluster-queue doesn't exist" until replaced.
CLUSTER_QUEUE_PLACEHOLDER = "your-cluster-queue"


Check = DoctorCheck  # one line of the checklist (the contract's, so a backend's own checks are lines too)


@dataclass(frozen=True)
class GpuPlacement:
    """Where the compiled GPU pods go: node selector, the GPU type's affinity terms, tolerations, GPUs per pod.

    ``terms``: label selectors, one per ORed ``nodeSelectorTerm`` of the required node affinity the
    compilers write for the GPU type (:mod:`components.gpu_nodes`): a node matching any one fits.
    """

    node_selector: Mapping[str, str]
    tolerations: tuple[Toleration, ...]
    gpus: int
    gpu_type: str | None = None
    terms: tuple[str, ...] = ()


def gpu_placement(gpus: int | None = None, gpu_type: str | None = None) -> GpuPlacement:
    """The GPU steps' placement from the pipeline's step specs (what every compiler writes), ``gpus`` per pod."""
    from dataclasses import replace

    from components import gpu_nodes
    from components.finetune_pipeline import build

    selector: dict[str, str] = {}
    tolerations: list[Toleration] = []
    terms: list[str] = []
    most, kind = 0, None
    for task in build().tasks.values():
        execution = task.step.execution
        if execution.resources.gpus > 0:
            if gpu_type:
                execution = replace(execution, resources=replace(execution.resources, gpu_type=gpu_type))
            own, affinity = gpu_nodes.placement(execution)
            selector.update(own)
            for term in ((affinity or {}).get("requiredDuringSchedulingIgnoredDuringExecution", {})
                         .get("nodeSelectorTerms", [])):
                text = ",".join(f"{e['key']} in ({','.join(e['values'])})" for e in term["matchExpressions"])
                if text not in terms:
                    terms.append(text)
            tolerations += [t for t in execution.tolerations if t not in tolerations]
            most, kind = max(most, execution.resources.gpus), execution.resources.gpu_type
    return GpuPlacement(selector, tuple(tolerations), gpus if gpus is not None else most, kind, tuple(terms))


def _q(value: str) -> str:
    return shlex.quote(value)


# --------------------------------------------------------------------------- namespace, secret, RBAC


def namespace_exists(cluster: ClusterReader, namespace: str) -> tuple[Check, dict[str, Any] | None]:
    try:
        found = cluster.namespace(namespace)
    except Unanswered as exc:
        return unread(exc, f"Namespace {namespace}"), None
    if found is None:
        return Check(False, f"namespace {namespace} does not exist", f"kubectl create namespace {_q(namespace)}"), None
    return Check(True, f"namespace {namespace} exists"), found


def _secret_keys(secret: Mapping[str, Any]) -> set[str]:
    """The keys of a Secret that hold a value (``data`` or ``stringData``)."""
    return ({k for k, v in (secret.get("data") or {}).items() if v}
            | {k for k, v in (secret.get("stringData") or {}).items() if v})


def tracking_secret(cluster: ClusterReader, namespace: str, name: str | None = None) -> Check:
    """The MLflow Secret every pod maps (``name``: ``--tracking-secret``'s, default ``llmpack-mlflow``):
    ``tracking-uri`` required and not empty; names the optional keys it has."""
    from components.errors import InputError
    from components.provenance import parse_key
    from components.record.tracking import TRACKING_CREDENTIALS, TRACKING_SECRET, TRACKING_URI_KEY

    secret_name = name or TRACKING_SECRET
    create = (f"kubectl -n {_q(namespace)} create secret generic {secret_name} "
              f"--from-literal={TRACKING_URI_KEY}={EXAMPLE_URI} --from-literal={SIGNING_KEY_KEY}={NEW_KEY}")
    try:
        secret = cluster.secret(namespace, secret_name)
    except Unanswered as exc:
        return unread(exc, f"Secret {secret_name} in {namespace}", namespace)
    if secret is None:
        return Check(False, f"Secret {secret_name} missing in {namespace} (every pod reads {TRACKING_URI_KEY} "
                     "from it)", create)
    keys = _secret_keys(secret)
    new_key_patch = f"kubectl -n {_q(namespace)} patch secret {secret_name} -p " + (  # a fresh key, made by the shell
        '"{\\"stringData\\":{\\"' + SIGNING_KEY_KEY + '\\":\\"' + NEW_KEY.strip('"') + '\\"}}"')
    if TRACKING_URI_KEY not in keys:
        patch = f"kubectl -n {_q(namespace)} patch secret {secret_name} -p " + _q(
            '{"stringData":{"' + TRACKING_URI_KEY + '":"' + EXAMPLE_URI + '"}}')
        return Check(False, f"Secret {secret_name} in {namespace} has no {TRACKING_URI_KEY} key", patch)
    uri = (_decoded((secret.get("data") or {}).get(TRACKING_URI_KEY))
           or str((secret.get("stringData") or {}).get(TRACKING_URI_KEY, "")))
    if not uri.startswith(("http://", "https://", "databricks")):
        return Check(False, f"Secret {secret_name} in {namespace}: {TRACKING_URI_KEY} is not an http(s) URL "
                     "(a pod's MLflow must reach a server)", f"kubectl -n {_q(namespace)} edit secret {secret_name}")
    if SIGNING_KEY_KEY not in keys:  # each pod would make its own key: evaluate refuses the model finetune sealed
        return Check(False, f"Secret {secret_name} in {namespace} has no {SIGNING_KEY_KEY} key (every pod of a run "
                     "signs and checks its outputs with it; without it each pod makes its own and evaluate "
                     "refuses finetune's model)", new_key_patch)
    key = (_decoded((secret.get("data") or {}).get(SIGNING_KEY_KEY))
           or str((secret.get("stringData") or {}).get(SIGNING_KEY_KEY, "")))
    try:
        parse_key(key, f"Secret {secret_name} in {namespace}: {SIGNING_KEY_KEY}")  # as every pod reads it
    except InputError as exc:
        return Check(False, f"{exc} (every pod would fail where it first signs)", new_key_patch)
    optional = sorted(keys & set(TRACKING_CREDENTIALS))
    return Check(True, f"Secret {secret_name} in {namespace} has {TRACKING_URI_KEY}"
                 + (f" and {', '.join(optional)}" if optional else ""))


def _decoded(value: Any) -> str:
    try:
        return base64.b64decode(str(value or "")).decode("utf-8", "replace").strip()
    except ValueError:
        return ""


def access(cluster: ClusterReader, path: str, namespace: str, verbs: Iterable[tuple[str, str, str]]) -> Check:
    """A SelfSubjectAccessReview per call ``path`` makes in ``namespace``; one line naming the denied ones."""
    denied: list[tuple[str, str, str]] = []
    verbs = list(verbs)
    try:
        for verb, resource, group in verbs:
            if not cluster.may(verb, resource, group, "" if resource == "nodes" else namespace):
                denied.append((verb, resource, group))
    except Unanswered as exc:
        return Check(False, f"RBAC ({path}): the API did not answer ({exc})", "kubectl cluster-info")
    scope = "the cluster" if all(r == "nodes" for _, r, _ in verbs) else namespace

    def named(items: list[tuple[str, str, str]]) -> str:  # "create/get workflows.argoproj.io, list/watch pods"
        by_resource: dict[str, list[str]] = {}
        for v, r, g in items:
            by_resource.setdefault(f"{r}.{g}" if g else r, []).append(v)
        return ", ".join(f"{'/'.join(vs)} {r}" for r, vs in by_resource.items())

    if not denied:
        return Check(True, f"RBAC ({path}): you may {named(verbs)} in {scope}")
    resources = ",".join(dict.fromkeys(f"{r}{'.' + g if g else ''}" for _, r, g in denied))
    verb_list = ",".join(dict.fromkeys(v for v, _, _ in denied))
    role = f"llmpack-{path}"
    if scope == "the cluster":
        fix = (f"kubectl create clusterrole {role} --verb={verb_list} --resource={resources} && kubectl create "
               f"clusterrolebinding {role} --clusterrole={role} --user=YOUR_USER")
    else:
        fix = (f"kubectl -n {_q(namespace)} create role {role} --verb={verb_list} --resource={resources} && kubectl -n "
               f"{_q(namespace)} create rolebinding {role} --role={role} --user=YOUR_USER")
    return Check(False, f"RBAC ({path}): you may not {named(denied)} in {scope}", fix)


# --------------------------------------------------------------------------- GPU nodes


def _tolerated(taint: Mapping[str, Any], tolerations: Iterable[Toleration]) -> bool:
    for t in tolerations:
        key_ok = t.key == taint.get("key") or (not t.key and t.operator == "Exists")
        value_ok = t.operator == "Exists" or (t.value or "") == (taint.get("value") or "")
        effect_ok = not t.effect or t.effect == taint.get("effect")
        if key_ok and value_ok and effect_ok:
            return True
    return False


def blocking_taints(node: Mapping[str, Any], tolerations: Iterable[Toleration]) -> list[Mapping[str, Any]]:
    taints = (node.get("spec") or {}).get("taints") or []
    return [t for t in taints if t.get("effect") in ("NoSchedule", "NoExecute") and not _tolerated(t, tolerations)]


def _gpus(node: Mapping[str, Any]) -> int:
    value = ((node.get("status") or {}).get("allocatable") or {}).get(GPU_RESOURCE, "0")
    try:
        return int(str(value))
    except ValueError:
        return 0


def placed_nodes(cluster: ClusterReader, placement: GpuPlacement) -> list[dict[str, Any]]:
    """The nodes the GPU pods' node selector and GPU-type affinity select (any one term of the affinity: ORed)."""
    selector = ",".join(f"{k}={v}" for k, v in sorted(placement.node_selector.items()))
    found: dict[str, dict[str, Any]] = {}
    for term in placement.terms or ("",):
        for node in cluster.nodes(",".join(filter(None, (selector, term)))):
            found.setdefault(node["metadata"]["name"], node)
    return list(found.values())


def gpu_nodes(cluster: ClusterReader, placement: GpuPlacement, nodes_needed: int) -> list[Check]:
    """Nodes with the GPU pods' labels; their taints tolerated; ``placement.gpus`` allocatable on ``nodes_needed``."""
    selector = ",".join(f"{k}={v}" for k, v in sorted(placement.node_selector.items()))
    shown = (f"GPU type {placement.gpu_type}" if placement.terms
             else selector or "(no node selector)")
    try:
        nodes = placed_nodes(cluster, placement)
    except Unanswered as exc:
        return [unread(exc, "Node list")]
    if not nodes and placement.terms:
        from components.gpu_nodes import GPU_NODES, PRODUCT_LABEL

        product = GPU_NODES[placement.gpu_type or ""].products[0]
        return [Check(False, f"no node is a {placement.gpu_type} node by its labels ({PRODUCT_LABEL}, the cloud's "
                      "accelerator or instance type; a pool scaled to 0 counts as none)",
                      f"kubectl label node YOUR_GPU_NODE {PRODUCT_LABEL}={product}  # or install the NVIDIA GPU "
                      "operator (GPU Feature Discovery labels it); another GPU: --gpu-type")]
    if not nodes:
        first = next(iter(sorted(placement.node_selector.items())), ("nvidia.com/gpu.present", "true"))
        return [Check(False, f"no node has the labels the GPU pods select: {shown} (a pool scaled to 0 counts as none)",
                      f"kubectl label node YOUR_GPU_NODE {first[0]}={first[1]}  # or install the NVIDIA GPU operator, "
                      "which labels GPU nodes")]
    checks = [Check(True, f"{len(nodes)} node(s) of {shown}" if placement.terms
                    else f"{len(nodes)} node(s) labelled {shown}")]
    usable = [n for n in nodes if not blocking_taints(n, placement.tolerations)]
    if not usable:
        node = nodes[0]
        taint = blocking_taints(node, placement.tolerations)[0]
        spelled = f"{taint.get('key')}{'=' + taint['value'] if taint.get('value') else ''}:{taint.get('effect')}"
        allowed = ", ".join(f"{t.key}:{t.effect}" for t in placement.tolerations) or "none"
        name = node["metadata"]["name"]
        fix = (f"kubectl uncordon {_q(name)}  # cordoned: the API server's own taint goes with it"
               if taint.get("key") == UNSCHEDULABLE_TAINT
               else f"kubectl taint node {name} {taint.get('key')}:{taint.get('effect')}-")
        checks.append(Check(False, f"every GPU node has a taint the GPU pods do not tolerate (e.g. {spelled} on "
                            f"{name}; tolerated: {allowed})", fix))
        return checks
    checks.append(Check(True, f"{len(usable)} of them with taints the GPU pods tolerate"))
    enough = [n for n in usable if _gpus(n) >= placement.gpus]
    want = f"{placement.gpus} allocatable {GPU_RESOURCE}"
    if len(enough) < nodes_needed:
        most = max((_gpus(n) for n in usable), default=0)
        checks.append(Check(False,
                            f"{len(enough)} tolerated GPU node(s) with {want}, need {nodes_needed} (most: {most})",
                            "kubectl get nodes -o custom-columns=NAME:.metadata.name,GPUS:.status.allocatable."
                            "nvidia\\.com/gpu  # 0 or none: install the NVIDIA device plugin (GPU operator)"))
    else:
        checks.append(Check(True, f"{len(enough)} tolerated GPU node(s) with {want} (need {nodes_needed})"))
    return checks


# --------------------------------------------------------------------------- Pod Security


def _release(version: str | None) -> tuple[int, int] | None:
    """``(major, minor)`` of a server's version string (``2.16.0``, ``v2.16.0-rc.1``), None when not one."""
    import re

    found = re.match(r"^v?(\d+)\.(\d+)", str(version or ""))
    return (int(found.group(1)), int(found.group(2))) if found else None


def pod_security(path: str, namespace: str, found: Mapping[str, Any], specs: list[Any],
                 server_version: str | None = None) -> Check:
    """The namespace's enforced Pod Security level against ``path``'s compiled pods; an orchestrator that sets the
    ``restricted`` fields itself from some release (the backend's ``doctor.secures_pods_from``: KFP 2.16) passes
    when its server (``server_version``, from its version call) is that release or later."""
    from llmpack.backends import doctor_facts
    from llmpack.cluster.doctor.pods import ENFORCE_LABEL, enforced_level, violations

    level = enforced_level(found)
    failing = [(spec.where, problems) for spec in specs if (problems := violations(spec, level))]
    labelled = ENFORCE_LABEL in ((found.get("metadata") or {}).get("labels") or {})
    enforces = f"enforces {level}" if labelled else "enforces no level"
    if not failing:
        return Check(True, f"Pod Security ({path}): {namespace} {enforces}; the compiled pods comply")
    since = doctor_facts(path).secures_pods_from
    release = _release(server_version)
    if since and release and release >= since \
            and not any(w.startswith("TrainJob") for w, _ in failing):  # ours only: the server secures its own pods
        return Check(True, f"Pod Security ({path}): {namespace} {enforces}; its server ({server_version}) sets the "
                     "pods' security context itself")
    where, problems = failing[0]
    more = f" (and {len(failing) - 1} more pod specs)" if len(failing) > 1 else ""
    relabel = (f"kubectl label namespace {_q(namespace)} {ENFORCE_LABEL}=baseline --overwrite  # or run in a "
               "namespace that allows baseline")
    if since:
        wanted = ".".join(map(str, since))
        seen = f"its server is {server_version}" if server_version else f"--{path}-host not given: version unknown"
        relabel = (f"{relabel}; or {path} {wanted} or later, which sets these fields itself ({seen})")
    return Check(False, f"Pod Security ({path}): {namespace} enforces {level}; {where}{more} lacks "
                 f"{', '.join(problems)}", relabel)


# --------------------------------------------------------------------------- orchestrator endpoints

def endpoint(path: str, host: str, token: str | None, verify: bool | str,
             versions: dict[str, str] | None = None) -> Check:
    """The orchestrator's server answers its version call (the backend's ``doctor.probe``; ``token`` never shown);
    the version it gave into ``versions[path]``."""
    import requests

    from components.servers.remote import normalize_host
    from llmpack.backends import doctor_facts

    probe = doctor_facts(path).probe
    assert probe is not None, path  # endpoint_checks asks only the paths that have one
    what, suffix, field, variable = probe.what, probe.path, probe.field, probe.token_env
    url = normalize_host(host, default_scheme=probe.scheme)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        response = requests.get(url + suffix, headers=headers, timeout=10, verify=verify)
    except requests.RequestException as exc:
        return Check(False, f"{what} at {url} unreachable ({type(exc).__name__})",
                     f"kubectl -n {probe.service_namespace} get svc  # then port-forward it, or "
                     f"pass --{path}-host")
    if response.status_code in (401, 403):
        return Check(False, f"{what} at {url} refused the token (HTTP {response.status_code})",
                     f"export {variable}=...  # a token the server accepts")
    try:
        version = response.json().get(field) if response.ok else None
    except ValueError:
        version = None
    if not response.ok or version is None:
        return Check(False, f"{what} at {url}: HTTP {response.status_code} from {suffix}", f"curl -sS {url}{suffix}")
    if versions is not None:
        versions[path] = str(version)
    return Check(True, f"{what} at {url} answers (version {version})")


# --------------------------------------------------------------------------- the tracking server

TRACKING_READ = "/api/2.0/mlflow/experiments/search?max_results=1"  # one read every role may make


def tracking_server(uri: str, *, username: str | None, password: str | None, token: str | None,
                    verify: bool | str) -> Check:
    """The MLflow tracking server answers an authenticated read (an experiments search), with the credentials
    MLflow's client would send (``MLFLOW_TRACKING_USERNAME``/``PASSWORD`` as basic auth, else ``..._TOKEN``).

    Three outcomes, each its own line: it answers; it refuses the credentials (401/403); it is
    unreachable. Neither the password nor the token appears in a line: the URI is shown without
    its userinfo (:func:`components.redaction.redact_uri`).
    """
    import requests

    from components.redaction import redact_uri

    shown = redact_uri(uri.rstrip("/"))
    auth = (username, password) if username and password else None
    headers = {"Authorization": f"Bearer {token}"} if token and auth is None else {}
    what = f"MLflow tracking server at {shown}"
    try:
        response = requests.get(uri.rstrip("/") + TRACKING_READ, auth=auth, headers=headers, timeout=10,
                                verify=verify, allow_redirects=False)
    except requests.RequestException as exc:
        return Check(False, f"{what} unreachable ({type(exc).__name__})",
                     "kubectl -n mlflow port-forward svc/mlflow 5000:5000  # then --tracking-uri http://localhost:5000")
    if response.status_code in (401, 403):
        sent = "basic auth" if auth else "a token" if headers else "no credentials"
        return Check(False, f"{what} refused the read with {sent} (HTTP {response.status_code})",
                     "export MLFLOW_TRACKING_USERNAME=... MLFLOW_TRACKING_PASSWORD=...  # the Secret's username/"
                     "password, which the pods send")
    try:
        answered = response.ok and "experiments" in response.json() or response.json() == {}
    except ValueError:
        answered = False
    if not answered:
        return Check(False, f"{what}: HTTP {response.status_code} from {TRACKING_READ.split('?')[0]} (not an MLflow "
                     "tracking server?)", f"curl -sS {shown}/health")
    how = "an authenticated read" if auth or headers else "a read (no credentials sent)"
    return Check(True, f"{what} answers {how}")


# --------------------------------------------------------------------------- pod-spec references (components.podspec)


def secret_key(cluster: ClusterReader, namespace: str, name: str, key: str, env: str) -> Check:
    """A Secret the pods read ``env`` from (``--hf-token-secret``; a required secretKeyRef): it and its key exist."""
    try:
        secret = cluster.secret(namespace, name)
    except Unanswered as exc:
        return unread(exc, f"Secret {name} in {namespace}", namespace)
    if secret is None:
        return Check(False, f"Secret {name} missing in {namespace} (the pods read {env} from its key {key}: without it "
                     "they do not start)", f"kubectl -n {_q(namespace)} create secret generic {name} "
                     f"--from-literal={key}=\"$HF_TOKEN\"")
    if key not in _secret_keys(secret):
        return Check(False, f"Secret {name} in {namespace} has no {key} key (the pods read {env} from it)",
                     f"kubectl -n {_q(namespace)} patch secret {name} -p "
                     + _q('{"stringData":{"' + key + '":"<token>"}}'))
    return Check(True, f"Secret {name} in {namespace} has {key} ({env})")


DOCKER_SECRET_TYPES = ("kubernetes.io/dockerconfigjson", "kubernetes.io/dockercfg")


def pull_secret(cluster: ClusterReader, namespace: str, name: str) -> Check:
    """An ``imagePullSecrets`` entry (``--image-pull-secret``): it exists and is a registry credential."""
    create = (f"kubectl -n {_q(namespace)} create secret docker-registry {name} --docker-server=REGISTRY "
              "--docker-username=USER --docker-password=TOKEN")
    try:
        secret = cluster.secret(namespace, name)
    except Unanswered as exc:
        return unread(exc, f"Secret {name} in {namespace}", namespace)
    if secret is None:
        return Check(False, f"image pull Secret {name} missing in {namespace} (the kubelet cannot pull the step image)",
                     create)
    kind = secret.get("type") or "Opaque"
    if kind not in DOCKER_SECRET_TYPES:
        return Check(False, f"image pull Secret {name} in {namespace} is {kind}, not {DOCKER_SECRET_TYPES[0]}",
                     f"kubectl -n {_q(namespace)} delete secret {name} && {create}")
    return Check(True, f"image pull Secret {name} in {namespace} exists ({kind})")
