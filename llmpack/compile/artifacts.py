"""``llmpack compile``: every backend's native artifacts, from the one pipeline object.

Each backend of the registry (:mod:`llmpack.backends`) writes its own (``Backend.compile``).
Written into a temporary directory first and moved into place only when all compiled,
so a failure never leaves a half-written set.

Where (decision): ``--out`` defaults to :data:`DEFAULT_OUT` (``build/llmpack``, gitignored), never
the checkout itself, because the committed artifacts there are golden files: a compile with
``--image`` over them made ``make test`` fail. Regenerating the committed copies is explicit:
``llmpack compile --out .`` (or ``make golden``). The MLflow project records its paths as typed
from the directory ``llmpack compile`` runs in (``mlflow_projects.compiler``, "Where ``mlflow
run`` is typed"): ``--out build/llmpack`` gives ``build/llmpack/mlflow_projects/...``.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from components import settings
from components.backend import DEFAULT_NAMESPACE
from components.dsl import Pipeline
from components.errors import InputError

# check_image, IMAGE_REF: importable here too
from llmpack.compile.pod_options import IMAGE_REF, POD_FLAGS, PodOptions, check_image  # noqa: F401

DEFAULT_OUT = Path("build/llmpack")


def _check_out(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out}: exists and is not a directory")
    probe = out if out.exists() else next((p for p in out.parents if p.exists()), Path("."))
    if not os.access(probe, os.W_OK):
        raise InputError(f"--out {out}: directory {probe} is not writable")


# A PersistentVolumeClaim name: a DNS-1123 subdomain.
PVC_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def check_cache_pvc(name: str) -> None:
    """``--cache-pvc`` must be a PersistentVolumeClaim name (a DNS-1123 subdomain)."""
    if len(name) > 253 or not PVC_NAME.fullmatch(name):
        raise InputError(f"--cache-pvc {name!r}: not a PersistentVolumeClaim name "
                         "(lower-case letters, digits, '-' and '.')")


def check_cache_mount(pod: PodOptions | None, cache_pvc: str | None) -> None:
    """A ``--model-pvc``/``--data-pvc``/``--checkpoint-pvc`` mount at the Hugging Face cache's path, with
    ``--cache-pvc`` mounting that cache: two volumes at one path, which the API server refuses at pod creation."""
    from components.dsl import HF_CACHE_MOUNT

    if pod is None or cache_pvc is None:
        return
    for flag, claim in (("--model-pvc", pod.model_pvc), ("--data-pvc", pod.data_pvc),
                        ("--checkpoint-pvc", pod.checkpoints.claim)):
        if claim is not None and claim.path == HF_CACHE_MOUNT:
            raise InputError(f"{flag} {claim.claim}:{claim.path} with --cache-pvc {cache_pvc}: both mount at "
                             f"{HF_CACHE_MOUNT} (the Hugging Face cache); give {flag} another path (NAME:/PATH)")


def check_trainer_version(pod: PodOptions | None, nodes: int | None) -> None:
    """``--trainer-version 2.2`` with a TrainJob whose node pods need a grace period: Trainer v2.2's
    ``runtimePatches`` pod spec has no ``terminationGracePeriodSeconds`` (its CRD refuses the field)."""
    if pod is None or pod.trainer_version != "2.2" or (nodes or 1) < 2 or pod.checkpoints.grace_s is None:
        return
    raise InputError("--trainer-version 2.2: its TrainJob has no terminationGracePeriodSeconds, which "
                     "--checkpoint-pvc/--grace-period/--checkpoint-save-s set on the node pods; install Trainer 2.3 "
                     "(--trainer-version 2.3) or drop those flags")


def with_cache_pvc(pipe: Pipeline, name: str) -> Pipeline:
    """A copy of the pipeline whose steps that load from the Hugging Face cache mount PVC ``name`` as it."""
    check_cache_pvc(name)
    tasks = {
        tname: replace(t, step=replace(t.step, execution=replace(t.step.execution, cache_pvc=name)))
        if t.step.execution.hf_cache else t
        for tname, t in pipe.tasks.items()
    }
    return replace(pipe, tasks=tasks)


TRAINJOB_FILE = Path("trainjob/finetune-trainjob.yaml")
# The launcher's ServiceAccount, Role and RoleBinding (components.trainjob.launch.launcher_rbac).
RBAC_FILE = Path("trainjob/launcher-rbac.yaml")
EXAMPLE_RUN = "example-run"  # the run id in the written TrainJob (each run names its own)


def with_gpus(pipe: Pipeline, gpus: int | None, nodes: int | None, *, claim: str | None = None,
              queue: str | None = None, gpu_type: str | None = None) -> Pipeline:
    """A copy of the pipeline whose finetune step asks for ``gpus`` GPUs of ``gpu_type`` on each of ``nodes`` nodes.

    ``gpu_type`` (``--gpu-type``: a known type's id or short name, :mod:`llmpack.gpu_catalogue`)
    is every GPU step's type: their pods select its nodes (:mod:`components.gpu_nodes`), their
    ``llmpack.io/gpu-type`` label and the summarizing task's price are its. A pod's CPUs and
    memory follow its GPUs (:func:`llmpack.gpu_catalogue.resources_for_gpus`).

    Above one GPU the finetune pod runs one rank per GPU: the compiled ``nproc_per_node``
    parameter defaults to ``gpus`` (components.training.distributed launches torchrun in the pod). Above
    one node the finetune task is a small launcher pod that creates a TrainJob of ``nodes`` such
    pods (components.trainjob.gang): the ``nnodes`` and ``trainjob`` parameters default to them, and the
    shared volume is ``claim`` (``--cache-pvc``).
    """
    from components.training import distributed
    from llmpack.compile.gpus import apply_gpu_overrides
    from llmpack.gpu_catalogue import resolve_gpu_type

    if gpu_type is not None:
        gpu_type = resolve_gpu_type(gpu_type)
    if gpus is not None and gpus < 1:
        raise InputError(f"--gpus {gpus}: the finetune pod needs at least 1 GPU")
    if gpus is not None:
        distributed.check_nproc(gpus, "--gpus")
    if nodes is not None and nodes < 1:
        raise InputError(f"--nodes {nodes}: must be >= 1")
    if queue is not None and not (nodes and nodes > 1):
        raise InputError(f"--queue {queue}: Kueue admits the finetune TrainJob; give --nodes 2 or more")
    if nodes is not None and nodes > 1 and claim is None:
        raise InputError(f"--nodes {nodes}: the TrainJob's node pods and the launcher share the run's data through a "
                         "ReadWriteMany PersistentVolumeClaim; pass --cache-pvc NAME")
    check_training_flags(pipe, gpus, nodes)
    pipe = apply_gpu_overrides(pipe, gpu_type, gpus, nodes)
    defaults: dict[str, object] = {}
    if gpus is not None and gpus > 1:
        defaults[distributed.NPROC_PARAM] = gpus
    if nodes is not None and nodes > 1:
        from components.record.telemetry import TRAIN_STEP
        from components.trainjob import gang

        task = pipe.tasks[TRAIN_STEP]
        execution = replace(task.step.execution, cache_pvc=claim)
        spec = gang.spec_for(execution, claim=claim or "", queue=queue, pipeline=pipe.name)
        launcher = replace(task, step=replace(task.step, execution=gang.launcher_execution(execution, spec)))
        pipe = replace(pipe, tasks={**pipe.tasks, TRAIN_STEP: launcher})
        defaults.update({gang.NNODES_PARAM: nodes, gang.TRAINJOB_PARAM: spec.to_json()})
    for name, value in defaults.items():
        pipe = replace(pipe, params={**pipe.params, name: replace(pipe.params[name], default=value)})
    return pipe


def check_training_flags(pipe: Pipeline, gpus: int | None, nodes: int | None) -> None:
    """``--gpus N``/``--nodes N`` (above 1) size the pipeline's ``finetune`` task through its parameters
    (``nproc_per_node``; ``nnodes``, ``trainjob``): a pipeline without them refuses the flag in one line,
    as an unknown ``--param`` is refused."""
    from components.binding import unknown_parameter
    from components.record.telemetry import TRAIN_STEP
    from components.training import distributed
    from components.trainjob import gang

    for flag, value, needs in (("--gpus", gpus, (distributed.NPROC_PARAM,)),
                               ("--nodes", nodes, (gang.NNODES_PARAM, gang.TRAINJOB_PARAM))):
        if value is None or value <= 1:
            continue
        if TRAIN_STEP not in pipe.tasks:
            raise InputError(f"{flag} {value}: pipeline {pipe.name!r} has no {TRAIN_STEP!r} task for it to size "
                             f"(its tasks: {', '.join(pipe.tasks)})")
        for name in needs:
            if name not in pipe.params:
                raise unknown_parameter(pipe.params, name, "--param", {name: f"{flag} {value}"})


def trainjob_yaml(pipe: Pipeline, *, namespace: str = DEFAULT_NAMESPACE) -> str:
    """The TrainJob the finetune launcher creates, with an example run's values (components.trainjob.gang)."""
    from components.finetune_pipeline import build
    from components.trainjob import gang
    from components.trainjob.spec import to_yaml

    values = {name: p.default for name, p in pipe.params.items()}
    spec = gang.GangSpec.from_json(values[gang.TRAINJOB_PARAM], "--nodes")
    work = Path(spec.mount) / gang.GANG_DIR / EXAMPLE_RUN / "finetune-0"
    step = build().tasks["finetune"]
    params = {k: (values[a.name] if hasattr(a, "name") and a.name in values else a)
              for k, a in step.arguments.items() if k in step.step.params and k != gang.TRAINJOB_PARAM}
    params.update({"run_group": EXAMPLE_RUN, "pipeline_run": EXAMPLE_RUN})
    command = gang.trainer_command("components.steps.finetune:finetune", {"tokens": str(work / "in" / "tokens")},
                                   {"model": str(work / "out" / "model")}, params)
    labels = gang.gang_labels(spec, run_group=EXAMPLE_RUN, pipeline_run=EXAMPLE_RUN, orchestrator="", step="finetune")
    env = {settings.LAUNCHER.name: "1", settings.ATTEMPT.name: "0", settings.RANK_EVENTS.name: "1",
           "HF_HOME": spec.mount}
    obj = gang.build_trainjob(spec, name=gang.trainjob_name(EXAMPLE_RUN, "finetune", 0), namespace=namespace,
                              nodes=int(values[gang.NNODES_PARAM]), command=command, labels=labels, env=env)
    return ("# The TrainJob the finetune launcher creates for one run "
            "(llmpack compile --nodes; components/trainjob/gang.py).\n"
            f"# Run values are an example's ({EXAMPLE_RUN}, namespace {namespace}): each run names its own.\n"
            + to_yaml(obj))


def compile_all(out: Path, pipe: Pipeline | None = None, *, image: str | None = None, fuse: str = "none",
                prepull: bool = False, cache_pvc: str | None = None, gpus: int | None = None,
                nodes: int | None = None, queue: str | None = None, gpu_type: str | None = None,
                pod: PodOptions | None = None) -> list[Path]:
    """Compile every backend's artifacts (KFP, Argo, MLflow...) under ``out``; returns the files written.

    ``fuse`` (:mod:`components.fusion`): ``gpu`` or ``all`` compiles fewer tasks (pods) that run
    the same steps; the artifacts keep their file names, so write them to their own ``--out``.
    ``prepull`` also writes the image pre-pull DaemonSet (:mod:`llmpack.compile.prepull`).
    ``gpus``/``nodes``/``gpu_type`` size and place the GPU steps (:func:`with_gpus`); above one node the TrainJob
    (:data:`TRAINJOB_FILE`) and the launcher's RBAC (:data:`RBAC_FILE`) are written too.
    ``cache_pvc`` mounts that PersistentVolumeClaim as the Hugging Face cache (HF_HOME) on every
    step that loads a model, tokenizer or dataset (:func:`with_cache_pvc`).
    """
    from components.fusion import check_mode
    from components.fusion import fuse as fuse_steps

    out = Path(out)
    _check_out(out)
    check_mode(fuse)
    if image is not None:
        pod = replace(pod or PodOptions(), image=image)
    if pod is not None and pod.image is not None:
        check_image(pod.image)  # before the compilers' slow imports: bad input fails at once
    if cache_pvc is not None:
        check_cache_pvc(cache_pvc)
        check_cache_mount(pod, cache_pvc)
    check_trainer_version(pod, nodes)
    if gpu_type is not None:
        from llmpack.gpu_catalogue import resolve_gpu_type

        gpu_type = resolve_gpu_type(gpu_type)

    from components.finetune_pipeline import build
    from llmpack.backends import BACKENDS, backend

    if (gpus or 1) > 1 and fuse != "none":
        raise InputError(f"--gpus {gpus} with --fuse {fuse}: the many-process finetune runs unfused; drop --fuse")
    if (nodes or 1) > 1 and fuse != "none":
        raise InputError(f"--nodes {nodes} with --fuse {fuse}: the TrainJob's finetune runs unfused; drop --fuse")
    if (nodes or 1) > 1 and pod is not None and pod.pull_policy:
        from components.podspec import default_pull_policy

        kube_default = default_pull_policy(pod.image or (pipe or build()).tasks["finetune"].step.execution.image)
        if pod.pull_policy != kube_default:  # every pod on every path pulls the same way, or the flag is refused
            raise InputError(f"--image-pull-policy {pod.pull_policy} with --nodes {nodes}: a TrainJob's trainer has no "
                             f"pull policy (Kubeflow Trainer v2.3), so its node pods pull as Kubernetes defaults for "
                             f"the image ({kube_default}); drop the flag or use an image reference that defaults to it")
    pipe = pipe or build()
    if pod is not None:  # first: the gang spec (with_gpus) and fused pods carry the image, volumes and secrets
        pipe = pod.apply(pipe)
    pipe = fuse_steps(with_gpus(pipe, gpus, nodes, claim=cache_pvc, queue=queue, gpu_type=gpu_type), fuse)
    if cache_pvc is not None:
        pipe = with_cache_pvc(pipe, cache_pvc)
    created = [p for p in (out, *out.parents) if not p.exists()]  # removed again if nothing lands in them
    try:
        out.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".llmpack-compile-", dir=out))
    except OSError as exc:
        _remove_empty(created)
        raise InputError(f"--out {out}: cannot write there ({exc.strerror})") from None
    try:
        try:
            for name in BACKENDS:  # each writes its own artifacts (components.backend.Backend.compile)
                backend(name).compile(pipe, tmp, final_dir=out, **artifact_settings(name, pod))
            if (nodes or 1) > 1:  # the TrainJob lands where the launcher runs: the RBAC's namespace
                from components.trainjob.launch import launcher_rbac_yaml

                namespace = (pod and pod.namespace) or DEFAULT_NAMESPACE
                (tmp / TRAINJOB_FILE).parent.mkdir(parents=True, exist_ok=True)
                (tmp / TRAINJOB_FILE).write_text(trainjob_yaml(pipe, namespace=namespace))
                (tmp / RBAC_FILE).write_text(launcher_rbac_yaml(namespace=namespace))
            if prepull:
                from llmpack.compile.prepull import PREPULL_FILE, daemonset_yaml

                (tmp / PREPULL_FILE).parent.mkdir(parents=True, exist_ok=True)
                (tmp / PREPULL_FILE).write_text(daemonset_yaml(
                    pipe, **({"namespace": pod.namespace} if pod and pod.namespace else {})))
        except OSError as exc:  # a full disk or a quota: nothing has reached ``out`` yet
            shutil.rmtree(tmp, ignore_errors=True)
            _remove_empty(created)
            raise InputError(f"--out {out}: cannot write the compiled artifacts ({exc.strerror or exc}); "
                             "nothing was written") from None
        from llmpack.compile import signatures

        files = sorted(p for p in tmp.rglob("*") if p.is_file())
        signed = signatures.sign(tmp, files)  # what --plan trusts: the user's key over what was written, here
        written = []
        for src in files:
            dest = out / src.relative_to(tmp)
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(src, dest)
            written.append(dest)
        if isinstance(signed, str):
            print(f"llmpack: warning: {signed}", file=sys.stderr)
        else:
            signatures.save(out, signed)
        return written
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def compile_warnings(pod: PodOptions | None, *, nodes: int | None, gpus: int | None,
                     env: Mapping[str, str] | None = None) -> list[str]:
    """The lines ``llmpack compile`` prints on stderr before its note: what compiles but is likely a mistake.

    ``--nodes`` past ``LLMPACK_NODES_WARN`` (default 64), and an ``--image`` with no tag or digest: Kubernetes
    pulls it ``Always`` and runs whatever the registry's ``latest`` is at each pod start.
    """
    out = []
    limit = settings.NODES_WARN.get(env)
    if nodes is not None and limit is not None and nodes > limit:
        out.append(f"llmpack: warning: --nodes {nodes} (x --gpus {gpus or 1} = {nodes * (gpus or 1)} GPUs) is past "
                   f"{limit} nodes; check the number (set {settings.NODES_WARN.name} to move this warning)")
    image = pod.image if pod is not None else None
    if image and "@" not in image and not image.rsplit("/", 1)[-1].partition(":")[2]:
        out.append(f"llmpack: warning: --image {image} has no tag or digest: every pod pulls it Always and runs "
                   "whatever 'latest' is then; pin a tag or, better, a digest (repo@sha256:...)")
    return out


