"""What a compiled file's pods ask for, read for ``--plan`` (:mod:`llmpack.cluster.plan.record`): the GPUs a pod
requests and the GPU type's nodes they are placed on, checked against what its closing task's ``--uses`` bill
(issue 46, rounds 26 and 27: a hand-edited request passed as the bill said).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from components.errors import InputError

WALK_LIMIT = 200_000  # the nodes a compiled file's walk may visit: more is refused, never let through


# A quantity of a sane size: up to 7 digits, a fraction, a small exponent or a suffix (m, k, Ki...).
_QUANTITY = re.compile(r"[0-9]{1,7}(\.[0-9]{1,6})?([eE][0-9]|[a-zA-Z]{1,2})?")


def _gpus(value: Any) -> int:
    """A GPU count as Kubernetes reads it (``8``, ``'8000m'``, ``'8e0'``); a value it cannot read is one line."""
    from kubernetes.utils import parse_quantity

    try:
        if isinstance(value, bool) or not _QUANTITY.fullmatch(str(value)):  # round 28: `1e2000000` took minutes
            raise ValueError
        amount = parse_quantity(value)
        if not amount.is_finite() or amount < 0:
            raise ValueError
        return int(amount.to_integral_value(rounding="ROUND_CEILING"))
    except (ValueError, TypeError, ArithmeticError):
        raise InputError(f"--plan: a GPU count {str(value)[:40]!r} in the compiled pods is not a number of GPUs; "
                         "not submitted") from None


def pod_claims(doc: Any) -> tuple[int, set[tuple[str, str, str]]]:
    """What the compiled pods themselves ask for: the most GPUs one pod spec requests (its containers', sidecars'
    and init containers' ``nvidia.com/gpu`` summed, or a KFP accelerator's ``resourceCount``/``count``) and every
    (node label, operator, value) placing them by GPU type. A ``podSpecPatch`` (pods changed at run time) or a
    file too large to walk is one line: what cannot be read is never taken as fitting (rounds 26, 27)."""
    from components.gpu_nodes import GKE_ACCELERATOR_LABEL, INSTANCE_TYPE_LABEL, KARPENTER_GPU_LABEL, PRODUCT_LABEL

    labels = (PRODUCT_LABEL, GKE_ACCELERATOR_LABEL, KARPENTER_GPU_LABEL, INSTANCE_TYPE_LABEL)
    most, placed, stack, seen = 0, set(), [doc], 0
    while stack:
        item, seen = stack.pop(), seen + 1
        if seen > WALK_LIMIT:
            raise InputError(f"--plan: the compiled file is too large to check ({WALK_LIMIT:,} nodes); not submitted")
        if isinstance(item, Mapping):
            if "podSpecPatch" in item:
                raise InputError("--plan: the compiled file patches its pods at run time (podSpecPatch): their GPUs "
                                 "cannot be checked; not submitted")
            if item.get("resourceType") == "nvidia.com/gpu" or item.get("type") == "nvidia.com/gpu":
                most = max(most, _gpus(item.get("resourceCount") or item.get("count") or 0))
            containers = [c for key in ("containers", "initContainers", "sidecars")
                          for c in (item.get(key) if isinstance(item.get(key), list) else [])]
            containers += [item[key] for key in ("container", "script") if isinstance(item.get(key), Mapping)]
            pod = sum(_gpus(_limits(c)) for c in containers if isinstance(c, Mapping))
            most = max(most, pod, _gpus(_limits(item)))  # an Argo template's main container with its sidecars
            if item.get("key") in labels:
                values = item.get("values") if isinstance(item.get("values"), list) else []
                placed |= {(str(item["key"]), str(item.get("operator")), str(v)) for v in values} or {
                    (str(item["key"]), str(item.get("operator")), "")}
            placed |= {(k, "In", str(item[k])) for k in labels if isinstance(item.get(k), str)}  # a nodeSelector
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return most, placed


def _limits(container: Mapping[str, Any]) -> Any:
    """A container's (or a template's) GPU request: its resources' limits, else requests; 0 when none."""
    resources = container.get("resources") if isinstance(container.get("resources"), Mapping) else {}
    for key in ("limits", "requests"):
        found = resources.get(key) if isinstance(resources.get(key), Mapping) else {}
        if found.get("nvidia.com/gpu") is not None:
            return found["nvidia.com/gpu"]
    return 0


def check_pods(artifact: str, compiled: Any, gpu_type: str | None, per_pod: int) -> None:
    """Refuse a file whose pods ask for more GPUs a pod than its ``--uses`` bill, or are not placed on the billed
    GPU type's nodes only (another type's label, a ``NotIn``/``DoesNotExist``, or no placement at all). An MLflow
    project's pods are its Job template's, which submit sends (round 27)."""
    from components import yamltext
    from components.gpu_nodes import (
        GKE_ACCELERATOR_LABEL,
        GPU_NODES,
        INSTANCE_TYPE_LABEL,
        KARPENTER_GPU_LABEL,
        PRODUCT_LABEL,
    )

    docs = [compiled]
    template = Path(artifact) / "kubernetes_job_template.yaml"
    if Path(artifact).is_dir() and template.exists():
        try:
            docs.append(yamltext.load_file(template, f"{artifact}: kubernetes_job_template.yaml"))
        except OSError as exc:
            raise InputError(f"{artifact}: cannot read its Job template ({exc.strerror or exc})") from None
    claims = [pod_claims(d) for d in docs]
    most, placed = max(c[0] for c in claims), set().union(*(c[1] for c in claims))
    if most > per_pod:
        raise InputError(f"--plan: {artifact}'s pods ask for {most} GPUs a pod, its closing task's --uses bill "
                         f"{per_pod}: not as llmpack compile wrote it; not submitted")
    nodes = GPU_NODES.get(gpu_type or "")
    if nodes is None:
        return
    known = {(PRODUCT_LABEL, v) for v in nodes.products} | {(GKE_ACCELERATOR_LABEL, v) for v in nodes.gke} | {
        (KARPENTER_GPU_LABEL, v) for v in nodes.karpenter} | {(INSTANCE_TYPE_LABEL, v) for v in nodes.instance_types}
    other = sorted((k, op, v) for k, op, v in placed if op != "In" or (k, v) not in known)
    if other or (most and not placed):
        said = f"{other[0][0]} {other[0][1]} {other[0][2]}".strip() if other else "nothing (any GPU node)"
        raise InputError(f"--plan: {artifact}'s pods are placed by {said}, not on {gpu_type} nodes only as its "
                         "--uses bill; not submitted")
