"""The Kubeflow Trainer v2 ``TrainJob`` the multi-node finetune step creates, as a plain dict.

A pure builder: no Kubernetes client, no cluster. :class:`TrainJobSpec` checks its inputs when it
is made (each bad one an :class:`InputError` of one line) and :meth:`TrainJobSpec.build` returns the
object to hand to ``CustomObjectsApi.create_namespaced_custom_object`` (group
``trainer.kubeflow.org``, version ``v1alpha1``, plural ``trainjobs``) or to print with
:func:`to_yaml` for ``kubectl apply -f -``. Written against Kubeflow Trainer v2.3.0: the
``torch-distributed`` runtime's ``PET_*`` variables stand in for torchrun's flags (which are
refused), placement, labels and Pod Security ``restricted`` go through ``spec.runtimePatches``
(fixed here, so the ``trainjob`` run parameter cannot loosen them), and ``queue`` is Kueue's
queue-name label.

Each field and why: docs/scaling.md, "The TrainJob object"; how the launcher creates and follows
it: docs/internals/decisions.md, "The TrainJob launcher".
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from components.dsl import Toleration, is_dns1123_label
from components.errors import InputError
from components.gpu_nodes import SHM_MOUNT, SHM_VOLUME, needs_shm, shm_volume
from components.labels import TRAINJOB_MANAGER
from components.podspec import (
    CONTAINER_HARDENING,
    NODE_SERVICE_ACCOUNT,
    PodExtras,
    grace_fields,
    pod_env,
    pod_volumes,
    pull_fields,
    tmp_volume,
)

API_GROUP = "trainer.kubeflow.org"
API_VERSION = f"{API_GROUP}/v1alpha1"
KIND = "TrainJob"
PLURAL = "trainjobs"
RUNTIME_KINDS = ("ClusterTrainingRuntime", "TrainingRuntime")
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PATCH_MANAGER = TRAINJOB_MANAGER
# The torch-distributed runtime's replicated job (and container) that runs the trainer.
TRAINER_JOB = "node"
VOLUME_NAME = "llmpack-shared"  # the PVC the gang's nodes and the launcher pod share (components.trainjob.gang)
RUN_AS = 1000  # the step image's user and group (Dockerfile: LLMPACK_UID)
# The Trainer releases a TrainJob is compiled for (llmpack compile --trainer-version), oldest first, and
# each one's release tag (its CRDs and runtimes: doctor's install line). docs/first-run-on-a-cluster.md's
# versions table is the one list of what is supported; these follow it.
TRAINER_RELEASES = {"2.2": "v2.2.0", "2.3": "v2.3.0"}
DEFAULT_TRAINER = "2.3"
POD_SECURITY = {"runAsNonRoot": True, "runAsUser": RUN_AS, "runAsGroup": RUN_AS, "fsGroup": RUN_AS,
                "seccompProfile": {"type": "RuntimeDefault"}}
CONTAINER_SECURITY = dict(CONTAINER_HARDENING)  # read-only root: /tmp is an emptyDir (components.podspec)
GPU_RESOURCE = "nvidia.com/gpu"
# Set by the Trainer's torch plugin on the trainer container; the webhook rejects them in env.
TORCHRUN_ENV = ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT")
# torchrun flags that would override the runtime's PET_* values (``--standalone``: a one-node rendezvous).
_TORCHRUN_FIXED = frozenset(("--nnodes", "--node-rank", "--node_rank", "--nproc-per-node", "--nproc_per_node",
                             "--master-addr", "--master_addr", "--master-port", "--master_port", "--standalone"))
# torchrun flags that take no value; the others take the next word unless written ``--flag=value``.
_TORCHRUN_SWITCHES = frozenset(("--standalone", "--no-python", "--no_python", "--run-path", "--run_path"))

# RFC 1035 label: the CRD's own rule on metadata.name (a letter first, at most 63).
_RFC1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
_LABEL_VALUE = _LABEL_NAME
_QUANTITY = re.compile(r"^(\+)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
                       r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$")
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
_OPERATORS = ("Exists", "Equal")
_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute", "")  # "": every effect
_INT32_MAX = 2**31 - 1


def _is_subdomain(value: str) -> bool:
    return 0 < len(value) <= 253 and bool(_DNS1123_SUBDOMAIN.fullmatch(value))


def _is_label_key(key: str) -> bool:
    prefix, slash, name = key.rpartition("/")
    if slash and not _is_subdomain(prefix):
        return False
    return 0 < len(name) <= 63 and bool(_LABEL_NAME.fullmatch(name))


def _is_label_value(value: str) -> bool:
    return len(value) <= 63 and bool(_LABEL_VALUE.fullmatch(value))


def _positive(quantity: str) -> bool:
    number = re.match(r"\+?([0-9]*\.?[0-9]*)", quantity)
    return number is not None and float(number.group(1) or 0) > 0


def _hostname(name: str, num_nodes: int) -> str:
    """The last trainer pod's hostname: JobSet names it ``<jobset>-<replicated job>-<job index>-<pod index>``."""
    return f"{name}-{TRAINER_JOB}-0-{num_nodes - 1}"


