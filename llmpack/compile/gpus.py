"""The GPU flags (``--gpu-type``, ``--gpus``, ``--nodes``, ``--nproc-per-node``) applied to a copy of the pipeline.

One rule for ``llmpack compile``, ``llmpack run`` and ``compare``: what is compiled is what runs
locally, so the run room imports this from the compile room, never the other way round.
"""

from __future__ import annotations

from dataclasses import replace

from components.dsl import Pipeline
from components.errors import InputError
from components.record.telemetry import TRAIN_STEP
from llmpack.gpu_catalogue import resources_for_gpus


def apply_gpu_overrides(pipe: Pipeline, gpu_type: str | None, gpus: int | None, nodes: int | None = None,
                        train_gpus: int | None = None) -> Pipeline:
    """The GPU flags on a copy of the pipeline (the pipeline itself is untouched).

    ``--gpu-type`` applies to every GPU step. ``--gpus G`` is the training step's GPUs per node
    (one rank each); the other GPU steps keep their spec's count (evaluate runs one process), and
    ``--gpus 0`` puts every GPU step on CPUs. ``--nodes N`` is the training step's node count.
    ``train_gpus`` (``--nproc-per-node`` without ``--gpus``: one GPU per rank) also sets the
    training step's count. A pod's CPUs and memory follow its GPUs
    (:func:`llmpack.gpu_catalogue.resources_for_gpus`).
    """
    if gpu_type is None and gpus is None and nodes is None and train_gpus is None:
        return pipe
    if gpu_type is not None and not any(t.step.execution.resources.gpus > 0 for t in pipe.tasks.values()):
        raise InputError(f"--gpu-type {gpu_type}: pipeline {pipe.name!r} has no step that asks for a GPU "
                         "(it would place and price nothing); drop --gpu-type")
    want = gpus if gpus is not None else train_gpus
    tasks = {}
    for name, task in pipe.tasks.items():
        res = task.step.execution.resources
        if res.gpus > 0:
            res = replace(res, gpu_type=gpu_type or res.gpu_type)
            if want == 0 or (want is not None and name == TRAIN_STEP):
                res = resources_for_gpus(res, want)  # CPUs and memory per GPU, times the GPUs
            if res.gpus == 0:
                res = replace(res, gpu_type=None)
        if name == TRAIN_STEP and nodes is not None:
            res = replace(res, nodes=nodes)
        if res != task.step.execution.resources:
            task = replace(task, step=replace(task.step, execution=replace(task.step.execution, resources=res)))
        tasks[name] = task
    return replace(pipe, tasks=tasks).validate()
