"""finetune on many nodes: the orchestrator's finetune pod creates a Kubeflow Trainer ``TrainJob``.

With ``nnodes`` N > 1 (``llmpack compile --nodes N --gpus G --cache-pvc PVC``) finetune's command
is a *launcher* in a small CPU pod, the same on every backend: it copies the step's inputs into
the shared volume, creates a ``TrainJob`` of N nodes with G GPUs each running ``torchrun`` on the
same step (:mod:`components.trainjob.spec`), follows it to its end (deleting it when the run is
cancelled), then copies the outputs back and merges every rank's events. The gang's pod spec
travels in the ``trainjob`` pipeline parameter (:class:`GangSpec`), pinned at compile: the launcher
refuses a value whose digest is not in its ``LLMPACK_GANG_SPECS`` (:func:`check_compiled`), and a
pipeline compiled without ``--nodes`` refuses any ``nnodes`` but 1 and any ``trainjob`` at all, in its
step process and at submit (:func:`check_pinned`); its security context is always the TrainJob builder's
``restricted`` one. In full: docs/internals/step-process.md
and docs/scaling.md.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from components import labels, settings
from components.dsl import HF_CACHE_MOUNT, Execution, Toleration
from components.errors import InputError
from components.podspec import ClaimMount, PodExtras, SecretEnv, label_value, pod_labels_of, recommended_labels

NNODES_PARAM = "nnodes"
TRAINJOB_PARAM = "trainjob"
# GangSpec fields left out of its JSON when empty
_OPTIONAL = ("mounts", "secret_env", "pull_secrets", "env", "grace_s", "labels", "pipeline")
GANG_DIR = "llmpack-gang"  # under the shared volume's mount: one directory per run and step attempt
MAX_NODES = 1024
MANAGED_BY = "kubeflow-trainer"  # app.kubernetes.io/managed-by of the node pods: the Trainer starts them


@dataclass(frozen=True, kw_only=True)
class GangSpec:
    """What a node pod of the gang is: compiled into the ``trainjob`` parameter as JSON."""

    image: str
    gpus_per_node: int
    cpu: float
    memory: str
    claim: str  # the shared ReadWriteMany PVC (``--cache-pvc``)
    mount: str = HF_CACHE_MOUNT
    gpu_type: str | None = None
    node_selector: dict[str, str] = field(default_factory=dict)
    node_affinity: dict[str, Any] | None = None  # the GPU type's nodes (components.gpu_nodes)
    tolerations: list[dict[str, str]] = field(default_factory=list)
    runtime: str = "torch-distributed"
    queue: str | None = None
    active_deadline_s: int | None = None
    # components.podspec, as the step's execution.pod: written only when set (older specs stay valid).
    mounts: list[dict[str, Any]] = field(default_factory=list)  # {volume, claim, path[, read_only: false]}: PVCs
    secret_env: list[dict[str, str]] = field(default_factory=list)  # {env, secret, key}: required secretKeyRefs
    pull_secrets: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)  # the checkpoint volume's settings (--checkpoint-pvc ...)
    grace_s: int | None = None  # the node pods' terminationGracePeriodSeconds
    labels: dict[str, str] = field(default_factory=dict)  # --label KEY=VALUE: on every node pod
    pipeline: str = ""  # the pipeline's name: the node pods' app.kubernetes.io/name

    def to_json(self) -> str:
        data = {k: v for k, v in asdict(self).items() if v or k not in _OPTIONAL}
        return json.dumps(data, sort_keys=True, separators=(",", ":"))

    def extras(self) -> PodExtras:
        """The node pods' volumes, secret env and pull secrets (:mod:`components.podspec`)."""
        return PodExtras(mounts=tuple(ClaimMount(**m) for m in self.mounts),
                         secret_env=tuple(SecretEnv(**e) for e in self.secret_env),
                         pull_secrets=tuple(self.pull_secrets),
                         env=tuple(self.env.items()), grace_s=self.grace_s,
                         labels=tuple(self.labels.items()))

    @classmethod
    def from_json(cls, text: str, where: str) -> GangSpec:
        try:
            data = json.loads(text)
            if not isinstance(data, dict):
                raise TypeError("not an object")
            spec = cls(**data)
            for name in ("env", "labels", "node_selector"):  # mappings read with .items() later: checked here
                if not isinstance(getattr(spec, name, {}), dict):
                    raise TypeError(f"{name} is not an object")
            for name in ("mounts", "secret_env"):
                if not all(isinstance(x, dict) for x in getattr(spec, name)):
                    raise TypeError(f"{name} is not a list of objects")
            spec.extras()  # the volumes, secrets and labels built now: a wrong field fails here, in one line
            return spec
        except (ValueError, TypeError) as exc:
            raise InputError(f"{where}: not a gang spec as llmpack compile --nodes writes it ({exc})") from None


