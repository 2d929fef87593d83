"""``llmpack compare --cluster``: the same pipeline through KFP, Argo and MLflow on one cluster.

Every selected path is submitted with the same parameters and resources (the committed compiled
artifacts, through :mod:`llmpack.submit`) into one run group, ``repeats`` times, interleaved
(kfp, argo, mlflow, kfp, ...), at most ``concurrency`` runs in flight (1: one after the other,
so runs do not compete for GPUs). Per run:

1. a :class:`~llmpack.k8s.watcher.PodWatcher` is started *before* the submission for Argo and
   MLflow (their pods carry ``llmpack.io/run-group``); KFP pods carry only KFP's
   ``pipeline/runid``, known once the run is created, so the KFP run's watcher starts right
   after the submission, with that run id (its first list picks up every pod already created,
   with the times the API server stamped on them, so nothing is lost);
2. the run is submitted and waited for (:func:`llmpack.submit.wait_for_completion`), with live
   progress from the watched pods (``step · queued / starting / running``);
3. the watcher's rows become the cluster events (``pod_created``, ``pod_scheduled``,
   ``node_ready``, ``container_started``; :func:`~llmpack.k8s.podphases.to_step_records`), which
   are uploaded to the run's MLflow record (idempotent keys);
4. the run's records are read back from MLflow (on a cluster the steps log their own
   ``process_started``, ``model_loaded``, ``first_step``, ``finished`` and ``metric.*`` there),
   the DESIGN.md metrics are derived and logged with the tags.

Decisions (where DESIGN.md is silent):

- ``total_s`` ends at the last thing the run did that the cluster or the steps timestamped
  (the latest pod container finish or step ``finished``), not when this client's poll noticed
  the end, which would add up to ``poll_s`` of noise to every run.
- ``gpu_hours`` is GPU time held by the run's containers: every GPU pod (retries too) from
  its main container's start to its finish, plus node provisioning when a node was brought up
  for it. Every attempt counts: a step's pods are its attempts, numbered by creation
  (:func:`~llmpack.k8s.podphases.to_step_records`); ``retries``, ``retry_gpu_hours`` and
  ``retry_cost_usd`` say how much of the bill the pods before each step's last one were, and the
  run's ``retried_attempts`` lists them. The MLflow Job is one pod sized to the largest step, so it counts for the whole
  pipeline at that GPU count. Where the watcher saw no pod for a GPU step, the step's own
  events count (:func:`components.record.cost.billed_seconds`).
- ``cost_usd`` bills GPU nodes the way clouds do (:func:`components.record.cost.bill_nodes`): each
  node a GPU pod of the run ran on, from Ready (a node brought up for the pods) or from the
  first pod's scheduling (a node that was already running), to its removal, or, when the pod
  watcher did not see the removal (the usual case: it stops when the run ends, and the
  autoscaler waits first), to the last pod's finish plus the scale-down delay
  (``scale_down_delay_s``, default 600 s, cluster-autoscaler's ``--scale-down-unneeded-time``);
  times the node's GPU count (``nvidia.com/gpu`` capacity, else GFD's label, else the pods'
  largest request); the price is the node GPU's. A node several runs of the comparison used is
  billed once and shared in proportion to their pod GPU-seconds; pods of other workloads are
  not watched, so compare on a node pool of your own. Metrics: ``node_gpu_hours`` (the run's
  share), ``node_tail_gpus`` (the share-weighted GPUs the delay was billed on: ``llmpack
  report --scale-down-delay-s`` re-bills another delay from it), ``cost_compute_usd`` (the GPU
  steps' GPUs from ``model_loaded`` to ``finished``: training and evaluating) and
  ``cost_overhead_usd`` (the rest: provisioning, image pull, start-up, hand-overs, the
  scale-down tail and GPUs of the node no step asked for); ``goodput`` divides by the node
  GPU-seconds. Tag ``llmpack.cost_basis`` is ``node``; ``container`` (the container time
  above, priced) where no node of the run could be read (no RBAC ``get`` on nodes).
- The GPU type is what the finetune pod's node reports: ``nvidia.com/gpu.product`` (NVIDIA GPU
  feature discovery) mapped by :data:`GPU_PRODUCTS`, else the node's instance type
  (:data:`INSTANCE_TYPES`, which also gives the cloud provider whose list price applies), else
  the pipeline spec's GPU type. A product that maps to nothing is reported under its own name
  (``nvidia-h100-pcie``): a price flag, env var or price file can price it; the shipped table
  cannot, and the cost is then unknown, never guessed. Tag ``llmpack.gpu_type_source`` says
  which it was.
- Bad input for the whole comparison (unknown path, bad parameter or price, no Kubernetes
  access, MLflow not answering, an orchestrator with no endpoint configured) is an
  :class:`~components.errors.InputError` before anything is submitted. A path whose server
  refuses the submission (401, unreachable...) fails on its own: its runs are ``failed`` with
  that one-line error and the other paths go on.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from components import settings
from components.errors import InputError
from components.record import cost, telemetry, tracking
from llmpack.backends import ORCHESTRATORS, cluster_submitter

MODE = "cluster"
DEFAULT_TIMEOUT_S = 24 * 3600.0
DEFAULT_POLL_S = 10.0
DEFAULT_NAMESPACE = "llmpack"  # Argo Workflows and the MLflow Job (where Secret llmpack-mlflow lives)
DEFAULT_KFP_POD_NAMESPACE = "kubeflow"  # single-user KFP runs its pods there; multi-user: the profile
DEFAULT_GANG_PVC = "llmpack-shared"  # compare --cluster --nodes N: the ReadWriteMany PVC of the gang (--cache-pvc)
# The option of each path that names what it submits, and where `llmpack compile --out DIR` writes it.
ARTIFACT_OPTIONS = {"kfp": "package_path", "argo": "workflow_path", "mlflow": "project_dir"}
ARTIFACT_PATHS = {"kfp": "kfp_pipelines/finetune.yaml", "argo": "argo_workflows/finetune.yaml",
                  "mlflow": "mlflow_projects/finetune-k8s"}

# (label, message, elapsed seconds since this run started)
Progress = Callable[[str, str, float], None]

# Options each path takes (passed to llmpack.submit), and those its wait needs too.
_TLS = ("ca_cert", "insecure_skip_tls_verify")
SUBMIT_OPTIONS = {
    "kfp": ("host", "token", "namespace", "experiment", "package_path", "service_account", "pod_namespace", *_TLS),
    "argo": ("host", "token", "namespace", "workflow_path", "service_account", *_TLS),
    "mlflow": ("project_dir", "image", "project_dir_in_image", "namespace", "kubeconfig", "context",
               "cluster_tracking_uri", *_TLS),
}
WAIT_OPTIONS = {"kfp": ("host", "token", "namespace", *_TLS), "argo": ("host", "token", "namespace", *_TLS),
                "mlflow": ("kubeconfig", "context", "namespace", *_TLS)}
K8S_OPTIONS = ("host", "token", "token_file", "ca_cert", "verify_ssl", "kubeconfig", "context")


# --------------------------------------------------------------------------- GPU type from the node

# ``nvidia.com/gpu.product`` (GPU feature discovery: the NVML device name with spaces as '-')
# -> the price table's GPU type. Only products whose price the table means: an H100 PCIe or NVL,
# an A100 PCIe are other products at other prices, and stay unknown.
GPU_PRODUCTS = {
    "NVIDIA-H200": "nvidia-h200",
    "NVIDIA-H100-80GB-HBM3": "nvidia-h100-80gb",
    "NVIDIA-H100-SXM5-80GB": "nvidia-h100-80gb",
    "NVIDIA-A100-SXM4-80GB": "nvidia-a100-80gb",
    "NVIDIA-A100-SXM4-40GB": "nvidia-a100-40gb",
    "NVIDIA-L4": "nvidia-l4",
    "NVIDIA-A10G": "nvidia-a10g",
    "TESLA-T4": "nvidia-t4",
    "TESLA-V100-SXM2-16GB": "nvidia-v100",
}

# ``node.kubernetes.io/instance-type`` (full match, case-insensitive) -> (GPU type, provider).
INSTANCE_TYPES = (
    (r"p5en\.48xlarge|p5e\.48xlarge", "nvidia-h200", "aws"),
    (r"p5\.(4|48)xlarge", "nvidia-h100-80gb", "aws"),
    (r"p4de\.24xlarge", "nvidia-a100-80gb", "aws"),
    (r"p4d\.24xlarge", "nvidia-a100-40gb", "aws"),
    (r"g6\.\d*x?large", "nvidia-l4", "aws"),
    (r"g5\.\d*x?large", "nvidia-a10g", "aws"),
    (r"g4dn\.\d*x?large", "nvidia-t4", "aws"),
    (r"p3\.(2|8|16)xlarge", "nvidia-v100", "aws"),
    (r"a3-ultragpu-\d+g", "nvidia-h200", "gcp"),
    (r"a3-(high|mega|edge)gpu-\d+g", "nvidia-h100-80gb", "gcp"),
    (r"a2-ultragpu-\d+g", "nvidia-a100-80gb", "gcp"),
    (r"a2-(high|mega)gpu-\d+g", "nvidia-a100-40gb", "gcp"),
    (r"g2-standard-\d+", "nvidia-l4", "gcp"),
    (r"standard_nd96isr_h100_v5", "nvidia-h100-80gb", "azure"),
    (r"standard_nd96amsr_a100_v4", "nvidia-a100-80gb", "azure"),
    (r"standard_nd96asr_v4", "nvidia-a100-40gb", "azure"),
    (r"standard_nc\d+as_t4_v3", "nvidia-t4", "azure"),
)


def normalize_product(product: str) -> str:
    """``nvidia.com/gpu.product`` without GFD's time-slicing suffix, upper case."""
    text = re.sub(r"[\s_]+", "-", product.strip()).upper()
    return text.removesuffix("-SHARED")