def checkpoint_note(pod: PodOptions, pipe: Pipeline | None = None) -> str | None:
    """The one line ``llmpack compile`` prints on stderr: the checkpoint policy compiled, or that finetune's
    checkpoints die with its pod; none for a pipeline (``pipe``, default the shipped one) without finetune."""
    from components.record.telemetry import TRAIN_STEP

    if pipe is not None and TRAIN_STEP not in pipe.tasks:
        return None
    ckpt = pod.checkpoints
    if ckpt.claim is not None:
        return (f"llmpack: note: finetune checkpoints to --checkpoint-pvc {ckpt.claim.claim} "
                f"every {ckpt.minutes:g} min (--checkpoint-minutes), every checkpoint_every steps and on SIGTERM; "
                "a retry resumes from the newest")
    return ("llmpack: note: no --checkpoint-pvc: finetune's checkpoints stay in its pod, so an orchestrator retry "
            "restarts training from step 0 (docs/preemption.md)")


def artifact_settings(backend_name: str, pod: PodOptions | None) -> dict[str, Any]:
    """What a backend's compile takes beyond the pipeline: the pod options it declares (``compile_options``),
    when given."""
    from llmpack.backends import backend

    if pod is None:
        return {}
    return {k: v for k in backend(backend_name).compile_options if (v := getattr(pod, k))}


