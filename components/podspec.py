"""What a step's pod takes from the cluster besides CPUs and GPUs: model and data volumes, secrets, image pulls.

One table, every path (KFP, Argo, the MLflow Job, the TrainJob's node pods, the prepull DaemonSet),
so that ``llmpack compile --model-pvc ... --image ...`` gives every pod the same spec: the model and
data PVCs (read-only, in the steps that read them), ``HF_TOKEN`` from a required ``secretKeyRef``,
image pull policy and secrets, the checkpointing step's volume and grace period
(docs/preemption.md), the tracking Secret's name, and the user's ``--label``s beside the
recommended ``app.kubernetes.io/*`` labels every pod carries (:func:`recommended_labels`; also
``llmpack.label.KEY`` tags on the run's record, :data:`LABELS_ENV`).

Each flag and what every pod gets: docs/cluster.md, "Model, data, the HF token and the image: the
pod-spec flags". Why on :class:`components.dsl.Execution` (``execution.pod``: fusion and the gang
launcher copy a step's execution, so volumes and secrets travel with their step) and why nothing
else is written by default: docs/internals/decisions.md, "Packaging".
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from components import settings

MODEL_MOUNT = "/models"
DATA_MOUNT = "/data"
MODEL_VOLUME = "llmpack-model"
DATA_VOLUME = "llmpack-data"
HF_TOKEN_ENV = "HF_TOKEN"
HF_TOKEN_KEY = "token"
PULL_POLICIES = ("Always", "IfNotPresent", "Never")
MODEL_PARAM = "model"
DATA_PARAM = "data"

# The recommended labels (kubernetes.io/docs/concepts/overview/working-with-objects/common-labels).
APP = "app.kubernetes.io/"
NAME_LABEL, INSTANCE_LABEL, COMPONENT_LABEL = f"{APP}name", f"{APP}instance", f"{APP}component"
PART_OF_LABEL, MANAGED_BY_LABEL, VERSION_LABEL = f"{APP}part-of", f"{APP}managed-by", f"{APP}version"
RECOMMENDED = (NAME_LABEL, INSTANCE_LABEL, COMPONENT_LABEL, PART_OF_LABEL, MANAGED_BY_LABEL, VERSION_LABEL)
PART_OF = "llmpack"
VERSION = "0.1.0"  # the pack's version (pyproject.toml, llmpack.__version__): what the pods run
# The user's --labels as JSON in the closing task's environment: they become its record's tags.
LABELS_ENV = settings.LABELS.name
LABEL_TAG_PREFIX = "llmpack.label."



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
    labels: tuple[tuple[str, str], ...] = ()  # --label KEY=VALUE, in order
    tracking_secret: str | None = None  # --tracking-secret: the MLflow Secret's name (None: TRACKING_SECRET's)

    def merged(self, other: PodExtras) -> PodExtras:
        """Both steps' needs in one pod (``--fuse``): the union, in order; the longer grace period."""
        graces = [g for g in (self.grace_s, other.grace_s) if g is not None]
        return PodExtras(mounts=tuple(dict.fromkeys((*self.mounts, *other.mounts))),
                         secret_env=tuple(dict.fromkeys((*self.secret_env, *other.secret_env))),
                         pull_policy=self.pull_policy or other.pull_policy,
                         pull_secrets=tuple(dict.fromkeys((*self.pull_secrets, *other.pull_secrets))),
                         env=tuple(dict.fromkeys((*self.env, *other.env))), grace_s=max(graces) if graces else None,
                         labels=tuple({**dict(self.labels), **dict(other.labels)}.items()),
                         tracking_secret=self.tracking_secret or other.tracking_secret)


def tracking_secret_of(extras: PodExtras, default: str) -> str:
    """The MLflow Secret this pod reads: ``--tracking-secret``'s, else ``default`` (the compilers pass
    :data:`components.record.tracking.TRACKING_SECRET`, ``llmpack-mlflow``)."""
    return extras.tracking_secret or default


def default_pull_policy(image: str) -> str:
    """As Kubernetes defaults it: ``Always`` for a ``latest`` or absent tag (and no digest), else ``IfNotPresent``."""
    if "@" in image:
        return "IfNotPresent"
    name = image.rsplit("/", 1)[-1]
    tag = name.partition(":")[2]
    return "Always" if tag in ("", "latest") else "IfNotPresent"


def pod_env(extras: PodExtras) -> list[dict[str, object]]:
    """``extras.secret_env`` (secretKeyRef, never optional), then ``extras.env`` and the labels' env.

    As Kubernetes ``EnvVar``s.
    """
    return ([{"name": s.env, "valueFrom": {"secretKeyRef": {"name": s.secret, "key": s.key}}}
             for s in extras.secret_env]
            + [{"name": name, "value": value} for name, value in extras.env]
            + [{"name": k, "value": v} for k, v in labels_env(extras).items()])


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


