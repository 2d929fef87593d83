"""Every check of ``llmpack cluster doctor``, in order (:func:`run_checks`), from what the compiled artifacts ask
(:mod:`llmpack.cluster.doctor.compiled`, :mod:`llmpack.cluster.doctor.capacity`) and the options left."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

DoctorOptions = Any  # llmpack.cluster.doctor.command.DoctorOptions (which imports this module)

DEFAULT_SHARED_PVC = "llmpack-shared"  # compare --cluster --nodes N's default --cache-pvc
BUILTIN_ACCOUNTS = ("default",)  # made in every namespace by the ServiceAccount controller


def namespaces_of(opts: DoctorOptions) -> dict[str, list[str]]:
    """Each namespace the runs use, and the paths whose pods run there."""
    from llmpack.backends import cluster_path

    out: dict[str, list[str]] = {}
    for path in opts.paths:
        conf = {"namespace": opts.namespace, "pod_namespace": opts.pod_namespaces.get(path)}
        out.setdefault(cluster_path(path).pod_namespace(conf), []).append(path)
    return out


def tracking_secrets(given: str | None, found_refs: list[tuple[set[tuple[str, str, str]], set[str]]]) -> list[str]:
    """The MLflow Secrets to check: those the compiled pods read the tracking URI from, and ``--tracking-secret``'s;
    the default name when neither says one (artifacts compiled with another name are checked by that name)."""
    from components.record.tracking import TRACKING_SECRET, TRACKING_URI_KEY

    compiled = {name for found, _ in found_refs for name, key, _env in found if key == TRACKING_URI_KEY}
    return sorted((compiled | {given}) if given else compiled) or [TRACKING_SECRET]


def _gang_needs(needs: Any, paths: list[str]) -> dict[str, Decimal]:
    """What the TrainJob's node pods request together (Kueue admits all of them or none)."""
    pods = [p for path in paths for p in needs.pods.get(path, []) if p.where == "TrainJob node pod"][:1]
    out: dict[str, Decimal] = {}
    for pod in pods:
        for resource, amount in pod.requests.items():
            out[resource] = out.get(resource, Decimal(0)) + amount * pod.count
    return out


