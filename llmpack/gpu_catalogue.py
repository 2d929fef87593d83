"""The GPU catalogue: the GPU types ``--gpu-type`` names, what GPU a cluster run trained on, its price.

``--gpu-type`` takes a type's full id (``nvidia-a100-80gb``) or its short name (``a100-80gb``,
and :data:`ALIASES`: ``a100`` is the 80 GB card, ``h100`` the 80 GB SXM); :func:`resolve_gpu_type`
refuses any other name in one line listing the known ones. Known types are those the placement
table knows how to select (:data:`components.gpu_nodes.GPU_NODES`) and the price table prices.
How many CPUs and how much memory a pod of several GPUs gets is :func:`resources_for_gpus`.

``nvidia.com/gpu.product`` (NVIDIA GPU feature discovery) is mapped by :data:`GPU_PRODUCTS`, else
the node's instance type by :data:`INSTANCE_TYPES` (which also gives the cloud provider whose list
price applies), else the pipeline spec's GPU type (:func:`node_gpu`). A product that maps to
nothing keeps its own name, so a price flag or file can price it; it is never guessed.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from components import settings
from components.dsl import Resources
from components.errors import InputError
from components.gpu_nodes import GPU_NODES
from components.record import cost

# ``nvidia.com/gpu.product`` (GPU feature discovery: the NVML device name with spaces as '-', compared
# upper case) -> the price table's GPU type: the products of the placement table every compiled pod
# selects by (components.gpu_nodes.GPU_NODES), so a node we select is a node we price alike.
GPU_PRODUCTS = {normalize: gpu_type for gpu_type, nodes in GPU_NODES.items()
                for normalize in (re.sub(r"[\s_]+", "-", p).upper() for p in nodes.products)}

# ``node.kubernetes.io/instance-type`` (full match, case-insensitive) -> (GPU type, provider).
INSTANCE_TYPES = (
    (r"p5en\.48xlarge|p5e\.48xlarge", "nvidia-h200", "aws"),
    (r"p5\.(4|48)xlarge", "nvidia-h100-80gb", "aws"),
    (r"p4de\.24xlarge", "nvidia-a100-80gb", "aws"),
    (r"p4d\.24xlarge", "nvidia-a100-40gb", "aws"),
    (r"g6e\.\d*x?large", "nvidia-l40s", "aws"),
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
    # the node's (llmpack.cluster.k8s.objects.capacity_type): spot nodes take the spot column
    capacity_type: str | None = None


def node_gpu(row: Mapping[str, Any] | None, spec_gpu_type: str | None) -> NodeGpu:
    """The GPU type of the finetune pod's node (row from the watcher), else the spec's; and its capacity type."""
    from dataclasses import replace

    found = _node_gpu(row, spec_gpu_type)
    return replace(found, capacity_type=(row or {}).get("capacity_type")) if row else found


def _node_gpu(row: Mapping[str, Any] | None, spec_gpu_type: str | None) -> NodeGpu:
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
    capacity = gpu.capacity_type or "unknown"
    price = cost.resolve_price(gpu.gpu_type, flag=flag, price_file=price_file, provider=provider,
                               capacity_type=capacity)
    if price is None and provider:
        price = cost.resolve_price(gpu.gpu_type, flag=flag, price_file=price_file, capacity_type=capacity)
    return price


# --------------------------------------------------------------------------- --gpu-type names

PREFIX = "nvidia-"
# Short names that are not just the id without its prefix: the card most clusters mean by them.
ALIASES = {"h100": "nvidia-h100-80gb", "a100": "nvidia-a100-80gb"}


def known_gpu_types() -> list[str]:
    """The types ``--gpu-type`` accepts: placed by the node table and priced by the shipped table."""
    return sorted(set(GPU_NODES) & set(cost.known_gpu_types()))


def short_names() -> dict[str, str]:
    """Short name -> full id, for every known type (``a100-80gb``, and the :data:`ALIASES`)."""
    names = {t.removeprefix(PREFIX): t for t in known_gpu_types()}
    return {**names, **{k: v for k, v in ALIASES.items() if v in names.values()}}


def describe_known() -> str:
    """``a100 (nvidia-a100-80gb), a100-40gb (nvidia-a100-40gb), ...``: what an error lists."""
    return ", ".join(f"{short} ({full})" for short, full in sorted(short_names().items()))


def lookup_gpu_type(text: str) -> str | None:
    """The full id of a known type named by its full id or short name (any case), else None."""
    key = text.strip().lower()
    if key in known_gpu_types():
        return key
    return short_names().get(key)


def resolve_gpu_type(text: str, flag: str = "--gpu-type") -> str:
    """``--gpu-type`` of a compiled artifact: a known type's full id, or one line naming the known ones."""
    found = lookup_gpu_type(text)
    if found is None:
        raise InputError(f"{flag} {text!r}: unknown GPU type; known: {describe_known()}")
    return found


# --------------------------------------------------------------------------- CPUs and memory per GPU

_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|k|M|G|T)?$")
_MI = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024, "Ti": 1024**2, "k": 1e3 / 2**20, "M": 1e6 / 2**20, "G": 1e9 / 2**20,
       "T": 1e12 / 2**20, None: 1 / 2**20}


def scale_memory(memory: str, factor: float) -> str:
    """A Kubernetes memory quantity times ``factor``, in its own unit when whole, else in Mi (rounded up)."""
    m = _QUANTITY.fullmatch(memory.strip())
    if m is None:
        raise InputError(f"memory {memory!r}: not a Kubernetes quantity this rule can scale (e.g. 64Gi)")
    value = float(m.group(1)) * factor
    if value.is_integer():
        return f"{int(value)}{m.group(2) or ''}"
    return f"{math.ceil(value * _MI[m.group(2)])}Mi"


def resources_for_gpus(res: Resources, gpus: int) -> Resources:
    """The rule, defined once: a pod's CPUs and memory are the spec's per GPU times its GPUs.

    A step spec sizes its pod for ``res.gpus`` GPUs (finetune: 8 CPUs and 64Gi for 1); asked for
    ``gpus`` GPUs the pod gets ``res.cpu / res.gpus * gpus`` CPUs and as much more memory, so a
    4-GPU node pod gets 32 CPUs and 256Gi, the share of a node a GPU comes with. On CPUs only
    (``gpus`` 0, or a spec without GPUs) the spec's numbers stay.
    """
    if gpus <= 0 or res.gpus <= 0 or gpus == res.gpus:
        return replace(res, gpus=gpus)
    factor = gpus / res.gpus
    cpu = round(res.cpu * factor, 3)
    return replace(res, gpus=gpus, cpu=int(cpu) if float(cpu).is_integer() else cpu,
                   memory=scale_memory(res.memory, factor))