# Labels: the recommended ones on every pod of every path, and the user's.
def label_value(value: str) -> str:
    """A Kubernetes label value made of ``value`` (63 characters, alphanumerics at both ends)."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "-", value)[:63]
    return re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", cleaned)


def recommended_labels(*, name: str, component: str, managed_by: str, instance: str | None = None) -> dict[str, str]:
    """The ``app.kubernetes.io/*`` labels of one pod: ``name`` the pipeline, ``component`` the step (or task),
    ``instance`` the pipeline run, ``managed-by`` the tool that creates the pod.

    ``instance`` is left out where the run is not known when the pod spec is written (KFP: labels are
    fixed at compile time; docs/internals/decisions.md); an orchestrator placeholder (Argo's
    ``{{workflow.parameters.pipeline_run}}``) is kept as is, a literal run id made a label value.
    """
    labels = {NAME_LABEL: label_value(name), COMPONENT_LABEL: label_value(component), PART_OF_LABEL: PART_OF,
              MANAGED_BY_LABEL: label_value(managed_by), VERSION_LABEL: VERSION}
    if instance:
        labels[INSTANCE_LABEL] = instance if instance.startswith("{{") else label_value(instance)
    return {k: labels[k] for k in RECOMMENDED if labels.get(k)}


def pod_labels_of(recommended: Mapping[str, str], own: Mapping[str, str], extras: PodExtras) -> dict[str, str]:
    """Every label of a pod: the recommended ones, llmpack's own (``llmpack.io/*``), then the user's ``--label``s."""
    return {**recommended, **own, **dict(extras.labels)}


def labels_env(extras: PodExtras) -> dict[str, str]:
    """``{LABELS_ENV: json}`` when the user gave labels (nothing otherwise: artifacts unchanged)."""
    return {LABELS_ENV: json.dumps(dict(extras.labels), sort_keys=True, separators=(",", ":"))} if extras.labels else {}


def label_tags(env: Mapping[str, str]) -> dict[str, str]:
    """The MLflow tags of the user's labels (``llmpack.label.team``...), from :data:`LABELS_ENV`; a malformed
    value gives none (the record is never failed for a label)."""
    try:
        labels = json.loads(env.get(LABELS_ENV) or "{}")
    except ValueError:
        return {}
    if not isinstance(labels, dict):
        return {}
    return {f"{LABEL_TAG_PREFIX}{k}": str(v) for k, v in labels.items()}


# --------------------------------------------------------------------------- checkpoints that outlive the pod
# (docs/preemption.md). A step that checkpoints (it takes ``checkpoint_dir``)
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
# With a checkpoint volume, finetune also checkpoints by time unless --checkpoint-minutes says otherwise:
# an OOM kill, a lost node or an NCCL crash gives no SIGTERM, so without it a retry restarts from the
# last step-count checkpoint, or from step 0. Every DEFAULT_CHECKPOINT_MINUTES, or less often when a
# write is slow: a write takes at most 1/SAVE_SHARE of the time between two.
DEFAULT_CHECKPOINT_MINUTES = 10.0
SAVE_SHARE = 10
# What a SIGTERM must wait for besides the write: the optimizer step in flight ends first (the step
# checkpoints between steps), then the process exits.
GRACE_HEADROOM_S = 30
# Preemption retries the Argo path grants beyond the failure budget (retryStrategy has one counter).
PREEMPTION_RETRIES = 3
# What Argo's ``lastRetry.message`` says for a pod lost to the platform, not to its own code.
# "exit code 143": the step's own exit after a SIGTERM checkpoint (an eviction whose pod Argo saw end
# before it was deleted reports "Error (exit code 143)", not "pod deleted").
PREEMPTION_MESSAGE = ("(?i)pod deleted|imminent node shutdown|preempt|evict|DisruptionTarget|node.*(lost|shutdown)"
                      "|exit code 143")


def grace_for(save_s: float) -> int:
    """``terminationGracePeriodSeconds`` for a checkpoint write of ``save_s`` seconds: twice it (a slow
    volume on a busy node) plus :data:`GRACE_HEADROOM_S`, in whole seconds."""
    import math

    return math.ceil(2 * save_s) + GRACE_HEADROOM_S


def checkpoint_minutes_for(save_s: float) -> float:
    """Minutes between periodic checkpoints for a write of ``save_s`` seconds: :data:`DEFAULT_CHECKPOINT_MINUTES`,
    longer when a write would take more than 1/:data:`SAVE_SHARE` of it (whole minutes)."""
    import math

    return max(DEFAULT_CHECKPOINT_MINUTES, float(math.ceil(SAVE_SHARE * save_s / 60.0)))


def grace_fields(extras: PodExtras) -> dict[str, object]:
    """The pod fields of ``extras.grace_s``: ``terminationGracePeriodSeconds`` when set."""
    return {"terminationGracePeriodSeconds": extras.grace_s} if extras.grace_s is not None else {}


def keeps_checkpoints(extras: PodExtras) -> bool:
    """Whether this pod's checkpoints outlive it (its step writes them to a volume)."""
    from components import settings

    return any(name == settings.CHECKPOINT_ROOT.name for name, _ in extras.env)


# --------------------------------------------------------------------------- one hardening for every pod
# Pod Security ``restricted`` and a read-only root on every pod of every path (KFP, Argo, the MLflow
# Job, the TrainJob's node pods, the prepull DaemonSet): the one directory a step writes outside its
# volumes is /tmp (the image's HF_HOME and MPLCONFIGDIR, Argo's artifact paths, torchrun's logs), an
# emptyDir here. KFP's IR cannot carry readOnlyRootFilesystem nor the token setting (docs/cluster.md).

TMP_VOLUME = "tmp"
TMP_MOUNT = "/tmp"
# The ServiceAccount of the TrainJob's node pods: no Role, and no token mounted (the TrainJob's
# runtimePatches cannot say automountServiceAccountToken; the account itself says it).
NODE_SERVICE_ACCOUNT = "llmpack-trainer"
CONTAINER_HARDENING: dict[str, object] = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                                          "readOnlyRootFilesystem": True, "runAsNonRoot": True}


def tmp_volume() -> tuple[dict[str, object], dict[str, object]]:
    """``(volume, volumeMount)`` of the writable /tmp a read-only root needs."""
    return {"name": TMP_VOLUME, "emptyDir": {}}, {"name": TMP_VOLUME, "mountPath": TMP_MOUNT}