def gpu_type_for_product(product: str | None) -> str | None:
    """The price table's GPU type for a node's ``nvidia.com/gpu.product``, or None when unknown.

    A MIG slice (``...-MIG-1g.10gb``) is not a whole GPU: unknown.
    """
    if not product:
        return None
    key = normalize_product(product)
    if "-MIG-" in key:
        return None
    return GPU_PRODUCTS.get(key)


def gpu_type_for_instance(instance_type: str | None) -> tuple[str, str] | None:
    """(GPU type, provider) for a node's instance type, or None when it is not a known GPU instance."""
    if not instance_type:
        return None
    for pattern, gpu_type, provider in INSTANCE_TYPES:
        if re.fullmatch(pattern, instance_type.strip(), flags=re.IGNORECASE):
            return gpu_type, provider
    for entry in cost.shipped_table():  # the table's own instances, exactly as written there
        if str(entry.get("instance", "")).lower() == instance_type.strip().lower():
            return entry["gpu"], entry.get("provider", "")
    return None


def provider_for_instance(instance_type: str | None) -> str | None:
    found = gpu_type_for_instance(instance_type)
    return found[1] if found else None


@dataclass(frozen=True)
class NodeGpu:
    """What GPU a run trained on, and how we know."""

    gpu_type: str | None
    provider: str | None
    source: str
    gpu_product: str | None = None
    instance_type: str | None = None


def node_gpu(row: Mapping[str, Any] | None, spec_gpu_type: str | None) -> NodeGpu:
    """The GPU type of the finetune pod's node (row from the watcher), else the spec's."""
    product = (row or {}).get("gpu_product")
    instance = (row or {}).get("instance_type")
    provider = provider_for_instance(instance)
    mapped = gpu_type_for_product(product)
    if mapped:
        return NodeGpu(mapped, provider, f"node nvidia.com/gpu.product={product}", product, instance)
    if product and "-MIG-" not in normalize_product(product):
        # A GPU the table does not price: under its own name, so a price file or flag can price it.
        return NodeGpu(normalize_product(product).lower(), provider, f"node nvidia.com/gpu.product={product}",
                       product, instance)
    by_instance = gpu_type_for_instance(instance)
    if by_instance and not product:
        return NodeGpu(by_instance[0], by_instance[1], f"node instance type {instance}", product, instance)
    if product:  # MIG
        return NodeGpu(None, provider, f"node nvidia.com/gpu.product={product} (MIG slice: no per-GPU price)",
                       product, instance)
    return NodeGpu(spec_gpu_type, None, "pipeline spec", product, instance)


def resolve_node_price(gpu: NodeGpu, *, flag: Any = None, price_file: str | None = None) -> cost.Price | None:
    """The price per GPU-hour of the node's GPU (flag, env, price file, shipped table; see cost).

    The provider comes from ``LLMPACK_PRICE_PROVIDER`` when set, else from the node's instance
    type; a provider the table has no entry for falls back to the table's default provider.
    """
    if not gpu.gpu_type:
        return None
    provider = None if os.environ.get(settings.PRICE_PROVIDER.name) else gpu.provider
    price = cost.resolve_price(gpu.gpu_type, flag=flag, price_file=price_file, provider=provider)
    if price is None and provider:
        price = cost.resolve_price(gpu.gpu_type, flag=flag, price_file=price_file)
    return price


# --------------------------------------------------------------------------- metrics and cost


def _row_billed_s(row: Mapping[str, Any]) -> float | None:
    start, end = row.get("container_started"), row.get("finished")
    if start is None or end is None:
        return None
    billed = end - start
    created, ready = row.get("created"), row.get("node_ready")
    if created is not None and ready is not None and ready > created:
        billed += ready - created
    return billed


def fused_tasks(pipe: Any) -> dict[str, tuple[str, ...]]:
    """Each fused task of a compiled pipeline (``llmpack compile --fuse``) -> the authored steps its
    one pod runs, in order: ``{"finetune-evaluate": ("finetune", "evaluate")}``."""
    from components.fusion import FusedStep

    return {t.name: tuple(m.task for m in t.step.members) for t in pipe.tasks.values() if isinstance(t.step, FusedStep)}


def pod_step_aliases(fused: Mapping[str, tuple[str, ...]]) -> dict[str, str]:
    """Whose spin-up a pod's phases are (:func:`~llmpack.k8s.podphases.to_step_records`): the MLflow
    Job's ``main`` pod and a fused pod that trains count as ``finetune``'s, the way one pod that
    runs the training step starts it; a fused pod that does not train, as its first member's."""
    from llmpack.k8s.podphases import DEFAULT_STEP_ALIASES

    out = dict(DEFAULT_STEP_ALIASES)
    for task, members in fused.items():
        out[task] = telemetry.TRAIN_STEP if telemetry.TRAIN_STEP in members else members[0]
    return out


