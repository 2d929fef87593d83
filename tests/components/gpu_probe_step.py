"""A GPU step for tests/components/test_gpu_metrics.py: idle a while, then "kernels" start, then the first step.

It touches ``busy_marker`` (the stand-in nvidia-smi then reads busy) and writes when it did into
``<out>/busy_at``, so the test can hold the idle time the sampler measured against it.
"""

from __future__ import annotations

import time
from pathlib import Path

from components import Dataset, Output, step
from components.dsl import Execution, Resources
from components.reporting import emit


@step(execution=Execution(resources=Resources(cpu=1, memory="1Gi", gpu_type="nvidia-h100-80gb", gpus=1)))
def gpu_probe(out: Output[Dataset], busy_marker: str = "", idle_s: float = 0.8, busy_s: float = 0.5) -> None:
    time.sleep(idle_s)  # loading: the GPU idle
    busy_at = time.time()
    if busy_marker:
        Path(busy_marker).touch()
    (Path(out.path) / "busy_at").write_text(repr(busy_at), encoding="utf-8")
    time.sleep(busy_s)  # the first optimizer step's kernels
    emit("first_step")
    time.sleep(0.2)