def spec_digest(spec: GangSpec) -> str:
    """The sha256 of the spec's canonical JSON (:meth:`GangSpec.to_json`): what compile pins for the launcher."""
    return hashlib.sha256(spec.to_json().encode()).hexdigest()


def check_compiled(spec: GangSpec, where: str, env: Mapping[str, str] | None = None) -> None:
    """Refuse a gang spec that is none of those compiled into the launcher's pod (``LLMPACK_GANG_SPECS``).

    A pod compiled without the list (without ``--nodes``) launches no gang at all (:func:`check_pinned`).
    """
    allowed = [d for d in (settings.GANG_SPECS.get(env) or "").split(",") if d]
    if not allowed:
        raise InputError(f"{where}: {UNPINNED}")
    if spec_digest(spec) not in allowed:
        raise InputError(f"{where}: not a gang spec compiled into this pipeline (image {spec.image!r}); a run may "
                         "choose only among the compiled ones: compile another with llmpack compile --nodes --image")


UNPINNED = ("this pipeline was compiled without --nodes, so its finetune runs on one node and no run may make it a "
            "TrainJob (compile one with llmpack compile --nodes N --cache-pvc PVC)")


def check_pinned(values: Mapping[str, Any], where: str, *, compiled: Mapping[str, Any] | None = None,
                 env: Mapping[str, str] | None = None) -> None:
    """Refuse a run's ``nnodes``/``trainjob`` other than 1/empty where no gang was compiled: in the step process
    (no ``LLMPACK_GANG_SPECS`` in its pod), or at submit (``compiled``: the package's defaults, ``trainjob`` empty)."""
    gang = bool(compiled.get(TRAINJOB_PARAM)) if compiled is not None else bool(settings.GANG_SPECS.get(env))
    nodes, spec = values.get(NNODES_PARAM, 1), values.get(TRAINJOB_PARAM) or ""
    if not gang and (str(nodes).strip() != "1" or spec):
        shown = f"{NNODES_PARAM}={str(nodes)[:20]!r}" + (f", {TRAINJOB_PARAM} set" if spec else "")
        raise InputError(f"{where}: {shown}: {UNPINNED}")


def spec_for(execution: Execution, *, claim: str, queue: str | None = None, pipeline: str = "") -> GangSpec:
    """The gang spec of a step whose execution asks for ``resources.nodes`` > 1 (compile side)."""
    from components.gpu_nodes import placement

    res = execution.resources
    selector, affinity = placement(execution)
    return GangSpec(image=execution.image, gpus_per_node=res.gpus, cpu=res.cpu, memory=res.memory, claim=claim,
                    gpu_type=res.gpu_type, node_selector=selector, node_affinity=affinity,
                    tolerations=[{k: v for k, v in asdict(t).items() if v is not None} for t in execution.tolerations],
                    queue=queue, active_deadline_s=execution.timeout_s,
                    mounts=[{k: v for k, v in asdict(m).items() if k != "read_only" or not v}
                            for m in execution.pod.mounts],
                    secret_env=[asdict(e) for e in execution.pod.secret_env],
                    pull_secrets=list(execution.pod.pull_secrets), env=dict(execution.pod.env),
                    grace_s=execution.pod.grace_s, labels=dict(execution.pod.labels), pipeline=pipeline)


def task_gang(pipe: Any, task: Any) -> tuple[int, GangSpec] | None:
    """``(nodes, spec)`` when ``task`` runs as a TrainJob gang with the pipeline's compiled defaults, else None.

    A gang task is a small launcher pod (:func:`launcher_execution`); what it makes the cluster
    run (``nnodes`` nodes of ``spec.gpus_per_node`` GPUs) is in its ``nnodes`` and ``trainjob``
    arguments, read here where they come from (a pipeline parameter's default, or a constant).
    """
    from components.dsl import PipelineParamRef

    def argument(name: str) -> Any:
        value = task.arguments.get(name)
        if isinstance(value, PipelineParamRef):
            param = pipe.params.get(value.name)
            return None if param is None else param.default
        return value

    nodes, spec = argument(NNODES_PARAM), argument(TRAINJOB_PARAM)
    if not isinstance(nodes, int) or nodes <= 1 or not spec:
        return None
    return nodes, GangSpec.from_json(str(spec), f"task {task.name!r} parameter {TRAINJOB_PARAM!r}")