def pod_gpus_by_step(uses: Iterable[cost.GpuUse], fused: Mapping[str, tuple[str, ...]] | None = None) -> dict[str, int]:
    """GPUs by the ``llmpack.io/step`` a pod carries: each step's, and a fused task's (its members share its pod)."""
    gpus = {u.step: u.gpus for u in uses}
    for task, members in (fused or {}).items():
        gpus[task] = max((gpus.get(m, 0) for m in members), default=0)
    return gpus


def cluster_cost(
    steps: Mapping[str, telemetry.StepTimes],
    rows: Iterable[Mapping[str, Any]],
    uses: list[cost.GpuUse],
    orchestrator: str,
    price: cost.Price | None,
    gang: tuple[int, int] | None = None,
    fused: Mapping[str, tuple[str, ...]] | None = None,
) -> dict[str, float | None]:
    """gpu_hours, cost_usd, usd_per_1m_tokens, goodput from the run's GPU pods (see the module doc).

    ``gang`` (nodes, GPUs per node): finetune is a TrainJob gang; ``uses`` are the compiled
    pipeline's (its launcher holds no GPU), each gang pod bills its own GPUs. ``fused``
    (:func:`fused_tasks`): a fused pod bills its GPUs once for all of its member steps.
    """
    rows = list(rows)
    fused = fused or {}
    gpus_by_step = pod_gpus_by_step(uses, fused)
    job_gpus = max(gpus_by_step.values(), default=0)
    gpu_seconds, retry_seconds, billed_steps = 0.0, 0.0, set()
    attempts = pod_attempts(rows)
    retried = 0
    for row in rows:
        if row.get("role") == "driver":
            continue
        step = row.get("step")
        was_retried = not attempts.get(id(row), (0, True))[1]
        retried += was_retried
        if row.get("gang"):
            gpus, covers = _pod_gpus(row, gpus_by_step, gang), {step}
        elif orchestrator == "mlflow" and step == "main":
            gpus, covers = job_gpus, {s for s, g in gpus_by_step.items() if g > 0}
        elif step in fused:
            gpus, covers = gpus_by_step[step], set(fused[step])
        else:
            gpus, covers = gpus_by_step.get(step or "", 0), {step}
        billed = _row_billed_s(row) if gpus > 0 else None
        if billed is None:
            continue
        gpu_seconds += gpus * billed
        retry_seconds += gpus * billed if was_retried else 0.0
        billed_steps |= covers
    for use in uses:
        if use.gpus > 0 and use.step not in billed_steps and use.step in steps:
            retried += len(steps[use.step].retried)
            for attempt in steps[use.step].all_attempts:
                billed = cost.billed_seconds(attempt)
                if billed is not None:
                    gpu_seconds += use.gpus * billed
                    retry_seconds += use.gpus * billed if attempt in steps[use.step].retried else 0.0
    train = steps.get(telemetry.TRAIN_STEP)
    train_s = train.metrics.get("train_s") if train else None
    tokens = train.metrics.get("train_tokens") if train else None
    train_gpus = gang[0] * gang[1] if gang else gpus_by_step.get(telemetry.TRAIN_STEP, 0)
    usd = None if price is None else gpu_seconds * price.per_gpu_hour / 3600.0
    return {
        "gpu_hours": gpu_seconds / 3600.0,
        "cost_usd": usd,
        "usd_per_1m_tokens": None if usd is None or not tokens else usd / tokens * 1e6,
        "goodput": None if not gpu_seconds or train_s is None else train_s * train_gpus / gpu_seconds,
        "retries": float(retried),
        "retry_gpu_hours": retry_seconds / 3600.0,
        "retry_cost_usd": None if price is None else retry_seconds * price.per_gpu_hour / 3600.0,
    }


def pod_attempts(rows: Iterable[Mapping[str, Any]]) -> dict[int, tuple[int, bool]]:
    """Per executor pod row (by ``id``): its attempt (the step's pods numbered by creation, as
    :func:`~llmpack.k8s.podphases.to_step_records` numbers them) and whether it is the step's last.
    A TrainJob's node pods (``gang``) are not attempts: they are left out (never retries)."""
    by_step: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        if row.get("role") != "driver" and row.get("step") and not row.get("gang"):
            by_step.setdefault(row["step"], []).append(row)
    out: dict[int, tuple[int, bool]] = {}
    for mine in by_step.values():
        mine.sort(key=lambda r: (math.inf if r.get("created") is None else float(r["created"]), str(r.get("pod") or "")))
        for n, row in enumerate(mine):
            out[id(row)] = (n, n == len(mine) - 1)
    return out


def retried_pods(rows: Iterable[Mapping[str, Any]], uses: list[cost.GpuUse], orchestrator: str,
                 price: cost.Price | None, fused: Mapping[str, tuple[str, ...]] | None = None) -> list[dict[str, Any]]:
    """The run's retried attempts on the cluster: every executor pod but each step's last, with its
    container time, GPU-hours and cost (the shape of ``components.record.retried_attempts``)."""
    rows = list(rows)
    gpus_by_step = pod_gpus_by_step(uses, fused)
    attempts = pod_attempts(rows)
    out = []
    for row in rows:
        attempt, last = attempts.get(id(row), (0, True))
        if last:
            continue
        gpus = _pod_gpus(row, gpus_by_step)
        billed = _row_billed_s(row)
        hours = gpus * (billed or 0.0) / 3600.0
        out.append({"step": row["step"], "attempt": attempt, "billed_s": billed, "gpu_hours": hours,
                    "cost_usd": None if price is None else hours * price.per_gpu_hour, "pod": row.get("pod")})
    return sorted(out, key=lambda a: (a["step"], a["attempt"]))


def _pod_gpus(row: Mapping[str, Any], gpus_by_step: Mapping[str, int], gang: tuple[int, int] | None = None) -> int:
    """GPUs a pod row holds: its step's; the MLflow Job's one pod, the largest step's; a TrainJob
    node pod its own (``llmpack.io/gpu-count``, else the gang's GPUs per node)."""
    if row.get("role") == "driver":
        return 0
    if row.get("gang"):
        return int(row.get("gang_gpus") or (gang[1] if gang else 0))
    if row.get("orchestrator") == "mlflow" and row.get("step") == "main":
        return max(gpus_by_step.values(), default=0)
    return gpus_by_step.get(row.get("step") or "", 0)


def pod_spans(rows: Iterable[Mapping[str, Any]], gpus_by_step: Mapping[str, int],
              gang: tuple[int, int] | None = None) -> list[cost.PodSpan]:
    """The GPU pods among watcher rows (one per pod, by namespace and name), for node billing."""
    seen: dict[tuple[str, str], cost.PodSpan] = {}
    for row in rows:
        gpus = _pod_gpus(row, gpus_by_step, gang)
        if gpus <= 0 or not row.get("node") or not row.get("pipeline_run"):
            continue
        seen[(row.get("namespace") or "", row["pod"])] = cost.PodSpan(
            run=row["pipeline_run"], node=row["node"], gpus=gpus, created=row.get("created"),
            scheduled=row.get("scheduled"), started=row.get("container_started"), finished=row.get("finished"))
    return list(seen.values())


