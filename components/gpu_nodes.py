"""Which nodes a GPU step may run on, and what a pod with several GPUs needs: one table, every path.

Every compiled pod of a known ``resources.gpu_type`` selects that type by a required node affinity
whose terms are ORed, one per way a cluster names its GPUs (:data:`GPU_NODES`: GPU Feature
Discovery, GKE, Karpenter, instance types); a type not in the table keeps its spec's node
selector. :func:`placement` is what every backend writes; ``llmpack.gpu_catalogue`` reads the same
table. A pod with more than one GPU mounts a memory-backed ``/dev/shm`` (:data:`SHM_VOLUME`) bounded
by :func:`shm_size_limit` (:data:`SHM_GI_PER_GPU` a GPU). The table's labels and why:
docs/scaling.md, "Which nodes a GPU step may run on".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

PRODUCT_LABEL = "nvidia.com/gpu.product"
GKE_ACCELERATOR_LABEL = "cloud.google.com/gke-accelerator"
KARPENTER_GPU_LABEL = "karpenter.k8s.aws/instance-gpu-name"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
GPU_PRESENT_LABEL = "nvidia.com/gpu.present"
SHM_VOLUME = "dshm"
SHM_MOUNT = "/dev/shm"
SHM_GI_PER_GPU = 8


@dataclass(frozen=True, kw_only=True)
class GpuNodes:
    """How nodes carrying one GPU type say so (label values, exactly as written on the nodes)."""

    products: tuple[str, ...]  # nvidia.com/gpu.product
    gke: tuple[str, ...] = ()  # cloud.google.com/gke-accelerator
    karpenter: tuple[str, ...] = ()  # karpenter.k8s.aws/instance-gpu-name
    instance_types: tuple[str, ...] = ()  # node.kubernetes.io/instance-type

    def terms(self) -> list[dict[str, Any]]:
        """The ORed ``nodeSelectorTerms`` of a required node affinity, one per label that names the type."""
        pairs = ((PRODUCT_LABEL, self.products), (GKE_ACCELERATOR_LABEL, self.gke),
                 (KARPENTER_GPU_LABEL, self.karpenter), (INSTANCE_TYPE_LABEL, self.instance_types))
        return [{"matchExpressions": [{"key": key, "operator": "In", "values": list(values)}]}
                for key, values in pairs if values]


# The price table's GPU types (components/record/prices.yaml) -> their nodes. Products: GFD's
# NVML device name with spaces as '-' (an H100 PCIe or NVL, an A100 PCIe are other products at
# other prices, and are not listed).
GPU_NODES: dict[str, GpuNodes] = {
    "nvidia-h200": GpuNodes(products=("NVIDIA-H200",), gke=("nvidia-h200-141gb",), karpenter=("h200",),
                            instance_types=("p5en.48xlarge", "p5e.48xlarge", "a3-ultragpu-8g")),
    "nvidia-h100-80gb": GpuNodes(products=("NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-SXM5-80GB"),
                                 gke=("nvidia-h100-80gb", "nvidia-h100-mega-80gb"), karpenter=("h100",),
                                 instance_types=("p5.48xlarge", "p5.4xlarge", "a3-highgpu-1g", "a3-highgpu-2g",
                                                 "a3-highgpu-4g", "a3-highgpu-8g", "a3-megagpu-8g", "a3-edgegpu-8g",
                                                 "Standard_ND96isr_H100_v5")),
    "nvidia-a100-80gb": GpuNodes(products=("NVIDIA-A100-SXM4-80GB",), gke=("nvidia-a100-80gb",),
                                 instance_types=("p4de.24xlarge", "a2-ultragpu-1g", "a2-ultragpu-2g",
                                                 "a2-ultragpu-4g", "a2-ultragpu-8g", "Standard_ND96amsr_A100_v4")),
    "nvidia-a100-40gb": GpuNodes(products=("NVIDIA-A100-SXM4-40GB",), gke=("nvidia-tesla-a100",),
                                 instance_types=("p4d.24xlarge", "a2-highgpu-1g", "a2-highgpu-2g", "a2-highgpu-4g",
                                                 "a2-highgpu-8g", "a2-megagpu-16g", "Standard_ND96asr_v4")),
    "nvidia-l40s": GpuNodes(products=("NVIDIA-L40S",), karpenter=("l40s",),
                            instance_types=("g6e.xlarge", "g6e.2xlarge", "g6e.4xlarge", "g6e.8xlarge", "g6e.16xlarge",
                                            "g6e.12xlarge", "g6e.24xlarge", "g6e.48xlarge")),
    "nvidia-l4": GpuNodes(products=("NVIDIA-L4",), gke=("nvidia-l4",), karpenter=("l4",)),
    "nvidia-a10g": GpuNodes(products=("NVIDIA-A10G",), karpenter=("a10g",)),
    "nvidia-t4": GpuNodes(products=("Tesla-T4",), gke=("nvidia-tesla-t4",), karpenter=("t4",)),
    "nvidia-v100": GpuNodes(products=("Tesla-V100-SXM2-16GB",), gke=("nvidia-tesla-v100",), karpenter=("v100",)),
}


def node_affinity(gpu_type: str | None) -> dict[str, Any] | None:
    """A Kubernetes ``NodeAffinity`` that requires a node of ``gpu_type``; None for no or an unknown type."""
    nodes = GPU_NODES.get(gpu_type or "")
    if nodes is None:
        return None
    return {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": nodes.terms()}}


def placement(execution: Any) -> tuple[dict[str, str], dict[str, Any] | None]:
    """``(node selector, node affinity)`` of a step's pod (a :class:`components.dsl.Execution`).

    A GPU step of a known type: its node selector without ``nvidia.com/gpu.present`` and the
    type's affinity; anything else: its node selector as written and no affinity.
    """
    res = execution.resources
    affinity = node_affinity(res.gpu_type) if res.gpus > 0 else None
    selector = dict(execution.node_selector)
    if affinity is not None:
        selector.pop(GPU_PRESENT_LABEL, None)
    return selector, affinity


def needs_shm(gpus: int) -> bool:
    """Whether a pod with ``gpus`` GPUs mounts the memory-backed ``/dev/shm`` (more than one: NCCL)."""
    return gpus > 1


def shm_size_limit(gpus: int) -> str:
    """The ``sizeLimit`` of a pod's memory-backed ``/dev/shm``: :data:`SHM_GI_PER_GPU` Gi per GPU (1Gi without)."""
    return f"{gpus * SHM_GI_PER_GPU if gpus > 0 else 1}Gi"


def shm_volume(gpus: int) -> dict[str, object]:
    """The memory-backed ``/dev/shm`` volume of a pod with ``gpus`` GPUs, bounded by :func:`shm_size_limit`."""
    return {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": shm_size_limit(gpus)}}
