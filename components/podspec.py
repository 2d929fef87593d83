"""What a step's pod takes from the cluster besides CPUs and GPUs: model and data volumes, secrets, image pulls.

One table, every path (KFP, Argo, the MLflow Job, the TrainJob's node pods, the prepull DaemonSet),
so that ``llmpack compile --model-pvc ... --image ...`` gives every pod the same spec:

- ``--model-pvc NAME[:MOUNT]`` (default mount :data:`MODEL_MOUNT`) and ``--data-pvc NAME[:MOUNT]``
  (default :data:`DATA_MOUNT`): PersistentVolumeClaims mounted **read-only** into the steps that read
  them. A step reads the data when it takes the ``data`` pipeline parameter; it reads the model
  when it takes the ``model`` parameter or a ``Model`` artifact (the tuned model names its base:
  evaluate loads it again). ``--model /models/x --data /data/y`` then resolve inside the pods.
- ``--hf-token-secret NAME[:KEY]`` (default key ``token``): ``HF_TOKEN`` from that Secret on the
  steps that read the model, by ``secretKeyRef`` (never the value) and **not optional**: a missing
  Secret fails the pod at once rather than a gated download failing, or being skipped, later.
- ``--image-pull-policy`` and ``--image-pull-secret`` (repeatable) on every pod.

Why on :class:`components.dsl.Execution` (``execution.pod``): fusion and the gang launcher copy a
step's execution, so the volumes and secrets travel with the step they belong to. Nothing is set
by default, so the committed (golden) artifacts are unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

MODEL_MOUNT = "/models"
DATA_MOUNT = "/data"
MODEL_VOLUME = "llmpack-model"
DATA_VOLUME = "llmpack-data"
HF_TOKEN_ENV = "HF_TOKEN"
HF_TOKEN_KEY = "token"
PULL_POLICIES = ("Always", "IfNotPresent", "Never")
MODEL_PARAM = "model"
DATA_PARAM = "data"



@dataclass(frozen=True, kw_only=True)
class ClaimMount:
    """A PersistentVolumeClaim mounted read-only at ``path`` as volume ``volume``."""

    volume: str
    claim: str
    path: str


@dataclass(frozen=True, kw_only=True)
class SecretEnv:
    """An environment variable from a Secret's key (``secretKeyRef``, required)."""

    env: str
    secret: str
    key: str


@dataclass(frozen=True, kw_only=True)
class PodExtras:
    """A step's volumes, secret env and image pull settings (all empty: nothing written)."""

    mounts: tuple[ClaimMount, ...] = ()
    secret_env: tuple[SecretEnv, ...] = ()
    pull_policy: str | None = None
    pull_secrets: tuple[str, ...] = ()

    def merged(self, other: PodExtras) -> PodExtras:
        """Both steps' needs in one pod (``--fuse``): the union, in order."""
        return PodExtras(mounts=tuple(dict.fromkeys((*self.mounts, *other.mounts))),
                         secret_env=tuple(dict.fromkeys((*self.secret_env, *other.secret_env))),
                         pull_policy=self.pull_policy or other.pull_policy,
                         pull_secrets=tuple(dict.fromkeys((*self.pull_secrets, *other.pull_secrets))))


def default_pull_policy(image: str) -> str:
    """As Kubernetes defaults it: ``Always`` for a ``latest`` or absent tag (and no digest), else ``IfNotPresent``."""
    if "@" in image:
        return "IfNotPresent"
    name = image.rsplit("/", 1)[-1]
    tag = name.partition(":")[2]
    return "Always" if tag in ("", "latest") else "IfNotPresent"


def pod_env(extras: PodExtras) -> list[dict[str, object]]:
    """``extras.secret_env`` as Kubernetes ``EnvVar``s (secretKeyRef, never optional)."""
    return [{"name": s.env, "valueFrom": {"secretKeyRef": {"name": s.secret, "key": s.key}}} for s in extras.secret_env]


def pod_volumes(extras: PodExtras) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    """``(volumes, volumeMounts)`` of ``extras.mounts``: each claim read-only."""
    volumes = [{"name": m.volume, "persistentVolumeClaim": {"claimName": m.claim, "readOnly": True}} for m in extras.mounts]
    mounts = [{"name": m.volume, "mountPath": m.path, "readOnly": True} for m in extras.mounts]
    return volumes, mounts


def pull_fields(extras: PodExtras) -> tuple[dict[str, object], dict[str, object]]:
    """``(pod fields, container fields)``: ``imagePullSecrets`` and ``imagePullPolicy`` when set."""
    pod = {"imagePullSecrets": [{"name": n} for n in extras.pull_secrets]} if extras.pull_secrets else {}
    container = {"imagePullPolicy": extras.pull_policy} if extras.pull_policy else {}
    return pod, container