def node_spans(facts: Iterable[Mapping[str, Any]], pods: Iterable[cost.PodSpan]) -> dict[str, cost.NodeSpan]:
    """Nodes from the watchers' :meth:`~llmpack.k8s.watcher.PodWatcher.nodes`, several views merged
    (a removal any of them saw counts); GPU count unknown: the largest GPU request of its pods."""
    largest: dict[str, int] = {}
    for p in pods:
        largest[p.node] = max(largest.get(p.node, 0), p.gpus)
    merged: dict[str, dict[str, Any]] = {}
    for f in facts:
        name = f.get("name")
        if not name:
            continue
        have = merged.setdefault(name, dict(f))
        for key in ("gpus", "created", "ready", "removed"):
            if have.get(key) is None and f.get(key) is not None:
                have[key] = f[key]
    return {name: cost.NodeSpan(name=name, gpus=int(f.get("gpus") or largest.get(name, 0)), created=f.get("created"),
                                ready=f.get("ready"), removed=f.get("removed"))
            for name, f in merged.items()}


def _compute_gpu_seconds(events: Mapping[str, Mapping[str, float]], gpus_by_step: Mapping[str, int]) -> float:
    """GPU-seconds the GPU steps spent training or evaluating: ``model_loaded`` to ``finished``."""
    total = 0.0
    for step, gpus in gpus_by_step.items():
        ev = events.get(step) or {}
        if gpus > 0 and "model_loaded" in ev and "finished" in ev:
            total += gpus * max(0.0, ev["finished"] - ev["model_loaded"])
    return total


def node_cost(
    bill: cost.NodeBill,
    events: Mapping[str, Mapping[str, float]],
    gpus_by_step: Mapping[str, int],
    per_gpu_hour: float | None,
    *,
    train_s: float | None,
    train_tokens: float | None,
) -> dict[str, float | None]:
    """The node-billed metrics of one run (see the module doc); costs None when the price is unknown."""
    node_s = bill.gpu_seconds
    usd = None if per_gpu_hour is None else node_s * per_gpu_hour / 3600.0
    compute = None if usd is None else min(usd, _compute_gpu_seconds(events, gpus_by_step) * per_gpu_hour / 3600.0)
    train_gpus = gpus_by_step.get(telemetry.TRAIN_STEP, 0)
    return {
        "node_gpu_hours": node_s / 3600.0,
        "node_tail_gpus": bill.tail_gpus,
        "cost_usd": usd,
        "cost_compute_usd": compute,
        "cost_overhead_usd": None if usd is None or compute is None else usd - compute,
        "usd_per_1m_tokens": None if usd is None or not train_tokens else usd / train_tokens * 1e6,
        "goodput": None if not node_s or train_s is None else train_s * train_gpus / node_s,
    }


def _price_of(tags: Mapping[str, str]) -> float | None:
    try:
        return float(tags.get("llmpack.price_per_gpu_hour", ""))
    except ValueError:
        return None


def rebill(runs: list[dict[str, Any]], scale_down_delay_s: float) -> list[dict[str, Any]]:
    """``llmpack report --scale-down-delay-s``: node-billed runs re-billed with another delay, in place.

    Billed seconds are linear in the delay (it is added once per node whose removal was not
    seen), so ``node_gpu_hours`` moves by ``node_tail_gpus x (new - old delay)``; the compute
    part stays, the overhead takes the difference.
    """
    check_scale_down_delay(scale_down_delay_s, "--scale-down-delay-s")
    for run in runs:
        m, tags = run["metrics"], run["tags"]
        if tags.get("llmpack.cost_basis") != "node" or m.get("node_gpu_hours") is None:
            continue
        try:
            old = float(tags.get("llmpack.scale_down_delay_s", ""))
        except ValueError:
            continue
        node_h = m["node_gpu_hours"] + (m.get("node_tail_gpus") or 0.0) * (scale_down_delay_s - old) / 3600.0
        price = _price_of(tags)
        usd = None if price is None else node_h * price
        if usd is not None and m.get("cost_usd"):
            if m.get("usd_per_1m_tokens") is not None:
                m["usd_per_1m_tokens"] = m["usd_per_1m_tokens"] * usd / m["cost_usd"]
        if m.get("goodput") is not None and node_h > 0:
            m["goodput"] = m["goodput"] * m["node_gpu_hours"] / node_h
        m["node_gpu_hours"] = node_h
        if usd is not None:
            m["cost_usd"] = usd
            if m.get("cost_compute_usd") is not None:
                m["cost_compute_usd"] = min(usd, m["cost_compute_usd"])
                m["cost_overhead_usd"] = usd - m["cost_compute_usd"]
        tags["llmpack.scale_down_delay_s"] = f"{scale_down_delay_s:g}"
    return runs


def check_scale_down_delay(value: Any, flag: str) -> float:
    """Seconds >= 0, finite; else a one-line error naming the flag."""
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise InputError(f"{flag} {value!r}: not a number of seconds") from None
    if not (math.isfinite(seconds) and seconds >= 0):
        raise InputError(f"{flag} {value!r}: must be a finite number of seconds >= 0")
    return seconds


def gang_ready(rows: Iterable[Mapping[str, Any]]) -> float | None:
    """When the run's (last) TrainJob gang was all up: its last node pod's container start.

    None when the run has no gang, or a node pod of it never started. Several gangs (a retried
    launcher made another TrainJob): the last-created one's.
    """
    gangs: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        if row.get("gang") and row.get("role") != "driver":
            gangs.setdefault(row["gang"], []).append(row)
    if not gangs:
        return None
    last = max(gangs.values(), key=lambda g: min((r.get("created") or 0.0) for r in g))
    starts = [r.get("container_started") for r in last]
    return None if any(s is None for s in starts) else max(starts)


def run_end(steps: Mapping[str, telemetry.StepTimes], rows: Iterable[Mapping[str, Any]], fallback: float | None) -> float | None:
    """The last timestamped moment of the run: a pod's container finish or a step's ``finished``."""
    ends = [s.events["finished"] for s in steps.values() if "finished" in s.events]
    ends += [r["finished"] for r in rows if r.get("finished") is not None]
    return max(ends) if ends else fallback


def _mine(rows: Iterable[Mapping[str, Any]], pipeline_run: str) -> list[dict[str, Any]]:
    return [dict(r) for r in rows if r.get("pipeline_run") == pipeline_run]


def describe(rows: list[dict[str, Any]]) -> str:
    """One progress line from a run's pods: the newest step pod's state and steps done."""
    pods = [r for r in rows if r.get("role") != "driver"]
    if not pods:
        return "waiting for pods"
    done = {r["step"] for r in pods if r.get("phase") == "Succeeded"}
    latest = max(pods, key=lambda r: r.get("created") or 0.0)
    step = latest.get("step") or latest["pod"]
    if latest.get("phase") in ("Succeeded", "Failed"):
        state = "done" if latest["phase"] == "Succeeded" else "failed"
    elif latest.get("container_started") is not None:
        state = "running"
    elif latest.get("scheduled") is not None:
        state = "starting (image pull, init)"
    else:
        state = "queued (waiting for a node)"
    return f"{step} · {state} · {len(done)} steps done"


# --------------------------------------------------------------------------- the comparison


@dataclass
class _Plan:
    orchestrator: str
    label: str
    pipeline_run: str
    fuse: str = "none"  # the packaging (components.fusion) this run submits