def launcher_execution(execution: Execution, spec: GangSpec | None = None) -> Execution:
    """The orchestrator's pod for a gang step: a small CPU pod (the GPUs are the TrainJob's), with ``spec``'s
    digest in its environment: the only gang spec its ``trainjob`` parameter may be (:func:`check_compiled`)."""
    from dataclasses import replace

    from components.dsl import Resources

    pod = execution.pod
    if spec is not None:
        pinned = (settings.GANG_SPECS.name, spec_digest(spec))
        pod = replace(pod, env=(*(e for e in pod.env if e[0] != settings.GANG_SPECS.name), pinned))
    return replace(execution, resources=Resources(cpu=0.5, memory="1Gi"), node_selector={}, tolerations=(), pod=pod)


def gang_labels(spec: GangSpec, *, run_group: str, pipeline_run: str, orchestrator: str, step: str) -> dict[str, str]:
    """The node pods' labels (the TrainJob's runtimePatches), set by the launcher at run time: the
    recommended ones with ``instance`` = the pipeline run, llmpack's own, and the user's ``--label``s."""
    own = {labels.RUN_GROUP_LABEL: label_value(run_group), labels.PIPELINE_RUN_LABEL: label_value(pipeline_run),
           labels.STEP_LABEL: label_value(step), labels.ORCHESTRATOR_LABEL: label_value(orchestrator),
           labels.GPU_COUNT_LABEL: str(spec.gpus_per_node), labels.GPU_TYPE_LABEL: label_value(spec.gpu_type or "none")}
    recommended = recommended_labels(name=spec.pipeline or "llmpack", component=step, managed_by=MANAGED_BY,
                                     instance=pipeline_run)
    ours = {k: v for k, v in {**recommended, **own}.items() if v}  # a run value that makes no label: none
    return pod_labels_of(ours, {}, spec.extras())


def trainjob_name(pipeline_run: str, step: str, attempt: int) -> str:
    """An RFC 1035 name, unique per run, step and attempt, short enough for its pods' hostnames."""
    digest = hashlib.sha256(f"{pipeline_run}/{step}/{attempt}".encode()).hexdigest()[:10]
    stem = re.sub(r"[^a-z0-9-]", "-", step.lower()).strip("-")[:20] or "step"
    return f"llmpack-{stem}-{digest}"


def trainer_command(step_ref: str, inputs: Mapping[str, str], outputs: Mapping[str, str],
                    params: Mapping[str, Any]) -> list[str]:
    """``torchrun -m components.run STEP`` with the artifacts in the shared volume (no rendezvous flags)."""
    args = [f"--input={k}={v}" for k, v in inputs.items()] + [f"--output={k}={v}" for k, v in outputs.items()]
    args += [f"--param={k}={v}" for k, v in params.items()]
    return ["torchrun", "-m", "components.run", step_ref, *args]


def trainer_env(spec: GangSpec, attempt: int) -> dict[str, str]:
    """The launcher's own settings for every rank: a gang member, its step attempt, a records file per rank."""
    return {settings.LAUNCHER.name: "1", settings.ATTEMPT.name: str(attempt), settings.RANK_EVENTS.name: "1",
            "HF_HOME": spec.mount}


def build_trainjob(spec: GangSpec, *, name: str, namespace: str, nodes: int, command: Sequence[str],
                   labels: Mapping[str, str], env: Mapping[str, str]) -> dict[str, Any]:
    from components.trainjob.spec import TrainJobSpec

    return TrainJobSpec(
        name=name, namespace=namespace, image=spec.image, command=list(command), num_nodes=nodes,
        gpus_per_node=spec.gpus_per_node, cpu=spec.cpu, memory=spec.memory, runtime=spec.runtime,
        node_selector=spec.node_selector, node_affinity=spec.node_affinity,
        tolerations=tuple(Toleration(**t) for t in spec.tolerations),
        labels=dict(labels), env=dict(env), queue=spec.queue, active_deadline_s=spec.active_deadline_s,
        volume=(spec.claim, spec.mount), extras=spec.extras(),
    ).build()


