"""``llmpack compare --cluster``: the same pipeline through every cluster backend, on one cluster.

Every selected path is submitted with the same parameters and resources into one run group,
``repeats`` times, interleaved, at most ``concurrency`` runs in flight. Each run is watched by a
pod watcher (started before the submission when its pods carry the run group, right after it
when they carry only the orchestrator's run id), waited for with live progress, and measured
(:mod:`llmpack.cluster.compare.session`, :mod:`llmpack.cluster.compare.measure`): its pods' phases uploaded to
its MLflow record, the record read back, the metrics derived, nodes billed once across the
comparison. Bad input for the whole comparison is one :class:`~components.errors.InputError`
before anything is submitted; a path whose server refuses fails on its own and the others go on.

Where ``total_s`` ends, how nodes are billed and the GPU type found: docs/internals/decisions.md (Measuring
a run, Cost) and docs/telemetry-and-cost.md (node billing on a cluster); the steps: docs/cluster.md.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from typing import Any

from components.errors import InputError
from components.record import cost, tracking
from llmpack.backends import ORCHESTRATORS, cluster_paths
from llmpack.cluster.compare.measure import MODE, bill_across_runs
from llmpack.cluster.compare.session import Plan, Progress, Session, preflight
from llmpack.cluster.k8s.reconcile import check_opencost_url, log_opencost, opencost_reconcile
from llmpack.compare.plan import ComparePlan, parse_backends, run_all
from llmpack.report.rebill import check_scale_down_delay

DEFAULT_TIMEOUT_S = 24 * 3600.0
DEFAULT_POLL_S = 10.0
DEFAULT_GANG_PVC = "llmpack-shared"  # compare --cluster --nodes N: the ReadWriteMany PVC of the gang (--cache-pvc)
K8S_OPTIONS = ("host", "token", "token_file", "ca_cert", "verify_ssl", "kubeconfig", "context")


def _options(name: str, given: Mapping[str, Any] | None, allowed: Iterable[str]) -> dict[str, Any]:
    out = {k: v for k, v in dict(given or {}).items() if v is not None}
    unknown = sorted(set(out) - set(allowed))
    if unknown:
        raise InputError(f"{name} options: unknown {', '.join(unknown)} (known: {', '.join(allowed)})")
    return out


def compare_cluster(
    *,
    backends: Iterable[str] | str = ORCHESTRATORS,
    repeats: int = 1,
    concurrency: int = 1,
    params: Mapping[str, Any] | None = None,
    run_group: str | None = None,
    k8s: Mapping[str, Any] | None = None,
    tracking_uri: str | None = None,
    price_per_gpu_hour: Any = None,
    price_file: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    poll_s: float = DEFAULT_POLL_S,
    progress: Progress | None = None,
    scale_down_delay_s: float = cost.DEFAULT_SCALE_DOWN_DELAY_S,
    gpus: int | None = None,
    nodes: int | None = None,
    cache_pvc: str | None = None,
    queue: str | None = None,
    gpu_type: str | None = None,
    variants: Iterable[str] | None = None,
    pod: Any = None,
    opencost: str | None = None,
    preempt: str | None = None,
    **paths: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """Submit every path ``repeats`` times to one cluster, wait, measure; the ``compare()`` result.

    ``variants``: fusion modes (``none``, ``gpu``, ``all``; :mod:`components.fusion`); each path
    is compiled in each (``llmpack compile --fuse``) into a temporary directory and submitted side
    by side, labelled ``argo``, ``argo+fuse-gpu``... A fused pod's phases are its training
    member's spin-up (:func:`~llmpack.cluster.compare.pods.pod_step_aliases`) and its GPUs are billed once for all
    its members.

    ``gpus`` / ``nodes``: the finetune step's GPUs per node and nodes (``llmpack compile --gpus
    --nodes``); with either, every path is compiled for it into a temporary directory
    (:func:`llmpack.compile.artifacts.compile_all`) and that is what is submitted, instead of the
    committed artifacts. Above one node finetune is a Kubeflow Trainer TrainJob gang whose node
    pods and launcher share ``cache_pvc`` (default :data:`DEFAULT_GANG_PVC`, ReadWriteMany);
    its pods are one attempt, and ``gang_ready_s`` says when the last of them started.
    ``gpu_type`` (``--gpu-type``): every GPU step's type, compiled in the same way: its pods
    select that GPU's nodes (``llmpack compile --gpu-type``). ``pod`` (a
    :class:`llmpack.compile.pod_options.PodOptions`: ``--image``, ``--model-pvc``, ``--data-pvc``,
    ``--hf-token-secret``, ``--image-pull-*``, ``--label``): compiled the same way, into every path's pods.

    ``kfp=`` / ``argo=`` / ``mlflow=`` (a keyword per cluster path, by name): each path's ``submit``
    options (``<package>.submit``; ``host``, ``token``, ``namespace``... see
    :attr:`components.backend.ClusterPath.submit_options`; KFP's ``pod_namespace`` is where
    its pods run: default its profile ``namespace``, else ``kubeflow``). ``k8s``: how the pod
    watcher reaches the Kubernetes API (:func:`~llmpack.cluster.k8s.watcher.build_api_client` options;
    default the MLflow path's kubeconfig, else ``KUBECONFIG``/``~/.kube/config``/in-cluster).
    ``timeout_s``: how long to wait for each run (then it is failed, "did not finish"; it is not
    cancelled). ``poll_s``: how often the orchestrator is asked. ``progress(label, message,
    elapsed_s)`` is called from the worker threads: "submitting", "submitted", the pods' state
    ("finetune · queued (waiting for a node) · 2 tasks done"), then "succeeded" or "failed: ...".
    ``scale_down_delay_s``: how long the autoscaler keeps an empty GPU node; billed after the
    last pod on a node whose removal the watcher did not see (see the module doc).
    ``opencost``: OpenCost's API URL (``--opencost``): its allocation for the runs' labels is read
    once every run ended and shown beside ours (:mod:`llmpack.cluster.k8s.reconcile`).
    ``preempt`` (``--preempt finetune@30s`` or ``finetune@rate=0.5/h``;
    :func:`~llmpack.cluster.k8s.preemption.parse_preempt`):
    the preemptions every path runs under, checked here and carried in the result (``preempt``) for
    the report's preemption section; the attempts' outcomes and waste are measured either way.
    """
    from components.fusion import check_mode
    from components.fusion import fuse as fuse_steps
    from components.servers.submission import check_id, connect_tracking, new_id, shipped_pipeline, user_parameters

    names = parse_backends(backends, ORCHESTRATORS, "{name!r} cannot run on a cluster")
    modes = list(dict.fromkeys(check_mode(m) for m in (variants or ["none"])))
    plan = ComparePlan(backends=tuple(names), variants=tuple(modes), repeats=repeats)
    if not isinstance(concurrency, int) or concurrency < 1:
        raise InputError(f"--concurrency {concurrency}: must be at least 1")
    if not (timeout_s > 0 and math.isfinite(timeout_s)):
        raise InputError(f"--timeout {timeout_s}: must be a positive number of seconds")
    if not (poll_s > 0 and math.isfinite(poll_s)):
        raise InputError(f"--poll {poll_s}: must be a positive number of seconds")
    scale_down_delay_s = check_scale_down_delay(scale_down_delay_s, "--scale-down-delay-s")
    if opencost is not None:
        opencost = check_opencost_url(opencost)
    if price_per_gpu_hour is not None:
        cost.parse_price(price_per_gpu_hour, "--price-per-gpu-hour")
    if price_file is not None:
        cost.resolve_price("check", price_file=price_file, env={})  # reads and checks the file now
    pipe = shipped_pipeline()
    if pod is not None and pod.compiles:
        pipe = pod.apply(pipe)  # what is compiled below: the image and volumes every pod gets
    values = user_parameters(pipe, params)
    preempt_spec = None
    if preempt is not None:
        from llmpack.cluster.k8s.preemption import parse_preempt

        preempt_spec = parse_preempt(preempt, [t.name for t in pipe.tasks.values()])
        preempt = str(preempt_spec)
    unknown = sorted(set(paths) - set(cluster_paths()))
    if unknown:
        raise InputError(f"cluster compare: no cluster path {unknown[0]!r} "
                         f"(choose among {', '.join(cluster_paths())})")
    conf = {name: _options(name, paths.get(name), path.submit_options) for name, path in cluster_paths().items()}
    gang = None
    compiled_dir = None
    if queue is not None and nodes is None:
        raise InputError(f"--queue {queue}: Kueue admits the finetune TrainJob; give --nodes 2 or more")
    if gpus is not None or nodes is not None or gpu_type is not None:
        from llmpack.compile.artifacts import check_cache_pvc, with_gpus

        if (nodes or 1) > 1:
            cache_pvc = cache_pvc or DEFAULT_GANG_PVC
        if cache_pvc is not None:
            check_cache_pvc(cache_pvc)
        pipe = with_gpus(pipe, gpus, nodes, claim=cache_pvc, queue=queue, gpu_type=gpu_type)  # checks them now
        if (nodes or 1) > 1:
            from components.trainjob.gang import GangSpec

            spec = GangSpec.from_json(str(pipe.params["trainjob"].default), "--nodes")
            gang = (int(nodes or 1), int(spec.gpus_per_node))
    fused_modes = [m for m in modes if m != "none"]
    if fused_modes and ((gpus or 1) > 1 or (nodes or 1) > 1):
        raise InputError(f"--variants fuse-{fused_modes[0]} with --gpus {gpus or 1} --nodes {nodes or 1}: "
                         "the many-process "
                         "finetune runs unfused; compare fused variants on one GPU")
    pod_compiles = pod is not None and pod.compiles
    compile_here = gpus is not None or nodes is not None or gpu_type is not None or bool(fused_modes) or pod_compiles
    if compile_here:
        for orch, key in ((name, path.artifact_option) for name, path in cluster_paths().items()):
            if conf[orch].get(key):
                raise InputError("--gpus/--nodes/--gpu-type/--variants/--image/--model-pvc... compile the artifacts "
                                 f"to submit: {orch} option {key} "
                                 "cannot be given too")
    pipes = {mode: fuse_steps(pipe, mode) for mode in modes}
    k8s_opts = _options("k8s", k8s, K8S_OPTIONS)
    lender = next((conf[name] for name, path in cluster_paths().items() if path.lends_kubeconfig), {})
    if not k8s_opts.get("host") and not k8s_opts.get("kubeconfig") and lender.get("kubeconfig"):
        k8s_opts.setdefault("kubeconfig", lender["kubeconfig"])
        if lender.get("context"):
            k8s_opts.setdefault("context", lender["context"])
    group = check_id(run_group, "--run-group") if run_group else new_id("rg")
    uri = tracking.tracking_uri(tracking_uri)
    connect_tracking(uri)  # answers, before anything is submitted

    session = Session(run_group=group, values=values, conf=conf, k8s=k8s_opts, uri=uri,
                       price_flag=price_per_gpu_hour, price_file=price_file, timeout_s=float(timeout_s),
                       poll_s=float(poll_s), progress=progress, pipe=pipe, scale_down_delay_s=scale_down_delay_s,
                       gang=gang, pipes=pipes, opencost=opencost, preempt=preempt_spec)
    preflight(session, names)
    if compile_here:
        import tempfile

        from llmpack.compile.artifacts import compile_all

        compiled_dir = tempfile.mkdtemp(prefix="llmpack-compare-")
        for mode in modes:  # what `llmpack compile [--fuse MODE]` writes, a directory per variant
            out = os.path.join(compiled_dir, mode)
            compile_all(out, fuse=mode, gpus=gpus, nodes=nodes, cache_pvc=cache_pvc, queue=queue, gpu_type=gpu_type,
                        pod=pod if pod_compiles else None)
            session.artifacts[mode] = {orch: os.path.join(out, path.artifact_path)
                                       for orch, path in cluster_paths().items()}
    try:
        result = _compare_all(session, plan, concurrency, group)
        if preempt is not None:
            result["preempt"] = preempt
        return result
    finally:
        if compiled_dir is not None:
            import shutil

            shutil.rmtree(compiled_dir, ignore_errors=True)


def _compare_all(session: Session, plan: ComparePlan, concurrency: int, group: str) -> dict[str, Any]:
    """The plan's runs on the cluster (every pipeline-run id made before the first submission), then billed."""
    from components.servers.submission import new_id
    from llmpack.compare.comparison import comparison

    plans = [Plan(orchestrator=r.backend, label=r.label, pipeline_run=new_id(r.backend), fuse=r.fuse)
             for r in plan.runs()]
    runs = run_all(plans, session.run, concurrency=concurrency)
    bill_across_runs(session, runs)
    if session.opencost:
        opencost_reconcile(session.opencost, runs)
        log_opencost(session.uri, runs)
    return comparison(group, plan.labels, runs, repeats=plan.repeats, warmup=0, concurrency=concurrency, mode=MODE)