@dataclass
class _Session:
    run_group: str
    values: dict[str, Any]
    conf: dict[str, dict[str, Any]]
    k8s: dict[str, Any]
    uri: str
    price_flag: Any
    price_file: str | None
    timeout_s: float
    poll_s: float
    progress: Progress | None
    pipe: Any  # the pipeline as authored (sized by --gpus/--nodes), unfused
    scale_down_delay_s: float = cost.DEFAULT_SCALE_DOWN_DELAY_S
    gang: tuple[int, int] | None = None  # finetune as a TrainJob: (nodes, GPUs per node)
    pipes: dict[str, Any] = field(default_factory=dict)  # fuse mode -> that variant's compiled pipeline
    artifacts: dict[str, dict[str, str]] = field(default_factory=dict)  # fuse mode -> orchestrator -> compiled file
    submit_lock: threading.Lock = field(default_factory=threading.Lock)

    def pipe_of(self, fuse: str) -> Any:
        return self.pipes.get(fuse, self.pipe)

    def pod_uses(self, fuse: str = "none") -> list[cost.GpuUse]:
        """What each authored step's pod holds (a gang's launcher: no GPU; a fused pod's members: its GPUs)."""
        from components.record.close import gpu_uses

        return gpu_uses(self.pipe_of(fuse))

    def step_uses(self, fuse: str = "none") -> list[cost.GpuUse]:
        """What each step holds: finetune as a gang holds nodes x GPUs per node."""
        from dataclasses import replace

        if self.gang is None:
            return self.pod_uses(fuse)
        total = self.gang[0] * self.gang[1]
        return [replace(u, gpus=total) if u.step == telemetry.TRAIN_STEP else u for u in self.pod_uses(fuse)]

    def pod_gpus(self, fuse: str) -> dict[str, int]:
        """GPUs by a pod's ``llmpack.io/step`` in this variant (:func:`pod_gpus_by_step`)."""
        return pod_gpus_by_step(self.pod_uses(fuse), fused_tasks(self.pipe_of(fuse)))

    # ------------------------------------------------------------------ helpers

    def notify(self, label: str, message: str, t0: float) -> None:
        if self.progress is not None:
            with contextlib.suppress(Exception):  # a display error must not lose a run
                self.progress(label, message, time.monotonic() - t0)

    def pod_namespace(self, orch: str) -> str:
        conf = self.conf[orch]
        if orch == "kfp":
            return conf.get("pod_namespace") or conf.get("namespace") or DEFAULT_KFP_POD_NAMESPACE
        if orch == "argo":
            return conf.get("namespace") or os.environ.get("ARGO_NAMESPACE") or DEFAULT_NAMESPACE
        return conf.get("namespace") or DEFAULT_NAMESPACE

    def api_client(self) -> Any:
        from llmpack.k8s.watcher import build_api_client

        return build_api_client(**self.k8s)

    def start_watcher(self, namespace: str, kfp_runs: Mapping[str, str] | None = None) -> Any:
        from llmpack.k8s.watcher import PodWatcher

        api_client = self.api_client()
        try:
            watcher = PodWatcher(api_client, namespace, self.run_group, kfp_runs=dict(kfp_runs or {}),
                                 window_s=max(1, int(min(60.0, self.timeout_s))))
            return watcher.start(timeout_s=self.timeout_s + 120.0)
        except BaseException:
            api_client.close()
            raise

    # ------------------------------------------------------------------ one run

    def secrets(self) -> tuple[str, ...]:
        values = [c.get("token") for c in self.conf.values()] + [self.k8s.get("token")]
        return tuple(str(v) for v in values if v)

    def run(self, plan: _Plan) -> dict[str, Any]:
        """One run, start to end; whatever goes wrong, a record (failed, with one line) comes back."""
        from components.servers.remote import one_line

        t0 = time.monotonic()
        try:
            return self._run(plan, t0)
        except Exception as exc:  # noqa: BLE001 - one path's surprise must not lose the others
            error = one_line(f"{type(exc).__name__}: {exc}", self.secrets())
            self.notify(plan.label, f"failed: {error}", t0)
            return {**self._blank(plan), "error": error,
                    "tags": {**self._blank(plan)["tags"], "llmpack.status": "failed", "llmpack.error": error}}

    def _blank(self, plan: _Plan) -> dict[str, Any]:
        from components.fusion import FUSE_TAG

        return {
            "run_group": self.run_group,
            "pipeline_run": plan.pipeline_run,
            "orchestrator": plan.orchestrator,
            "fuse": plan.fuse,
            "mode": MODE,
            "status": "failed",
            "error": None,
            "failed_step": None,
            "submitted_at": None,
            "finished_at": None,
            "state": None,
            "metrics": {},
            "tags": {"llmpack.run_group": self.run_group, "llmpack.pipeline_run": plan.pipeline_run,
                     "llmpack.orchestrator": plan.orchestrator, "llmpack.mode": MODE, FUSE_TAG: plan.fuse},
            "events": {},
            "artifacts": {},
            "pods": [],
            "warnings": [],
        }

    def _run(self, plan: _Plan, t0: float) -> dict[str, Any]:
        live: list[Any] = []  # watchers started and not finished yet: finished whatever happens
        try:
            return self._run_watched(plan, t0, live)
        finally:
            for watcher in live:
                with contextlib.suppress(Exception):
                    watcher.finish(5.0)
                with contextlib.suppress(Exception):
                    watcher.api_client.close()

    def _run_watched(self, plan: _Plan, t0: float, live: list[Any]) -> dict[str, Any]:
        from llmpack import submit

        orch = plan.orchestrator
        conf = self.conf[orch]
        record = self._blank(plan)
        watcher = None
        self.notify(plan.label, "submitting", t0)
        if orch != "kfp":  # Argo and MLflow pods carry the run group: watch before they exist
            watcher = self._safe_start(self.pod_namespace(orch), None, record, live)
        try:
            kwargs = {k: v for k, v in conf.items() if k != "pod_namespace"}
            if orch in self.artifacts.get(plan.fuse, {}):  # this variant's compiled file
                kwargs[ARTIFACT_OPTIONS[orch]] = self.artifacts[plan.fuse][orch]
            with self.submit_lock:  # client libraries swap sys.stdout while they construct
                summary = submit.submit(orch, params=self.values, run_group=self.run_group,
                                        pipeline_run=plan.pipeline_run, tracking_uri=self.uri,
                                        price_per_gpu_hour=self.price_flag, price_file=self.price_file, **kwargs)
        except InputError as exc:
            record["error"] = str(exc)
            record["tags"].update({"llmpack.status": "failed", "llmpack.error": str(exc)})
            self._stop(watcher, record, live)
            self.notify(plan.label, f"failed: {exc}", t0)
            return record

        record["submitted_at"] = summary["submitted_at"]
        record["warnings"] += list(summary.get("warnings") or ())
        record["artifacts"] = {k: summary[k] for k in ("server_id", "url", "namespace", "mlflow_run_id", "tracking_uri")
                               if summary.get(k) is not None}
        if orch == "kfp":  # KFP pods carry only KFP's run id, known now (the first list finds what exists)
            watcher = self._safe_start(self.pod_namespace(orch), {summary["run_id"]: plan.pipeline_run}, record, live)
        elif summary.get("namespace") and watcher is not None and summary["namespace"] != watcher.namespace:
            self._stop(watcher, record, live)
            watcher = self._safe_start(summary["namespace"], None, record, live)
        self.notify(plan.label, "submitted", t0)

        stop_progress = threading.Event()
        ticker = None
        if self.progress is not None and watcher is not None:
            ticker = threading.Thread(target=self._tick, args=(plan, watcher, t0, stop_progress), daemon=True)
            ticker.start()
        wait_kwargs = {k: conf[k] for k in WAIT_OPTIONS[orch] if conf.get(k) is not None}
        try:
            result = submit.wait_for_completion(summary, timeout_s=self.timeout_s, poll_s=self.poll_s, **wait_kwargs)
        except InputError as exc:
            result = {"status": "error", "state": "unknown", "error": str(exc)}
        finally:
            stop_progress.set()
            if ticker is not None:
                ticker.join(5.0)
        rows = self._stop(watcher, record, live)
        self._measure(plan, summary, result, rows, record)
        mark = "succeeded" if record["status"] == "succeeded" else f"failed: {record['error']}"
        self.notify(plan.label, mark, t0)
        return record

    def _safe_start(self, namespace: str, kfp_runs: Mapping[str, str] | None, record: dict[str, Any],
                    live: list[Any]) -> Any:
        """A started watcher, or None with a warning (the run is still measured from its own events)."""
        try:
            watcher = self.start_watcher(namespace, kfp_runs)
        except InputError as exc:
            record["warnings"].append(f"pod watcher: {exc}")
            return None
        live.append(watcher)
        return watcher

    def _stop(self, watcher: Any, record: dict[str, Any], live: list[Any]) -> list[dict[str, Any]]:
        if watcher is None:
            return []
        with contextlib.suppress(ValueError):
            live.remove(watcher)
        try:
            rows = watcher.finish()
        except Exception as exc:  # noqa: BLE001 - the run's own events still count
            record["warnings"].append(f"pod watcher: {exc}")
            return []
        finally:
            with contextlib.suppress(Exception):
                watcher.api_client.close()
        record["warnings"] += [f"pod watcher: {w}" for w in watcher.warnings]
        record.setdefault("nodes", []).extend(watcher.nodes())
        return rows

    def _tick(self, plan: _Plan, watcher: Any, t0: float, stop: threading.Event) -> None:
        while not stop.wait(min(1.0, max(0.2, self.poll_s))):
            try:
                text = describe(_mine(watcher.rows(), plan.pipeline_run))
            except Exception:  # noqa: BLE001 - progress is best effort
                continue
            self.notify(plan.label, text, t0)

    def _kueue_waits(self, rows: list[dict[str, Any]], record: dict[str, Any]) -> dict[str, float | None]:
        """Quota wait and admission checks of the run's TrainJob from its Kueue Workload (llmpack.k8s.kueue)."""
        from llmpack.k8s import kueue

        gang_rows = sorted((r for r in rows if r.get("gang")), key=lambda r: r.get("created") or 0.0)
        if not gang_rows:
            return kueue.waits(None)
        last = gang_rows[-1]  # a retried launcher's newer TrainJob is the one that trained
        api_client = self.api_client()
        try:
            return kueue.waits(kueue.find_workload(api_client, last.get("namespace") or "default", last["gang"]))
        except Exception as exc:  # noqa: BLE001 - the pods are still measured
            record["warnings"].append(f"Kueue Workload of TrainJob {last['gang']}: {type(exc).__name__}: {exc}")
            return kueue.waits(None)
        finally:
            api_client.close()

    def _measure(self, plan: _Plan, summary: Mapping[str, Any], result: Mapping[str, Any],
                 rows: list[dict[str, Any]], record: dict[str, Any]) -> None:
        from components.fusion import FUSE_TAG
        from llmpack.k8s.podphases import to_step_records

        orch = plan.orchestrator
        pipe = self.pipe_of(plan.fuse)
        fused = fused_tasks(pipe)
        ctx = telemetry.RunContext(run_group=self.run_group, pipeline_run=plan.pipeline_run, orchestrator=orch,
                                   mode=MODE, submitted_at=float(summary["submitted_at"]))
        mine = _mine(rows, plan.pipeline_run)
        k8s_records = to_step_records(mine, ctx, aliases=pod_step_aliases(fused))
        status = "succeeded" if result.get("status") == "succeeded" else "failed"
        error = None
        if status != "succeeded":
            if result.get("status") == "timeout":
                error = f"did not finish within {self.timeout_s:g} s (last state {result.get('state')})"
            else:
                error = result.get("error") or f"{orch} run ended {result.get('state') or result.get('status')}"
        failed = sorted((r for r in mine if r.get("phase") == "Failed" and r.get("role") != "driver"),
                        key=lambda r: r.get("created") or 0.0)

        records = list(k8s_records)
        mc, run_id = None, summary.get("mlflow_run_id")
        try:
            mc = tracking.client(self.uri)
            if run_id is None:
                run_id = tracking.open_pipeline_run(mc, ctx)
            tracking.log_records(mc, run_id, k8s_records)
            records = tracking.records_from_run(mc.get_run(run_id).data.metrics, ctx)
        except Exception as exc:  # noqa: BLE001 - the pod events are still reported
            record["warnings"].append(f"MLflow at {self.uri}: {type(exc).__name__}: {exc}")

        steps = telemetry.group_by_step(records)
        if mc is not None and mine and not any("process_started" in st.events for st in steps.values()):
            record["warnings"].append(
                f"no step events in MLflow at {self.uri}: do the steps log to this tracking server "
                "(Secret llmpack-mlflow, key tracking-uri)? Only the pod phases are measured"
            )
        end = run_end(steps, mine, result.get("finished_at"))
        uses = self.pod_uses(plan.fuse)
        step_uses = self.step_uses(plan.fuse)
        trains = {telemetry.TRAIN_STEP, "main", *(t for t, members in fused.items() if telemetry.TRAIN_STEP in members)}
        finetune_rows = [r for r in mine if r.get("step") in trains and r.get("role") != "driver"]
        finetune_rows = [r for r in finetune_rows if r.get("gang")] or finetune_rows  # the gang trains, not its launcher
        finetune_row = min(finetune_rows, key=lambda r: r.get("created") or 0.0) if finetune_rows else None
        spec_types = sorted({t.step.execution.resources.gpu_type for t in pipe.tasks.values()
                             if t.step.execution.resources.gpus > 0})
        gpu = node_gpu(finetune_row, spec_types[0] if spec_types else None)
        price = resolve_node_price(gpu, flag=self.price_flag, price_file=self.price_file)

        metrics = telemetry.derive_metrics(steps, submitted_at=ctx.submitted_at, finished_at=end)
        metrics.update(cluster_cost(steps, mine, uses, orch, price, gang=self.gang, fused=fused))
        if self.gang is not None:
            ready = gang_ready(mine)
            metrics["gang_ready_s"] = None if ready is None else ready - ctx.submitted_at
            metrics.update(self._kueue_waits(mine, record))
        pods = pod_spans(rows, pod_gpus_by_step(uses, fused), self.gang)
        bill = cost.bill_nodes(node_spans(record.get("nodes", ()), pods), pods,
                               scale_down_delay_s=self.scale_down_delay_s).get(plan.pipeline_run)
        if bill is not None:
            train = steps.get(telemetry.TRAIN_STEP)
            metrics.update(node_cost(bill, {s: st.events for s, st in steps.items()}, {u.step: u.gpus for u in step_uses},
                                     None if price is None else price.per_gpu_hour,
                                     train_s=train.metrics.get("train_s") if train else None,
                                     train_tokens=train.metrics.get("train_tokens") if train else None))
        metrics = {k: telemetry.clean_number(v) for k, v in metrics.items()}
        tags = {
            **ctx.tags(),
            **cost.cost_tags(step_uses, price),
            "llmpack.pipeline": pipe.name,
            FUSE_TAG: plan.fuse,
            "llmpack.gpu_type": gpu.gpu_type or "unknown",
            "llmpack.gpu_type_source": gpu.source,
            "llmpack.status": status,
            "llmpack.cost_basis": "node" if bill is not None else "container",
            "llmpack.scale_down_delay_s": f"{self.scale_down_delay_s:g}",
        }
        if gpu.gpu_product:
            tags["llmpack.gpu_product"] = gpu.gpu_product
        if gpu.instance_type:
            tags["llmpack.instance_type"] = gpu.instance_type
        if error:
            tags["llmpack.error"] = error[:4000]
        if mc is not None and run_id is not None:
            try:
                tracking.log_summary(mc, run_id, metrics, tags, params=self.values)
                mc.set_terminated(run_id, "FINISHED" if status == "succeeded" else "FAILED",
                                  end_time=int(end * 1000) if end else None)
            except Exception as exc:  # noqa: BLE001
                record["warnings"].append(f"MLflow summary logging failed ({type(exc).__name__})")

        record.update(
            status=status,
            error=error,
            failed_step=failed[0]["step"] if failed else None,
            finished_at=end,
            state=result.get("state"),
            metrics=metrics,
            tags=tags,
            events={step: dict(st.events) for step, st in steps.items() if st.events},
            retried_attempts=retried_pods(mine, uses, orch, price, fused),
            pods=mine,
        )
        if run_id is not None:
            record["artifacts"]["mlflow_run_id"] = run_id
            record["artifacts"]["tracking_uri"] = self.uri