def _copy_into(src: Path, dest: Path) -> None:
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(src, dest, symlinks=True)


def launch(step_ref: str, step_name: str, ctx: Any, inputs: Mapping[str, str], outputs: Mapping[str, str],
           values: Mapping[str, Any], *, nodes: int, tel: Any) -> int:
    """Run the step as a TrainJob of ``nodes`` nodes from this (launcher) process; its exit code.

    ``tel`` is the launcher's :class:`components.runtime.StepTelemetry` (its ``process_started``
    already recorded); every rank's records are merged into its events file before it returns.
    """
    from components.record.telemetry import EVENTS_FILE, read_records
    from components.trainjob import launch as trainjob_launch

    if not 1 < nodes <= MAX_NODES:
        raise InputError(f"{NNODES_PARAM}={nodes}: must be between 2 and {MAX_NODES} for a gang")
    where = f"step {step_name!r} parameter {TRAINJOB_PARAM!r}"
    spec = GangSpec.from_json(str(values.get(TRAINJOB_PARAM) or ""), where)
    check_compiled(spec, where)  # before anything is copied or created
    root = Path(spec.mount)
    if not root.is_dir():
        raise InputError(f"step {step_name!r}: the shared volume is not mounted at {root} (compile with --cache-pvc)")
    work = root / GANG_DIR / label_value(ctx.pipeline_run or "run") / f"{step_name}-{ctx.attempt}"
    gang_in = {k: str(work / "in" / k) for k in inputs}
    gang_out = {k: str(work / "out" / k) for k in outputs}
    for k, src in inputs.items():
        _copy_into(Path(src), Path(gang_in[k]))
    for k in outputs:
        shutil.rmtree(gang_out[k], ignore_errors=True)
        Path(gang_out[k]).mkdir(parents=True)
    telemetry = {"submitted_at": ctx.submitted_at, "run_group": ctx.run_group, "pipeline_run": ctx.pipeline_run,
                 "orchestrator": ctx.orchestrator, "mode": ctx.mode}
    params = {**{k: v for k, v in values.items() if k != TRAINJOB_PARAM}, **telemetry}
    labels = gang_labels(spec, run_group=ctx.run_group, pipeline_run=ctx.pipeline_run, orchestrator=ctx.orchestrator,
                         step=step_name)
    env = trainer_env(spec, ctx.attempt)
    cluster = trainjob_launch.load_config()  # the pod's service account, else a kubeconfig
    namespace = cluster.namespace
    obj = build_trainjob(spec, name=trainjob_name(ctx.pipeline_run, step_name, ctx.attempt), namespace=namespace,
                         nodes=nodes, command=trainer_command(step_ref, gang_in, gang_out, params),
                         labels=labels, env=env)
    tel.event("trainjob_created")
    result = trainjob_launch.create_and_wait(obj, namespace=namespace, api=cluster.api)
    first = next(iter(outputs))
    ranks = sorted(Path(gang_out[first]).glob("llmpack-events.rank*.jsonl"))
    for rec in read_records(ranks):  # each rank's own file, into the step's events
        tel.log.append(rec)
    for path in ranks:
        path.unlink()
    for k, dest in outputs.items():
        for item in Path(gang_out[k]).iterdir():
            target = Path(dest) / item.name
            if item.name == EVENTS_FILE:
                continue
            if item.is_dir():
                _copy_into(item, target)
            else:
                shutil.copy2(item, target)
    if result.succeeded:
        shutil.rmtree(work, ignore_errors=True)  # failed attempts stay for inspection
        try:
            work.parent.rmdir()  # the run's directory, when no other step of it is there
        except OSError:
            pass
    print(f"{step_name}: TrainJob {namespace}/{obj['metadata']['name']} {result.describe()}", flush=True)
    return result.exit_code


def rank_events_file(first_out: Path, rank: int) -> Path:
    """Where rank ``rank`` of a gang writes its records (``settings.RANK_EVENTS.name``)."""
    return first_out / f"llmpack-events.rank{rank}.jsonl"


def ranks_write_own_files(env: Mapping[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    return env.get(settings.RANK_EVENTS.name) == "1"
