"""The GPU catalogue: what GPU a cluster run trained on, from its node, and that GPU's price.

``nvidia.com/gpu.product`` (NVIDIA GPU feature discovery) is mapped by :data:`GPU_PRODUCTS`, else
the node's instance type by :data:`INSTANCE_TYPES` (which also gives the cloud provider whose list
price applies), else the pipeline spec's GPU type (:func:`node_gpu`). A product that maps to
nothing keeps its own name, so a price flag or file can price it; it is never guessed.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from components import settings
from components.record import cost

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
