"""What a step needs from the cluster: image, resources, retries, timeout, placement (:class:`Execution`).

Frozen keyword-only specs, part of the authoring model (:mod:`components.dsl` re-exports them);
each backend compiles them into its own pod fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from components.podspec import PodExtras


@dataclass(frozen=True, kw_only=True)
class Toleration:
    key: str
    operator: str = "Exists"  # Exists | Equal
    value: str | None = None
    effect: str = "NoSchedule"  # NoSchedule | PreferNoSchedule | NoExecute


@dataclass(frozen=True, kw_only=True)
class Retry:
    """Retries with exponential backoff: ``backoff_s * factor**n``, capped at ``max_backoff_s``."""

    limit: int = 0
    backoff_s: int = 30
    factor: int = 2
    max_backoff_s: int = 600


@dataclass(frozen=True, kw_only=True)
class Resources:
    """CPU in cores, memory as a Kubernetes quantity, GPUs by type and count, per node.

    ``nodes`` above 1 makes the step a gang of that many pods (a Kubeflow Trainer ``TrainJob`` on
    a cluster), each with these resources; cost counts ``nodes * gpus`` GPUs.
    """

    cpu: float = 1.0
    memory: str = "2Gi"
    gpu_type: str | None = None
    gpus: int = 0
    nodes: int = 1

    @property
    def total_gpus(self) -> int:
        return self.gpus * self.nodes


GPU_TOLERATION = Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule")

# llmpack's own step image (the repository's Dockerfile): the shipped pipeline's code, never a user's module.
DEFAULT_IMAGE = "ghcr.io/llmpack/llmpack:0.1.0"

# Where a step with ``Execution.cache_pvc`` mounts that PersistentVolumeClaim; HF_HOME points there.
HF_CACHE_MOUNT = "/var/cache/llmpack/huggingface"


@dataclass(frozen=True, kw_only=True)
class Execution:
    """What a step needs from the cluster. Local runs ignore placement but keep the numbers."""

    image: str = DEFAULT_IMAGE
    resources: Resources = field(default_factory=Resources)
    retry: Retry = field(default_factory=Retry)
    timeout_s: int = 3600
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: tuple[Toleration, ...] = ()
    # The step loads models, tokenizers or datasets through the Hugging Face cache (HF_HOME).
    hf_cache: bool = False
    # Name of a PersistentVolumeClaim mounted at HF_CACHE_MOUNT as that cache, on steps with
    # ``hf_cache``; set at compile time (``llmpack compile --cache-pvc``), None: no volume.
    cache_pvc: str | None = None
    pod: PodExtras = field(default_factory=PodExtras)  # model/data volumes, HF_TOKEN, pulls (components.podspec)