def run_checks(opts: DoctorOptions, cluster: Any, specs: dict[str, list[Any]], claims: dict[str, set[str]],
               refs: dict[str, tuple[set[tuple[str, str, str]], set[str]]] | None = None,
               needs: Any = None) -> list[Any]:
    """Every check, in order (``specs``, ``claims``, ``refs``: each path's compiled pod specs, PVC names, and the
    Secrets its pods read and pull with; ``needs``: their GPU pods, created kinds and namespace,
    :class:`llmpack.cluster.doctor.capacity.Needs`); only the first when the API does not answer."""
    from llmpack.backends import doctor_facts
    from llmpack.cluster.doctor import capacity, waits
    from llmpack.cluster.doctor import checks as dc
    from llmpack.cluster.doctor import gang as gang_checks
    from llmpack.cluster.doctor.compiled import Facts
    from llmpack.cluster.doctor.reader import Unanswered

    given = needs
    needs = needs or capacity.Needs()
    facts = opts.facts or Facts()

    try:
        version = cluster.version()
    except Unanswered as exc:
        return [dc.Check(False, f"Kubernetes API: {exc}", "kubectl cluster-info  # the same --kubeconfig / --context")]
    checks = [dc.Check(True, f"Kubernetes API at {cluster.host} answers ({version})")]
    if needs.namespace is not None:
        checks.append(capacity.namespace_match(needs.source, needs.namespace, opts.namespace))
    gang = opts.nodes > 1
    placement = dc.gpu_placement(opts.gpus, opts.gpu_type)
    asks_gpu = given is None or any(needs.pods.get(p) for p in opts.paths)
    nodes = dc.gpu_nodes(cluster, placement, opts.nodes) if asks_gpu else []
    if not asks_gpu:  # a pipeline of one's own without a GPU step: no GPU node is needed
        checks.append(dc.Check(True, f"GPU nodes: not needed (no pod of {needs.source} asks for a GPU)"))
    checks += nodes
    if nodes and all(c.ok for c in nodes):  # else its line has said why no node takes a GPU pod
        gpu_pods = list({p.where: p for path in opts.paths for p in needs.pods.get(path, [])}.values())
        checks += capacity.node_fit(cluster, placement, gpu_pods)
    checks.append(dc.access(cluster, "pod watcher", "", dc.NODE_VERBS))
    for ctl in waits.controllers(gang=gang, queue=bool(opts.queue), paths=list(opts.paths)):
        checks.append(waits.controller_ready(cluster, ctl))
    runtime = facts.gang
    if gang and (runtime is None or runtime.runtime_kind != "TrainingRuntime"):
        checks.append(gang_checks.training_runtime(cluster, runtime.runtime if runtime else None))
    for name in sorted(facts.priority_classes | ({runtime.priority_class} if runtime and runtime.priority_class
                                                 else set())):
        checks.append(waits.priority_class(cluster, name))
    queues_seen: set[Any] = set()
    for namespace, paths in namespaces_of(opts).items():
        check, found = dc.namespace_exists(cluster, namespace)
        checks.append(check)
        if found is None:
            continue  # everything below would fail for the same reason
        found_refs = [(refs or {}).get(path, (set(), set())) for path in paths]
        trackers = tracking_secrets(opts.tracking_secret, found_refs)
        checks += [dc.tracking_secret(cluster, namespace, name) for name in trackers]
        checks += capacity.served(cluster, namespace, {k: f for p in paths for k, f in needs.kinds.get(p, {}).items()})
        checks += capacity.admission(cluster, namespace, paths, needs)
        for path in paths:
            checks.append(dc.access(cluster, path, namespace, dc.path_verbs(path)))
            checks.append(dc.pod_security(path, namespace, found, specs[path], opts.server_versions.get(path)))
            own = doctor_facts(path).checks
            checks += own(cluster, namespace, opts.flags) if own is not None else []
        if gang and runtime is not None and runtime.runtime_kind == "TrainingRuntime":
            checks.append(gang_checks.training_runtime(cluster, runtime.runtime, runtime.runtime_kind, namespace))
        shared = (opts.cache_pvc or DEFAULT_SHARED_PVC) if gang else None
        if gang:
            checks.append(gang_checks.launcher_rbac(cluster, namespace))
            checks.append(gang_checks.shared_pvc(cluster, namespace, shared, shared=True))
        ckpt = opts.checkpoint_pvc
        mounted = set().union(*(claims[path] for path in paths)) | ({opts.cache_pvc} if opts.cache_pvc else set())
        in_gang = {n for n in mounted | set(opts.pvcs) if facts.claim_modes(n)}  # mounted on several nodes at once
        if ckpt and ckpt != shared and ckpt not in in_gang:
            checks.append(gang_checks.shared_pvc(cluster, namespace, ckpt, shared=gang))
        # what the compiled pods mount, --cache-pvc, --model-pvc...: a claim the gang mounts needs a *Many mode
        why = (f"the gang's {runtime.nodes} node pods and its launcher mount it on several nodes at once"
               if runtime else "")
        for name in sorted((mounted | set(opts.pvcs)) - {shared} - ({ckpt} - in_gang)):
            checks.append(gang_checks.shared_pvc(cluster, namespace, name, shared=False, modes=facts.claim_modes(name),
                                                 why=why))
        secrets = {(n, k): e for n, k, e in sorted(set().union(*(r for r, _ in found_refs)) | set(opts.secrets))}
        for (name, key), env in secrets.items():  # --hf-token-secret: required secretKeyRefs (the MLflow one: above)
            if name not in trackers:
                checks.append(dc.secret_key(cluster, namespace, name, key, env))
        for name in sorted(set().union(*(p for _, p in found_refs)) | set(opts.pull_secrets)):  # --image-pull-secret
            checks.append(dc.pull_secret(cluster, namespace, name))
        from components.podspec import NODE_SERVICE_ACCOUNT
        from components.trainjob.launch import LAUNCHER_SERVICE_ACCOUNT

        known = {*BUILTIN_ACCOUNTS, *((LAUNCHER_SERVICE_ACCOUNT, NODE_SERVICE_ACCOUNT) if gang else ())}
        for name in sorted(facts.accounts - known):  # launcher_rbac has checked the gang's own two
            checks.append(waits.service_account(cluster, namespace, name))
        if opts.queue:
            queue_check = gang_checks.local_queue(cluster, namespace, opts.queue)
            checks.append(queue_check)
            if queue_check.ok:
                local = cluster.namespaced_object(dc.KUEUE_GROUP, dc.KUEUE_VERSIONS, namespace, "localqueues",
                                                  opts.queue) or {}
                target = (local.get("spec") or {}).get("clusterQueue")
                if target not in queues_seen:  # cluster-scoped: one line, however many LocalQueues point at it
                    queues_seen.add(target)
                    checks.append(waits.cluster_queue(cluster, namespace, local, _gang_needs(needs, paths)))
    return checks
