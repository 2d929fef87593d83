"""The ``llmpack.io/*`` labels, in one place: every step pod, Workflow, Job and TrainJob node pod carries them
(docs/telemetry-and-cost.md), and the cluster lab selects and reads pods by them."""

from __future__ import annotations

LABEL_PREFIX = "llmpack.io/"
RUN_GROUP_LABEL = f"{LABEL_PREFIX}run-group"
PIPELINE_RUN_LABEL = f"{LABEL_PREFIX}pipeline-run"
ORCHESTRATOR_LABEL = f"{LABEL_PREFIX}orchestrator"
MODE_LABEL = f"{LABEL_PREFIX}mode"
STEP_LABEL = f"{LABEL_PREFIX}step"
TASK_LABEL = f"{LABEL_PREFIX}task"
PIPELINE_LABEL = f"{LABEL_PREFIX}pipeline"
GPU_TYPE_LABEL = f"{LABEL_PREFIX}gpu-type"
GPU_COUNT_LABEL = f"{LABEL_PREFIX}gpu-count"
TRAINJOB_MANAGER = f"{LABEL_PREFIX}trainjob"  # the field manager of the launcher's TrainJob patches
