"""A step started before its orchestrator's run existed learns that run here, before it uploads.

An MLflow project's ``main`` starts the pipeline's first step before it imports MLflow
(:mod:`mlflow_projects.first_step`), so the step's child run and the pipeline record's tags do
not exist yet when the step starts. ``main`` writes the child run's id to the file named by
``LLMPACK_RUN_ID_FILE`` once both exist. The step waits for it (bounded by
``LLMPACK_TRACKING_MAX_WAIT_S``) before its records go to MLflow, so they never land before the
record they belong to is marked as the pipeline's (else the upload would open a record of its
own), and sets ``MLFLOW_RUN_ID`` as MLflow's local backend would have. Without the variable this
is a no-op: every other step starts after its run exists.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from components import settings

POLL_S = 0.05


def await_run_id() -> str | None:
    """The run id ``main`` handed over (also set as ``MLFLOW_RUN_ID``), or None: none asked, or none came in time."""
    name = settings.RUN_ID_FILE.get()
    if not name:
        return None
    path = Path(name)
    deadline = time.monotonic() + (settings.TRACKING_MAX_WAIT_S.get() or 0.0)
    while True:
        try:
            run_id = path.read_text(encoding="utf-8").strip()
        except OSError:
            run_id = ""
        if run_id:
            os.environ["MLFLOW_RUN_ID"] = run_id
            return run_id
        if time.monotonic() >= deadline:
            return None
        time.sleep(POLL_S)
