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
- ``--checkpoint-pvc NAME[:MOUNT]`` (default mount :data:`CHECKPOINT_MOUNT`), ``--grace-period``,
  ``--checkpoint-save-s``, ``--checkpoint-minutes``: the checkpointing step's volume (read-write),
  the variables that point it there, and its pod's ``terminationGracePeriodSeconds`` (the block
  at the end; docs/preemption.md).

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
    """A PersistentVolumeClaim mounted at ``path`` as volume ``volume``; read-only unless it holds checkpoints."""

    volume: str
    claim: str
    path: str
    read_only: bool = True


@dataclass(frozen=True, kw_only=True)
class SecretEnv:
    """An environment variable from a Secret's key (``secretKeyRef``, required)."""

    env: str
    secret: str
    key: str


@dataclass(frozen=True, kw_only=True)
class PodExtras:
    """A step's volumes, env, image pull settings and grace period (all empty: nothing written)."""

    mounts: tuple[ClaimMount, ...] = ()
    secret_env: tuple[SecretEnv, ...] = ()
    pull_policy: str | None = None
    pull_secrets: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()  # plain (name, value) variables: the checkpoint settings
    grace_s: int | None = None  # terminationGracePeriodSeconds

    def merged(self, other: PodExtras) -> PodExtras:
        """Both steps' needs in one pod (``--fuse``): the union, in order; the longer grace period."""
        graces = [g for g in (self.grace_s, other.grace_s) if g is not None]
        return PodExtras(mounts=tuple(dict.fromkeys((*self.mounts, *other.mounts))),
                         secret_env=tuple(dict.fromkeys((*self.secret_env, *other.secret_env))),
                         pull_policy=self.pull_policy or other.pull_policy,
                         pull_secrets=tuple(dict.fromkeys((*self.pull_secrets, *other.pull_secrets))),
                         env=tuple(dict.fromkeys((*self.env, *other.env))), grace_s=max(graces) if graces else None)


def default_pull_policy(image: str) -> str:
    """As Kubernetes defaults it: ``Always`` for a ``latest`` or absent tag (and no digest), else ``IfNotPresent``."""
    if "@" in image:
        return "IfNotPresent"
    name = image.rsplit("/", 1)[-1]
    tag = name.partition(":")[2]
    return "Always" if tag in ("", "latest") else "IfNotPresent"


def pod_env(extras: PodExtras) -> list[dict[str, object]]:
    """``extras.secret_env`` (secretKeyRef, never optional), then ``extras.env``, as Kubernetes ``EnvVar``s."""
    return ([{"name": s.env, "valueFrom": {"secretKeyRef": {"name": s.secret, "key": s.key}}} for s in extras.secret_env]
            + [{"name": name, "value": value} for name, value in extras.env])


def pod_volumes(extras: PodExtras) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    """``(volumes, volumeMounts)`` of ``extras.mounts``: read-only but for the checkpoint volume."""
    ro = {"readOnly": True}
    volumes = [{"name": m.volume, "persistentVolumeClaim": {"claimName": m.claim, **(ro if m.read_only else {})}}
               for m in extras.mounts]
    mounts = [{"name": m.volume, "mountPath": m.path, **(ro if m.read_only else {})} for m in extras.mounts]
    return volumes, mounts


def pull_fields(extras: PodExtras) -> tuple[dict[str, object], dict[str, object]]:
    """``(pod fields, container fields)``: ``imagePullSecrets`` and ``imagePullPolicy`` when set."""
    pod = {"imagePullSecrets": [{"name": n} for n in extras.pull_secrets]} if extras.pull_secrets else {}
    container = {"imagePullPolicy": extras.pull_policy} if extras.pull_policy else {}
    return pod, container


# --------------------------------------------------------------------------- checkpoints that outlive the pod
# (issue 24 items 1 and 2; docs/preemption.md). A step that checkpoints (it takes ``checkpoint_dir``)
# gets the checkpoint volume read-write and CHECKPOINT_ROOT_ENV pointing at it: the step writes under
# ``<root>/<pipeline run>/<step>`` (components.training.checkpointing.run_checkpoint_dir), keyed by the
# run and not the attempt, so the retry pod of this run finds them and no other run does.

CHECKPOINT_MOUNT = "/checkpoints"
CHECKPOINT_VOLUME = "llmpack-checkpoints"
CHECKPOINT_PARAM = "checkpoint_dir"  # the steps that checkpoint take it
# Seconds a checkpoint write is assumed to take when none was measured (a 7-8B LoRA run's adapter,
# optimizer and RNG state to a network volume, with margin; the finetune step logs the measured
# figure as the metric ``checkpoint_save_s``: pass it back with --checkpoint-save-s).
DEFAULT_SAVE_S = 60.0
# What a SIGTERM must wait for besides the write: the optimizer step in flight ends first (the step
# checkpoints between steps), then the process exits.
GRACE_HEADROOM_S = 30
# Preemption retries the Argo path grants beyond the failure budget (retryStrategy has one counter).
PREEMPTION_RETRIES = 3
# What Argo's ``lastRetry.message`` says for a pod lost to the platform, not to its own code.
PREEMPTION_MESSAGE = "(?i)pod deleted|imminent node shutdown|preempt|evict|DisruptionTarget|node.*(lost|shutdown)"


def grace_for(save_s: float) -> int:
    """``terminationGracePeriodSeconds`` for a checkpoint write of ``save_s`` seconds: twice it (a slow
    volume on a busy node) plus :data:`GRACE_HEADROOM_S`, in whole seconds."""
    import math

    return math.ceil(2 * save_s) + GRACE_HEADROOM_S


def grace_fields(extras: PodExtras) -> dict[str, object]:
    """The pod fields of ``extras.grace_s``: ``terminationGracePeriodSeconds`` when set."""
    return {"terminationGracePeriodSeconds": extras.grace_s} if extras.grace_s is not None else {}


def keeps_checkpoints(extras: PodExtras) -> bool:
    """Whether this pod's checkpoints outlive it (its step writes them to a volume)."""
    from components import settings

    return any(name == settings.CHECKPOINT_ROOT.name for name, _ in extras.env)