def _bill_across_runs(session: _Session, runs: list[dict[str, Any]]) -> None:
    """Bill each node once over the whole comparison, in place (and in MLflow).

    Each run was billed from its own watcher's view. A node that a later run reused within the
    scale-down delay (or that runs shared, with ``concurrency`` > 1) was then billed twice
    over the overlap; billed over every run's pods together it is billed once and shared.
    """
    gpus_by_step: dict[str, int] = {}
    for fuse in {str(r.get("fuse") or "none") for r in runs}:  # a fused pod's name is no authored step's
        gpus_by_step.update(session.pod_gpus(fuse))
    pods = pod_spans((p for r in runs for p in r.get("pods") or ()), gpus_by_step, session.gang)
    facts = [f for r in runs for f in r.get("nodes") or ()]
    bills = cost.bill_nodes(node_spans(facts, pods), pods, scale_down_delay_s=session.scale_down_delay_s)
    for run in runs:
        m, tags = run.get("metrics") or {}, run.get("tags") or {}
        bill = bills.get(run["pipeline_run"])
        if bill is None or tags.get("llmpack.cost_basis") != "node":
            continue
        if math.isclose(bill.gpu_seconds / 3600.0, m.get("node_gpu_hours") or 0.0, rel_tol=1e-12, abs_tol=1e-12):
            continue
        old_usd, old_per_1m = m.get("cost_usd"), m.get("usd_per_1m_tokens")
        tokens = old_usd / old_per_1m * 1e6 if old_usd and old_per_1m else None
        step_gpus = {u.step: u.gpus for u in session.step_uses(str(run.get("fuse") or "none"))}
        new = node_cost(bill, run.get("events") or {}, step_gpus, _price_of(tags), train_s=m.get("train_s"),
                        train_tokens=tokens)
        new = {k: telemetry.clean_number(v) for k, v in new.items()}
        m.update({k: v for k, v in new.items() if v is not None or k in m})
        run_id = (run.get("artifacts") or {}).get("mlflow_run_id")
        if run_id is None:
            continue
        try:
            from mlflow.entities import Metric

            stamp = int(time.time() * 1000)  # later than the first summary (logged at 0): the latest value
            tracking.client(session.uri).log_batch(
                run_id, metrics=[Metric(k, float(v), stamp, 0) for k, v in new.items() if v is not None])
        except Exception as exc:  # noqa: BLE001 - the result still carries the figures
            run.setdefault("warnings", []).append(f"MLflow: node cost not updated ({type(exc).__name__})")


