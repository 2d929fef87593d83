"""The pod-spec flags of ``compile``, ``submit`` and ``compare --cluster``, checked once and applied to the pipeline.

``--image``, ``--image-pull-policy``, ``--image-pull-secret``, ``--model-pvc``, ``--data-pvc``,
``--hf-token-secret``, ``--label``, the checkpoint block (``--checkpoint-pvc``, ``--grace-period``,
``--checkpoint-save-s``, ``--checkpoint-minutes``; :mod:`components.podspec` says what each becomes
in a pod) and, for the artifacts that name them, ``--namespace`` and ``--mlflow-repository-uri``.
:meth:`PodOptions.apply` puts them on every step's :class:`~components.dsl.Execution` before the GPU
overrides and fusion, so the TrainJob gang spec and fused pods carry them too.

Decision: nothing is written unless asked. With ``--image`` and no ``--image-pull-policy`` the policy
is what Kubernetes would pick (``Always`` for ``latest`` or no tag, else ``IfNotPresent``), written
out so that every pod on every path says the same; without either, no policy is written and the
committed artifacts stay as they were.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from components import settings
from components.dsl import Model, Pipeline, PipelineParamRef, Task
from components.errors import InputError
from components.labels import LABEL_PREFIX
from components.podspec import (
    CHECKPOINT_MOUNT,
    CHECKPOINT_PARAM,
    CHECKPOINT_VOLUME,
    DATA_MOUNT,
    DATA_PARAM,
    DATA_VOLUME,
    HF_TOKEN_ENV,
    HF_TOKEN_KEY,
    MODEL_MOUNT,
    MODEL_PARAM,
    MODEL_VOLUME,
    PULL_POLICIES,
    RECOMMENDED,
    ClaimMount,
    PodExtras,
    SecretEnv,
    default_pull_policy,
    grace_for,
)

# The pod-spec flags in one line's words (a command that takes them only with --cluster names them so).
POD_FLAGS = ("--image/--model-pvc/--data-pvc/--hf-token-secret/--image-pull-*/--label/--checkpoint-*/--grace-period"
             "/--tracking-secret")

# A container image reference as Docker's distribution/reference grammar spells it (simplified):
# [registry[:port]/]path[:tag][@digest], path components lower-case.
_PATH_PART = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE_REF = re.compile(
    rf"(?:[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*(?::[0-9]+)?/)?{_PATH_PART}(?:/{_PATH_PART})*"
    r"(?::\w[\w.-]{0,127})?(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?"
)


def check_image(image: str) -> None:
    """``--image`` must be an image reference a container runtime accepts."""
    if not IMAGE_REF.fullmatch(image):
        hint = "; repository paths are lower-case" if IMAGE_REF.fullmatch(image.lower()) else ""
        raise InputError(f"--image {image!r}: not a container image reference "
                         f"(e.g. ghcr.io/your-org/llmpack:0.1.0){hint}")


# sha256 digests are 64 lower-case hex digits (OCI image spec, "Digests"); other algorithms are refused.
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def check_digest(image: str) -> None:
    """``repo@sha256:<64 hex>``: a malformed digest is one line naming it."""
    if "@" not in image:
        return
    digest = image.split("@", 1)[1]
    if not _DIGEST.fullmatch(digest):
        raise InputError(f"--image {image!r}: digest {digest!r} is not sha256:<64 lower-case hex digits>")


# A PersistentVolumeClaim or Secret name: a DNS-1123 subdomain.
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_SECRET_KEY = re.compile(r"[-._a-zA-Z0-9]+")


def check_name(name: str, flag: str, what: str) -> str:
    if len(name) > 253 or not _SUBDOMAIN.fullmatch(name):
        raise InputError(f"{flag} {name!r}: not a {what} name (lower-case letters, digits, '-' and '.')")
    return name


# Where a claim must never be mounted: the image's system directories (a volume there replaces the
# programs, libraries or configuration the step runs with), the kernel's file systems, and where
# Kubernetes puts the service-account token and other secrets. A parent of one (``/var``) hides it
# too. The pack's own mounts (``/tmp``, ``/dev/shm``, the artifacts and caches) are not the user's.
SYSTEM_DIRS = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/opt/llmpack", "/proc",
               "/root", "/run", "/sbin", "/sys", "/tmp", "/usr", "/var/run", "/var/lib", "/var/run/secrets")


# The pack's own mounts a claim would collide with (Kubernetes refuses two volumes at one path):
# named, so the one line says whose path it is.
PACK_MOUNTS = {"/dev/shm": "the GPU pods' shared memory (--gpus above 1, and the MLflow Job)",
               "/tmp": "the pods' writable scratch directory (the MLflow Job's, under a read-only root)"}


def mount_problem(mount: str) -> str | None:
    """Why a claim cannot be mounted at ``mount`` (an absolute, normalised path), or None."""
    if mount in PACK_MOUNTS:
        return f"{mount} is {PACK_MOUNTS[mount]}"
    for system in sorted(SYSTEM_DIRS, key=len, reverse=True):  # the most specific one named
        if mount == system or mount.startswith(system + "/"):
            return f"{mount} is in the system directory {system}"
        if system.startswith(mount + "/"):
            return f"{mount} would hide the system directory {system}"
    return None


def parse_claim(value: str, flag: str, default_mount: str, volume: str) -> ClaimMount:
    """``NAME[:MOUNT]`` of ``--model-pvc``/``--data-pvc``; MOUNT an absolute path, not over a system directory."""
    name, sep, mount = value.partition(":")
    check_name(name, flag, "PersistentVolumeClaim")
    mount = mount if sep else default_mount
    if (not mount.startswith("/") or mount == "/" or any(part in ("..", ".") for part in mount.split("/"))
            or ":" in mount):
        raise InputError(f"{flag} {value!r}: the mount path must be an absolute directory other than / "
                         f"(e.g. {default_mount})")
    mount = re.sub("/+", "/", mount).rstrip("/")
    problem = mount_problem(mount)
    if problem:
        raise InputError(f"{flag} {value!r}: {problem}; mount the claim at a directory of its own "
                         f"(e.g. {default_mount})")
    return ClaimMount(volume=volume, claim=name, path=mount)


# ``--mlflow-repository-uri``: an image repository (``[registry[:port]/]path``), as ``docker push`` takes it.
_REPOSITORY = re.compile(rf"(?:[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*(?::[0-9]+)?/)?{_PATH_PART}(?:/{_PATH_PART})*")


def check_repository(uri: str) -> str:
    """``--mlflow-repository-uri`` must be an image repository (MLflow pushes the project's image there);
    anything else, shell text such as ``$(id)`` included, is refused, never written."""
    if len(uri) > 255 or not _REPOSITORY.fullmatch(uri):
        raise InputError(f"--mlflow-repository-uri {uri[:100]!r}: not an image repository "
                         "(e.g. ghcr.io/your-org/llmpack-mlflow-project; lower-case, no tag)")
    return uri


def parse_secret(value: str, flag: str, env: str = HF_TOKEN_ENV, default_key: str = HF_TOKEN_KEY) -> SecretEnv:
    """``NAME[:KEY]`` of ``--hf-token-secret``."""
    name, sep, key = value.partition(":")
    check_name(name, flag, "Secret")
    key = key if sep else default_key
    if not _SECRET_KEY.fullmatch(key) or len(key) > 253:
        raise InputError(f"{flag} {value!r}: key {key!r} is not a Secret key (letters, digits, '-', '_', '.')")
    return SecretEnv(env=env, secret=name, key=key)


def check_pull_policy(value: str, flag: str = "--image-pull-policy") -> str:
    if value not in PULL_POLICIES:
        raise InputError(f"{flag} {value!r}: must be one of {', '.join(PULL_POLICIES)}")
    return value


# --label KEY=VALUE: Kubernetes label syntax (apimachinery validation.IsQualifiedName / IsValidLabelValue).
LABEL_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
OWN_LABEL_PREFIX = LABEL_PREFIX


def parse_label(value: str) -> tuple[str, str]:
    """``KEY=VALUE`` of ``--label``: KEY ``[prefix/]name`` (prefix a DNS subdomain, name 63 characters of
    alphanumerics, ``-``, ``_``, ``.``), VALUE empty or like a name; llmpack's own keys are refused."""
    key, sep, val = value.partition("=")
    if not sep:
        raise InputError(f"--label {value!r}: expected KEY=VALUE (e.g. team=ml-platform)")
    prefix, slash, name = key.rpartition("/")
    if (slash and (not prefix or len(prefix) > 253 or not _SUBDOMAIN.fullmatch(prefix))) or len(name) > 63 \
            or not LABEL_NAME.fullmatch(name):
        raise InputError(f"--label {value!r}: key {key!r} is not a label key ([prefix/]name: name up to 63 letters, "
                         "digits, '-', '_', '.', alphanumeric at both ends; prefix a DNS subdomain)")
    if len(val) > 63 or (val and not LABEL_NAME.fullmatch(val)):
        raise InputError(f"--label {value!r}: value {val!r} is not a label value (up to 63 letters, digits, '-', '_', "
                         "'.', alphanumeric at both ends)")
    if key in RECOMMENDED or key.startswith(OWN_LABEL_PREFIX):
        raise InputError(f"--label {value!r}: {key} is set by llmpack on every pod; choose another key")
    return key, val


def parse_labels(values: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """Every ``--label``, checked; a key given twice with different values is refused."""
    labels: dict[str, str] = {}
    for value in values:
        key, val = parse_label(value)
        if labels.get(key, val) != val:
            raise InputError(f"--label {value!r}: {key} is given twice with different values")
        labels[key] = val
    return tuple(labels.items())


# --------------------------------------------------------------------------- checkpoints that outlive the pod
# (docs/preemption.md): the checkpointing step's volume, variables and grace period.


MAX_SECONDS = 86_400  # a day: longer grace periods or checkpoint intervals are typos (and inf would overflow)


@dataclass(frozen=True, kw_only=True)
class CheckpointOptions:
    """``--checkpoint-pvc``, ``--grace-period``, ``--checkpoint-save-s``, ``--checkpoint-minutes``; none: nothing
    written."""

    claim: ClaimMount | None = None
    grace_s: int | None = None  # terminationGracePeriodSeconds of the GPU and checkpointing pods
    minutes: float | None = None

    @classmethod
    def from_flags(cls, *, checkpoint_pvc: str | None = None, grace_period: int | None = None,
                   checkpoint_save_s: float | None = None,
                   checkpoint_minutes: float | None = None) -> CheckpointOptions:
        """The grace period: ``--grace-period``, else :func:`~components.podspec.grace_for` the measured write time
        (``--checkpoint-save-s``, else :data:`~components.podspec.DEFAULT_SAVE_S`) once checkpoints outlive the pod."""
        from components.podspec import DEFAULT_SAVE_S

        if grace_period is not None and not 0 < grace_period <= MAX_SECONDS:
            raise InputError(f"--grace-period {grace_period}: must be a whole number of seconds, 1 to {MAX_SECONDS}")
        if checkpoint_save_s is not None and not 0 < checkpoint_save_s <= MAX_SECONDS:  # NaN and inf fail too
            raise InputError(f"--checkpoint-save-s {checkpoint_save_s}: must be a number of seconds > 0, "
                             f"at most {MAX_SECONDS}")
        if grace_period is not None and checkpoint_save_s is not None:
            raise InputError("--grace-period with --checkpoint-save-s: give one (the save time sets the grace period)")
        if checkpoint_minutes is not None and not 0 < checkpoint_minutes <= MAX_SECONDS / 60:
            raise InputError(f"--checkpoint-minutes {checkpoint_minutes}: must be a number of minutes > 0, "
                             f"at most {MAX_SECONDS // 60}")
        claim = None if checkpoint_pvc is None else replace(
            parse_claim(checkpoint_pvc, "--checkpoint-pvc", CHECKPOINT_MOUNT, CHECKPOINT_VOLUME), read_only=False)
        if grace_period is None and (claim is not None or checkpoint_save_s is not None):
            grace_period = grace_for(checkpoint_save_s or DEFAULT_SAVE_S)
        if claim is not None and checkpoint_minutes is None:  # crash-safe by default: a kill gives no SIGTERM
            from components.podspec import checkpoint_minutes_for

            checkpoint_minutes = checkpoint_minutes_for(checkpoint_save_s or DEFAULT_SAVE_S)
        return cls(claim=claim, grace_s=grace_period, minutes=checkpoint_minutes)

    def extras(self, task: Task) -> PodExtras:
        """The checkpointing step's volume (read-write) and variables; the grace period on it and on GPU pods."""
        checkpoints = CHECKPOINT_PARAM in task.step.params
        env: list[tuple[str, str]] = []
        if checkpoints and self.claim is not None:
            env.append((settings.CHECKPOINT_ROOT.name, self.claim.path))
        if checkpoints and self.minutes is not None:
            env.append((settings.CHECKPOINT_MINUTES.name, f"{self.minutes:g}"))
        grace = self.grace_s if checkpoints or task.step.execution.resources.gpus > 0 else None
        if checkpoints and grace is not None:
            env.append((settings.GRACE_PERIOD_S.name, str(grace)))
        return PodExtras(mounts=(self.claim,) if checkpoints and self.claim else (), env=tuple(env), grace_s=grace)


def checkpoint_options_of(kw: dict[str, Any]) -> CheckpointOptions:
    """Pop the checkpoint flags (:func:`llmpack.ui.options.pod_options`) out of a command's keyword arguments."""
    return CheckpointOptions.from_flags(
        checkpoint_pvc=kw.pop("checkpoint_pvc", None), grace_period=kw.pop("grace_period", None),
        checkpoint_save_s=kw.pop("checkpoint_save_s", None), checkpoint_minutes=kw.pop("checkpoint_minutes", None))


@dataclass(frozen=True, kw_only=True)
class PodOptions:
    """What the pod-spec flags asked for; the default asks for nothing."""

    image: str | None = None
    model_pvc: ClaimMount | None = None
    data_pvc: ClaimMount | None = None
    hf_token: SecretEnv | None = None
    pull_policy: str | None = None
    pull_secrets: tuple[str, ...] = ()
    namespace: str | None = None
    repository_uri: str | None = None
    checkpoints: CheckpointOptions = CheckpointOptions()
    labels: tuple[tuple[str, str], ...] = ()  # --label KEY=VALUE
    trainer_version: str | None = None  # --trainer-version: the Trainer release the TrainJob is for (None: the default)
    tracking_secret: str | None = None  # --tracking-secret: the MLflow Secret every pod reads (None: llmpack-mlflow)

    @classmethod
    def from_flags(cls, *, image: str | None = None, model_pvc: str | None = None, data_pvc: str | None = None,
                   hf_token_secret: str | None = None, image_pull_policy: str | None = None,
                   image_pull_secrets: tuple[str, ...] = (), namespace: str | None = None,
                   repository_uri: str | None = None, checkpoints: CheckpointOptions | None = None,
                   labels: tuple[str, ...] = (), trainer_version: str | None = None,
                   tracking_secret: str | None = None) -> PodOptions:
        """Every flag checked now (one line naming it), before any slow import."""
        if image is not None:
            check_digest(image)
            check_image(image)
        if image_pull_policy is not None:
            check_pull_policy(image_pull_policy)
        if namespace is not None:
            from components.servers.submission import check_id

            check_id(namespace, "--namespace")
        if repository_uri is not None:
            check_repository(repository_uri)
        model = None if model_pvc is None else parse_claim(model_pvc, "--model-pvc", MODEL_MOUNT, MODEL_VOLUME)
        data = None if data_pvc is None else parse_claim(data_pvc, "--data-pvc", DATA_MOUNT, DATA_VOLUME)
        checkpoints = checkpoints or CheckpointOptions()
        mounted: dict[str, str] = {}  # mount path -> the flag that mounts it: one volume per path in a pod
        for flag, claim in (("--model-pvc", model), ("--data-pvc", data), ("--checkpoint-pvc", checkpoints.claim)):
            if claim is not None and claim.path.rstrip("/") in mounted:
                raise InputError(f"{flag}: mount path {claim.path} is {mounted[claim.path.rstrip('/')]}'s too; "
                                 "give one of them another (NAME:/PATH)")
            if claim is not None:
                mounted[claim.path.rstrip("/")] = flag
        return cls(
            image=image,
            model_pvc=model,
            data_pvc=data,
            hf_token=None if hf_token_secret is None else parse_secret(hf_token_secret, "--hf-token-secret"),
            pull_policy=image_pull_policy or (default_pull_policy(image) if image else None),
            pull_secrets=tuple(dict.fromkeys(check_name(n, "--image-pull-secret", "Secret")
                                             for n in image_pull_secrets)),
            namespace=namespace, repository_uri=repository_uri, checkpoints=checkpoints,
            labels=parse_labels(labels), trainer_version=trainer_version,
            tracking_secret=None if tracking_secret is None else check_name(tracking_secret, "--tracking-secret",
                                                                              "Secret"),
        )

    @property
    def compiles(self) -> bool:
        """Whether these options change the compiled artifacts (else the committed ones will do)."""
        return self != PodOptions()

    def extras(self, task: Task) -> PodExtras:
        """What ``task``'s pod gets: the volumes and secret it reads, and the pull settings."""
        model = reads_model(task)
        mounts = [m for m, wanted in ((self.model_pvc, model), (self.data_pvc, reads_data(task))) if m and wanted]
        return PodExtras(mounts=tuple(mounts), secret_env=(self.hf_token,) if self.hf_token and model else (),
                         pull_policy=self.pull_policy, pull_secrets=self.pull_secrets,
                         labels=self.labels, tracking_secret=self.tracking_secret).merged(self.checkpoints.extras(task))

    def apply(self, pipe: Pipeline) -> Pipeline:
        """A copy of ``pipe`` whose steps carry these options (image and :class:`PodExtras`)."""
        tasks = {}
        for name, task in pipe.tasks.items():
            ex = task.step.execution
            ex = replace(ex, image=self.image or ex.image, pod=ex.pod.merged(self.extras(task)))
            tasks[name] = replace(task, step=replace(task.step, execution=ex))
        return replace(pipe, tasks=tasks)

    def check_mounted(self, value: str | None, flag: str) -> None:
        """``submit --model /models/x`` needs the model volume compiled in: one line naming the missing flag."""
        claim, default, option = ((self.model_pvc, MODEL_MOUNT, "--model-pvc") if flag == "--model"
                                  else (self.data_pvc, DATA_MOUNT, "--data-pvc"))
        if claim is None and value and (value == default or value.startswith(default + "/")):
            hint = ", or an HF hub id with --hf-token-secret" if flag == "--model" else ""
            raise InputError(f"{flag} {value}: no volume is mounted at {default} in the pods; pass {option} NAME "
                             f"(the PersistentVolumeClaim that holds it){hint}")


def reads_model(task: Task) -> bool:
    """It takes the ``model`` pipeline parameter, or a Model artifact (the tuned model names its base)."""
    return any(isinstance(a, PipelineParamRef) and a.name == MODEL_PARAM for a in task.arguments.values()) or any(
        isinstance(art, type) and issubclass(art, Model) for art in task.step.inputs.values())


def reads_data(task: Task) -> bool:
    return any(isinstance(a, PipelineParamRef) and a.name == DATA_PARAM for a in task.arguments.values())


def pod_options_of(kw: dict[str, Any]) -> PodOptions:
    """Pop the pod-spec flags (:func:`llmpack.ui.options.pod_options`) out of a command's keyword arguments."""
    return PodOptions.from_flags(
        image=kw.pop("image", None), model_pvc=kw.pop("model_pvc", None), data_pvc=kw.pop("data_pvc", None),
        hf_token_secret=kw.pop("hf_token_secret", None), image_pull_policy=kw.pop("image_pull_policy", None),
        image_pull_secrets=tuple(kw.pop("image_pull_secrets", None) or ()), namespace=kw.pop("compile_namespace", None),
        repository_uri=kw.pop("repository_uri", None), checkpoints=checkpoint_options_of(kw),
        labels=tuple(kw.pop("labels", None) or ()), trainer_version=kw.pop("trainer_version", None),
        tracking_secret=kw.pop("tracking_secret", None))