def _remove_empty(created: list[Path]) -> None:
    """Remove the directories this compile created (innermost first) while they are empty."""
    for path in created:
        try:
            path.rmdir()
        except OSError:
            return


@contextmanager
def compiled_for_submit(orchestrator: str, gpu_type: str | None, options: Mapping[str, Any], *,
                        pod: PodOptions | None = None,
                        values: Mapping[str, Any] | None = None) -> Iterator[dict[str, str]]:
    """``llmpack cluster submit ORCH --gpu-type T`` (``--image``, ``--model-pvc``...): its artifact compiled for them.

    Yields the submit options to add: the one naming the compiled artifact (``package_path``,
    ``workflow_path``, ``project_dir``), or nothing when no flag asks for a compile; the directory
    is removed when the submission is done. A compiled artifact fixes its GPU type and pod spec,
    so these flags with one named too are refused, except ``--image`` on a path whose submit takes
    an image itself (MLflow's Job). ``values``' ``--model``/``--data`` under ``/models``/``/data``
    need their volume compiled in (:meth:`PodOptions.check_mounted`).
    """
    from llmpack.backends import cluster_paths

    pod = pod or PodOptions()
    path = cluster_paths()[orchestrator]
    named = options.get(path.artifact_option)
    if not named:  # the committed artifact or the one compiled now: its volumes are pod's
        for key in ("model", "data"):
            pod.check_mounted((values or {}).get(key), f"--{key}")
    flag = f"--{path.artifact_option.replace('_path', '').replace('_dir', '')}"
    if named and pod.compiles:
        if replace(pod, image=None, pull_policy=None) == PodOptions() and "image" in path.submit_options:
            yield {"image": pod.image} if pod.image else {}  # MLflow: the Job's image, given with the project
            return
        raise InputError(f"{POD_FLAGS}: compile the {orchestrator} "
                         f"artifact to submit; not with {flag} (compile it with `llmpack compile` and those flags, "
                         "and submit that instead)")
    if gpu_type is None and not pod.compiles:
        yield {}
        return
    if gpu_type is not None:
        from llmpack.gpu_catalogue import resolve_gpu_type

        gpu_type = resolve_gpu_type(gpu_type)
        if named:
            raise InputError(f"--gpu-type {gpu_type}: compiles the {orchestrator} artifact to submit; not with {flag} "
                             "(compile it with `llmpack compile --gpu-type` and submit that instead)")
    tmp = Path(tempfile.mkdtemp(prefix="llmpack-submit-"))
    try:
        compile_all(tmp / "out", gpu_type=gpu_type, pod=pod)
        yield {path.artifact_option: str(tmp / "out" / path.artifact_path)}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def shipped_artifact(orchestrator: str) -> Path:
    """The committed artifact ``llmpack cluster submit ORCH`` sends when no file is named (``--package``,
    ``--workflow``, ``--project``): where ``llmpack compile --out`` of the install's root put it."""
    import components
    from llmpack.backends import cluster_paths

    return Path(components.__file__).resolve().parent.parent / cluster_paths()[orchestrator].artifact_path