def torchrun_flags(command: Sequence[str]) -> list[str]:
    """The flags (``--name``, without values) that ``command`` gives torchrun itself; [] when it is not torchrun.

    torchrun is ``torchrun ...`` or ``python -m torch.distributed.run ...``; its own flags end at the
    script, at ``-m MODULE`` or at ``--no-python CMD`` (what follows belongs to the script).
    """
    words = list(command)
    if words and words[0].rsplit("/", 1)[-1] == "torchrun":
        rest = words[1:]
    elif (len(words) >= 3 and words[0].rsplit("/", 1)[-1].startswith("python")
          and words[1:3] == ["-m", "torch.distributed.run"]):
        rest = words[3:]
    else:
        return []
    flags: list[str] = []
    skip = False
    for word in rest:
        if skip:
            skip = False
            continue
        if not word.startswith("-") or word in ("-m", "--module"):
            break
        flag = word.split("=", 1)[0]
        flags.append(flag)
        if flag in ("--no-python", "--no_python"):
            break
        skip = "=" not in word and flag not in _TORCHRUN_SWITCHES
    return flags


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def cpu_quantity(cpu: float) -> str:
    """Cores as a Kubernetes quantity: ``4``, ``500m``."""
    return str(int(cpu)) if float(cpu).is_integer() else f"{round(cpu * 1000)}m"