def _parse_backends(backends: Iterable[str] | str) -> list[str]:
    names = [b.strip() for b in backends.split(",")] if isinstance(backends, str) else [str(b).strip() for b in backends]
    names = [n for n in names if n]
    if not names:
        raise InputError("--backends: give at least one of " + ", ".join(ORCHESTRATORS))
    for name in names:
        if name not in ORCHESTRATORS:
            raise InputError(f"--backends: {name!r} cannot run on a cluster (choose from {', '.join(ORCHESTRATORS)})")
    return list(dict.fromkeys(names))


def _options(name: str, given: Mapping[str, Any] | None, allowed: Iterable[str]) -> dict[str, Any]:
    out = {k: v for k, v in dict(given or {}).items() if v is not None}
    unknown = sorted(set(out) - set(allowed))
    if unknown:
        raise InputError(f"{name} options: unknown {', '.join(unknown)} (known: {', '.join(allowed)})")
    return out


def _check_pod_access(api_client: Any, namespace: str) -> None:
    """The watcher's access, before anything is submitted: the namespace exists, pods can be listed."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from llmpack.k8s.watcher import api_error

    core = client.CoreV1Api(api_client)
    try:
        core.read_namespace(namespace, _request_timeout=15)
    except ApiException as exc:
        if exc.status == 404:
            raise InputError(f"namespace {namespace!r} not found on the Kubernetes API at "
                             f"{api_client.configuration.host}") from None
        if exc.status != 403:  # namespaced credentials often cannot read Namespace objects
            raise api_error(exc, api_client, f"read namespace {namespace!r}") from None
    except Exception as exc:  # noqa: BLE001 - unreachable: one line
        raise api_error(exc, api_client, f"read namespace {namespace!r}") from None
    try:
        core.list_namespaced_pod(namespace, limit=1, _request_timeout=15)
    except Exception as exc:  # noqa: BLE001
        raise api_error(exc, api_client, f"list pods in namespace {namespace!r}") from None


def _preflight(session: _Session, backends: list[str]) -> None:
    for orch in backends:
        cluster_submitter(orch).check_connection(session.conf[orch])
    api_client = session.api_client()
    try:
        for namespace in dict.fromkeys(session.pod_namespace(o) for o in backends):
            _check_pod_access(api_client, namespace)
    finally:
        api_client.close()


def compare_cluster(
    *,
    backends: Iterable[str] | str = ORCHESTRATORS,
    repeats: int = 1,
    concurrency: int = 1,
    params: Mapping[str, Any] | None = None,
    run_group: str | None = None,
    kfp: Mapping[str, Any] | None = None,
    argo: Mapping[str, Any] | None = None,
    mlflow: Mapping[str, Any] | None = None,
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
    variants: Iterable[str] | None = None,
) -> dict[str, Any]:
    """Submit every path ``repeats`` times to one cluster, wait, measure; the ``compare()`` result.

    ``variants``: fusion modes (``none``, ``gpu``, ``all``; :mod:`components.fusion`); each path
    is compiled in each (``llmpack compile --fuse``) into a temporary directory and submitted side
    by side, labelled ``argo``, ``argo+fuse-gpu``... A fused pod's phases are its training
    member's spin-up (:func:`pod_step_aliases`) and its GPUs are billed once for all its members.

    ``gpus`` / ``nodes``: the finetune step's GPUs per node and nodes (``llmpack compile --gpus
    --nodes``); with either, every path is compiled for it into a temporary directory
    (:func:`llmpack.compile.compile_all`) and that is what is submitted, instead of the
    committed artifacts. Above one node finetune is a Kubeflow Trainer TrainJob gang whose node
    pods and launcher share ``cache_pvc`` (default :data:`DEFAULT_GANG_PVC`, ReadWriteMany);
    its pods are one attempt, and ``gang_ready_s`` says when the last of them started.

    ``kfp`` / ``argo`` / ``mlflow``: each path's ``submit`` options (``<package>.submit``; ``host``,
    ``token``, ``namespace``... see :data:`SUBMIT_OPTIONS`; KFP's ``pod_namespace`` is where
    its pods run: default its profile ``namespace``, else ``kubeflow``). ``k8s``: how the pod
    watcher reaches the Kubernetes API (:func:`~llmpack.k8s.watcher.build_api_client` options;
    default the MLflow path's kubeconfig, else ``KUBECONFIG``/``~/.kube/config``/in-cluster).
    ``timeout_s``: how long to wait for each run (then it is failed, "did not finish"; it is not
    cancelled). ``poll_s``: how often the orchestrator is asked. ``progress(label, message,
    elapsed_s)`` is called from the worker threads: "submitting", "submitted", the pods' state
    ("finetune · queued (waiting for a node) · 2 steps done"), then "succeeded" or "failed: ...".
    ``scale_down_delay_s``: how long the autoscaler keeps an empty GPU node; billed after the
    last pod on a node whose removal the watcher did not see (see the module doc).
    """
    from components.fusion import check_mode
    from components.fusion import fuse as fuse_steps
    from components.servers.submission import check_id, connect_tracking, new_id, shipped_pipeline, user_parameters

    names = _parse_backends(backends)
    modes = list(dict.fromkeys(check_mode(m) for m in (variants or ["none"])))
    if not isinstance(repeats, int) or repeats < 1:
        raise InputError(f"--repeats {repeats}: must be at least 1")
    if not isinstance(concurrency, int) or concurrency < 1:
        raise InputError(f"--concurrency {concurrency}: must be at least 1")
    if not (timeout_s > 0 and math.isfinite(timeout_s)):
        raise InputError(f"--timeout {timeout_s}: must be a positive number of seconds")
    if not (poll_s > 0 and math.isfinite(poll_s)):
        raise InputError(f"--poll {poll_s}: must be a positive number of seconds")
    scale_down_delay_s = check_scale_down_delay(scale_down_delay_s, "--scale-down-delay-s")
    if price_per_gpu_hour is not None:
        cost.parse_price(price_per_gpu_hour, "--price-per-gpu-hour")
    if price_file is not None:
        cost.resolve_price("check", price_file=price_file, env={})  # reads and checks the file now
    pipe = shipped_pipeline()
    values = user_parameters(pipe, params)
    conf = {
        "kfp": _options("kfp", kfp, SUBMIT_OPTIONS["kfp"]),
        "argo": _options("argo", argo, SUBMIT_OPTIONS["argo"]),
        "mlflow": _options("mlflow", mlflow, SUBMIT_OPTIONS["mlflow"]),
    }
    gang = None
    compiled_dir = None
    if queue is not None and nodes is None:
        raise InputError(f"--queue {queue}: Kueue admits the finetune TrainJob; give --nodes 2 or more")
    if gpus is not None or nodes is not None:
        from llmpack.compile import check_cache_pvc, with_gpus

        if (nodes or 1) > 1:
            cache_pvc = cache_pvc or DEFAULT_GANG_PVC
        if cache_pvc is not None:
            check_cache_pvc(cache_pvc)
        pipe = with_gpus(pipe, gpus, nodes, claim=cache_pvc, queue=queue)  # checks --gpus/--nodes/--cache-pvc now
        if (nodes or 1) > 1:
            from components.process.gang import GangSpec

            spec = GangSpec.from_json(str(pipe.params["trainjob"].default), "--nodes")
            gang = (int(nodes or 1), int(spec.gpus_per_node))
    fused_modes = [m for m in modes if m != "none"]
    if fused_modes and ((gpus or 1) > 1 or (nodes or 1) > 1):
        raise InputError(f"--variants fuse-{fused_modes[0]} with --gpus {gpus or 1} --nodes {nodes or 1}: the many-process "
                         "finetune runs unfused; compare fused variants on one GPU")
    compile_here = gpus is not None or nodes is not None or bool(fused_modes)
    if compile_here:
        for orch, key in ARTIFACT_OPTIONS.items():
            if conf[orch].get(key):
                raise InputError(f"--gpus/--nodes/--variants compile the artifacts to submit: {orch} option {key} "
                                 "cannot be given too")
    pipes = {mode: fuse_steps(pipe, mode) for mode in modes}
    k8s_opts = _options("k8s", k8s, K8S_OPTIONS)
    if not k8s_opts.get("host") and not k8s_opts.get("kubeconfig") and conf["mlflow"].get("kubeconfig"):
        k8s_opts.setdefault("kubeconfig", conf["mlflow"]["kubeconfig"])
        if conf["mlflow"].get("context"):
            k8s_opts.setdefault("context", conf["mlflow"]["context"])
    group = check_id(run_group, "--run-group") if run_group else new_id("rg")
    uri = tracking.tracking_uri(tracking_uri)
    connect_tracking(uri)  # answers, before anything is submitted

    session = _Session(run_group=group, values=values, conf=conf, k8s=k8s_opts, uri=uri,
                       price_flag=price_per_gpu_hour, price_file=price_file, timeout_s=float(timeout_s),
                       poll_s=float(poll_s), progress=progress, pipe=pipe, scale_down_delay_s=scale_down_delay_s,
                       gang=gang, pipes=pipes)
    _preflight(session, names)
    if compile_here:
        import tempfile

        from llmpack.compile import compile_all

        compiled_dir = tempfile.mkdtemp(prefix="llmpack-compare-")
        for mode in modes:  # what `llmpack compile [--fuse MODE]` writes, a directory per variant
            out = os.path.join(compiled_dir, mode)
            compile_all(out, fuse=mode, gpus=gpus, nodes=nodes, cache_pvc=cache_pvc, queue=queue)
            session.artifacts[mode] = {orch: os.path.join(out, ARTIFACT_PATHS[orch]) for orch in ARTIFACT_OPTIONS}
    try:
        return _compare_all(session, names, modes, repeats, concurrency, group)
    finally:
        if compiled_dir is not None:
            import shutil

            shutil.rmtree(compiled_dir, ignore_errors=True)


def _compare_all(session: _Session, names: list[str], modes: list[str], repeats: int, concurrency: int,
                 group: str) -> dict[str, Any]:
    from components.fusion import path_label
    from components.servers.submission import new_id
    from llmpack.compare import comparison

    plans = []
    for i in range(repeats):  # interleaved: every path and variant once per round
        for mode in modes:
            for orch in names:
                name = path_label(orch, mode)
                label = f"{name} ({i + 1}/{repeats})" if repeats > 1 else name
                plans.append(_Plan(orchestrator=orch, label=label, pipeline_run=new_id(orch), fuse=mode))

    stdout = sys.stdout  # kfp/hera construction swaps sys.stdout; threads must not leave it swapped
    try:
        if concurrency == 1:
            runs = [session.run(plan) for plan in plans]
        else:
            with ThreadPoolExecutor(max_workers=min(concurrency, len(plans)), thread_name_prefix="llmpack-run") as pool:
                runs = list(pool.map(session.run, plans))
    finally:
        sys.stdout = stdout
    _bill_across_runs(session, runs)
    labels = [path_label(orch, mode) for mode in modes for orch in names]
    return comparison(group, labels, runs, repeats=repeats, concurrency=concurrency, mode=MODE)