@dataclass(frozen=True, kw_only=True)
class TrainJobSpec:
    """One TrainJob: ``num_nodes`` pods, each with ``gpus_per_node`` GPUs, ``cpu`` cores and ``memory``.

    ``labels`` go on the TrainJob and on every pod it starts (the ``llmpack.io/`` labels the pod
    watcher and cost attribution read); ``queue`` is a Kueue LocalQueue name;
    ``active_deadline_s`` becomes ``spec.activeDeadlineSeconds``.
    """

    name: str
    namespace: str
    image: str
    command: Sequence[str]
    num_nodes: int = 1
    gpus_per_node: int = 0
    cpu: float = 1.0
    memory: str = "2Gi"
    runtime: str = "torch-distributed"
    runtime_kind: str = "ClusterTrainingRuntime"
    node_selector: Mapping[str, str] = field(default_factory=dict)
    node_affinity: Mapping[str, Any] | None = None  # a Kubernetes NodeAffinity (components.gpu_nodes)
    tolerations: Sequence[Toleration] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    queue: str | None = None
    active_deadline_s: int | None = None
    # A PersistentVolumeClaim mounted in every node's trainer container: (claim name, mount path).
    volume: tuple[str, str] | None = None
    # Read-only model/data PVCs, secretKeyRef env (HF_TOKEN), imagePullSecrets (components.podspec). The trainer
    # has no imagePullPolicy field (Trainer v2.3): its pods pull as Kubernetes defaults for the image.
    extras: PodExtras = field(default_factory=PodExtras)

    def __post_init__(self) -> None:
        # Frozen copies, so a caller's list or dict changed later cannot change the object.
        for attr, kind in (("command", tuple), ("tolerations", tuple), ("node_selector", dict), ("labels", dict),
                           ("env", dict)):
            value = getattr(self, attr)
            ok = (isinstance(value, Mapping) if kind is dict
                  else isinstance(value, Sequence) and not isinstance(value, (str, bytes)))
            if not ok:
                raise InputError(f"TrainJob {attr}: expected a {'mapping' if kind is dict else 'list'}, "
                                 f"got {type(value).__name__}")
            object.__setattr__(self, attr, kind(value))
        self._validate()

    def _validate(self) -> None:
        where = f"TrainJob {self.name!r}"
        if not isinstance(self.name, str) or len(self.name) > 63 or not _RFC1035_LABEL.fullmatch(self.name):
            raise InputError(f"TrainJob name {self.name!r}: must be a DNS-1123 (RFC 1035) label: lower-case letters, "
                             "digits and '-', a letter first, at most 63")
        if (_is_count(self.num_nodes) and self.num_nodes >= 1
                and len(hostname := _hostname(self.name, self.num_nodes)) > 63):
            raise InputError(f"TrainJob name {self.name!r}: too long for {self.num_nodes} nodes "
                             f"(its last pod's hostname {hostname} must fit in 63 characters)")
        if not isinstance(self.namespace, str) or not is_dns1123_label(self.namespace):
            raise InputError(f"{where}: namespace {self.namespace!r} is not a valid DNS-1123 label")
        if (not isinstance(self.image, str) or not self.image.strip() or len(self.image) > 500
                or self.image != self.image.strip()):
            raise InputError(f"{where}: image {self.image!r} must be a non-empty image reference "
                             "of at most 500 characters")
        if not self.command or not all(isinstance(a, str) for a in self.command) or len(self.command) > 128:
            raise InputError(f"{where}: command must be 1 to 128 strings, got {list(self.command)!r}")
        fixed = [flag for flag in torchrun_flags(self.command) if flag in _TORCHRUN_FIXED]
        if fixed:
            raise InputError(f"{where}: command sets torchrun's {fixed[0]}; the {self.runtime} runtime sets the nodes, "
                             f"ranks and rendezvous through {', '.join(TORCHRUN_ENV)}: leave it out")
        if not _is_count(self.num_nodes) or not 1 <= self.num_nodes <= _INT32_MAX:
            raise InputError(f"{where}: num_nodes {self.num_nodes!r} must be a whole number >= 1")
        if not _is_count(self.gpus_per_node) or not 0 <= self.gpus_per_node <= _INT32_MAX:
            raise InputError(f"{where}: gpus_per_node {self.gpus_per_node!r} must be a whole number >= 0")
        if (isinstance(self.cpu, bool) or not isinstance(self.cpu, (int, float)) or not 0 < self.cpu < 1e6
                or round(self.cpu * 1000) < 1):
            raise InputError(f"{where}: cpu {self.cpu!r} must be a number of cores >= 0.001")
        if not isinstance(self.memory, str) or not _QUANTITY.fullmatch(self.memory) or not _positive(self.memory):
            raise InputError(f"{where}: memory {self.memory!r} is not a positive Kubernetes quantity (e.g. 64Gi)")
        if not isinstance(self.runtime, str) or not _is_subdomain(self.runtime):
            raise InputError(f"{where}: runtime {self.runtime!r} is not a valid DNS-1123 subdomain")
        if self.runtime_kind not in RUNTIME_KINDS:
            raise InputError(f"{where}: runtime_kind {self.runtime_kind!r} must be one of {', '.join(RUNTIME_KINDS)}")
        if self.queue is not None and (not isinstance(self.queue, str) or not _is_label_value(self.queue)
                                       or not self.queue):
            raise InputError(f"{where}: queue {self.queue!r} is not a valid Kueue LocalQueue name (a label value)")
        if self.active_deadline_s is not None and (not _is_count(self.active_deadline_s) or self.active_deadline_s < 1):
            raise InputError(f"{where}: active_deadline_s {self.active_deadline_s!r} "
                             "must be a whole number of seconds >= 1")
        for what, mapping in (("label", self.labels), ("node selector", self.node_selector)):
            for key, value in mapping.items():
                if not isinstance(key, str) or not _is_label_key(key):
                    raise InputError(f"{where}: {what} key {key!r} is not a valid Kubernetes label key")
                if not isinstance(value, str) or not _is_label_value(value):
                    raise InputError(f"{where}: {what} {key}={value!r}: "
                                     "not a valid label value (at most 63 of [A-Za-z0-9-_.])")
        if self.node_affinity is not None and not isinstance(self.node_affinity, Mapping):
            raise InputError(f"{where}: node_affinity must be a Kubernetes NodeAffinity mapping, "
                             f"got {type(self.node_affinity).__name__}")
        if QUEUE_LABEL in self.labels:
            raise InputError(f"{where}: label {QUEUE_LABEL} is set from queue=, not from labels")
        for key, value in self.env.items():
            if not isinstance(key, str) or not _ENV_NAME.fullmatch(key):
                raise InputError(f"{where}: env name {key!r} is not a valid environment variable name")
            if key in TORCHRUN_ENV:
                raise InputError(f"{where}: env {key} is set by the {self.runtime} runtime; leave it out")
            if not isinstance(value, str):
                raise InputError(f"{where}: env {key}={value!r}: the value must be a string")
        for tol in self.tolerations:
            if not isinstance(tol, Toleration):
                raise InputError(f"{where}: tolerations must be components.dsl.Toleration, got {type(tol).__name__}")
            if tol.operator not in _OPERATORS:
                raise InputError(f"{where}: toleration {tol.key!r}: operator {tol.operator!r} must be Exists or Equal")
            if tol.effect not in _EFFECTS:
                raise InputError(f"{where}: toleration {tol.key!r}: "
                                 f"effect {tol.effect!r} must be one of {', '.join(_EFFECTS)}")
            if tol.key and not _is_label_key(tol.key):
                raise InputError(f"{where}: toleration key {tol.key!r} is not a valid Kubernetes label key")
            if tol.operator == "Exists" and tol.value:
                raise InputError(f"{where}: toleration {tol.key!r}: operator Exists takes no value")
            if tol.operator == "Equal" and not tol.key:
                raise InputError(f"{where}: toleration with operator Equal needs a key")

    # ------------------------------------------------------------------------- build

    def resources(self) -> dict[str, dict[str, str]]:
        """``resourcesPerNode``: CPU, memory and GPUs requested and limited alike (Guaranteed, as on every path)."""
        requests = {"cpu": cpu_quantity(self.cpu), "memory": self.memory}
        if not self.gpus_per_node:
            return {"limits": dict(requests), "requests": requests}
        gpus = str(self.gpus_per_node)
        return {"limits": {**requests, GPU_RESOURCE: gpus}, "requests": {**requests, GPU_RESOURCE: gpus}}

    def pod_patch(self) -> dict[str, Any]:
        """The ``runtimePatches`` entry: pod labels, placement, volumes and the restricted security context."""
        import copy

        pod_template: dict[str, Any] = {}
        if self.labels:
            pod_template["metadata"] = {"labels": dict(self.labels)}
        # No token in the node pods: their account has none mounted (launcher-rbac.yaml writes it).
        pod_spec: dict[str, Any] = {"serviceAccountName": NODE_SERVICE_ACCOUNT,
                                    "securityContext": copy.deepcopy(POD_SECURITY)}
        if self.node_selector:
            pod_spec["nodeSelector"] = dict(self.node_selector)
        if self.node_affinity:
            pod_spec["affinity"] = {"nodeAffinity": copy.deepcopy(dict(self.node_affinity))}
        if self.tolerations:
            pod_spec["tolerations"] = [_toleration(t) for t in self.tolerations]
        # PodSpecPatch allows volumes and a container's volumeMounts and securityContext.
        tmp, tmp_mount = tmp_volume()
        volumes: list[dict[str, Any]] = [tmp]
        mounts: list[dict[str, Any]] = [tmp_mount]
        if self.volume is not None:
            claim, mount = self.volume
            volumes.append({"name": VOLUME_NAME, "persistentVolumeClaim": {"claimName": claim}})
            mounts.append({"name": VOLUME_NAME, "mountPath": mount})
        if needs_shm(self.gpus_per_node):
            volumes.append(shm_volume(self.gpus_per_node))
            mounts.append({"name": SHM_VOLUME, "mountPath": SHM_MOUNT})
        claim_volumes, claim_mounts = pod_volumes(self.extras)
        volumes += claim_volumes
        mounts += claim_mounts
        pull_pod, _ = pull_fields(self.extras)
        pod_spec.update(pull_pod)
        pod_spec.update(grace_fields(self.extras))  # --checkpoint-pvc, --grace-period: the checkpoint write fits
        if volumes:
            pod_spec["volumes"] = volumes
        container: dict[str, Any] = {"name": TRAINER_JOB, "securityContext": copy.deepcopy(CONTAINER_SECURITY)}
        if mounts:
            container["volumeMounts"] = mounts
        pod_spec["containers"] = [container]
        pod_template["spec"] = pod_spec
        job = {"name": TRAINER_JOB, "template": {"spec": {"template": pod_template}}}
        return {"manager": PATCH_MANAGER, "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [job]}}}}

    def build(self) -> dict[str, Any]:
        """The TrainJob object (apiVersion trainer.kubeflow.org/v1alpha1, kind TrainJob), a new dict each call."""
        labels = dict(self.labels)
        if self.queue:
            labels[QUEUE_LABEL] = self.queue
        metadata: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if labels:
            metadata["labels"] = labels
        trainer: dict[str, Any] = {
            "image": self.image,
            "command": list(self.command),
            "numNodes": self.num_nodes,
            # One process per GPU (what ``auto`` gives); one per node on CPU, where ``auto`` would
            # start one per core, each loading the model.
            "numProcPerNode": self.gpus_per_node or 1,
            "resourcesPerNode": self.resources(),
        }
        if self.env or self.extras.secret_env or self.extras.env:
            trainer["env"] = [{"name": k, "value": v} for k, v in self.env.items()] + pod_env(self.extras)
        spec: dict[str, Any] = {
            "runtimeRef": {"name": self.runtime, "kind": self.runtime_kind, "apiGroup": API_GROUP},
            "trainer": trainer,
        }
        if self.active_deadline_s is not None:
            spec["activeDeadlineSeconds"] = self.active_deadline_s
        spec["runtimePatches"] = [self.pod_patch()]
        return {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata, "spec": spec}


def _toleration(tol: Toleration) -> dict[str, str]:
    out = {"key": tol.key} if tol.key else {}
    out["operator"] = tol.operator
    if tol.value and tol.operator == "Equal":
        out["value"] = tol.value
    if tol.effect:
        out["effect"] = tol.effect
    return out


def to_yaml(obj: Mapping[str, Any]) -> str:
    """``obj`` as block YAML in its own key order (``kubectl apply -f -`` reads it back unchanged)."""
    import yaml

    return yaml.safe_dump(dict(obj), sort_keys=False, default_flow_style=False, width=100_000, allow_unicode=True)
