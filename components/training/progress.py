"""Live progress of a training step: ``llmpack-progress.json`` beside the step's events.

Step k of N, tokens/s and ETA, so ``llmpack`` shows the same live progress whichever
orchestrator ran the step.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from components import bounded
from components.training.trainer_status import TrainerStatus, status_body

PROGRESS_FILE = "llmpack-progress.json"


class ProgressFile:
    """Step k of N, tokens/s and ETA in a tiny JSON file, replaced atomically at most every ``every_s``.

    The throttle and the missing fsync are deliberate: a watcher only needs a recent value, and
    the loop must not wait on the disk.
    """

    def __init__(self, path: Path, *, start_step: int, max_steps: int, every_s: float = 0.5,
                 status: TrainerStatus | None = None, submitted_at: float | None = None) -> None:
        self.path, self.start_step, self.max_steps, self.every_s = path, start_step, max_steps, every_s
        self.status = status  # the TrainJob's status server, when the Trainer injected one
        self.submitted_at = submitted_at
        self.first_step_s: float | None = None
        self.written_at = -math.inf
        self._write({"step": start_step, "max_steps": max_steps, "tokens_per_s": None, "eta_s": None})

    def update(self, step_no: int, tokens: int, elapsed_s: float, loss: float | None = None) -> None:
        """Record ``step_no`` steps done; written only when ``every_s`` has passed, and at the last step.

        The Trainer's status server (when there is one) gets the same state, with the loss and the
        time to first step, on its own throttle; its first and last updates are always sent."""
        first = self.first_step_s is None
        if first and self.submitted_at:
            self.first_step_s = time.time() - self.submitted_at
        elif first:
            self.first_step_s = math.nan
        last = step_no >= self.max_steps
        file_due = last or time.monotonic() - self.written_at >= self.every_s
        if not file_due and self.status is None:
            return
        s_per_step = elapsed_s / max(1, step_no - self.start_step)
        state = {"step": step_no, "max_steps": self.max_steps,
                 "tokens_per_s": tokens / elapsed_s if elapsed_s > 0 else None,
                 "eta_s": s_per_step * (self.max_steps - step_no)}
        if file_due:
            self._write(state)
        if self.status is not None:
            metrics: dict[str, float | int] = {"step": step_no}
            if loss is not None and math.isfinite(loss):
                metrics["loss"] = loss
            if state["tokens_per_s"] is not None:
                metrics["tokens_per_s"] = state["tokens_per_s"]
            if self.first_step_s is not None and math.isfinite(self.first_step_s):
                metrics["time_to_first_step_s"] = self.first_step_s
            self.status.update(status_body(percent=int(100 * step_no / max(1, self.max_steps)), eta_s=state["eta_s"],
                                           metrics=metrics), force=first or last)

    def close(self) -> None:
        """The status server's last update sent (bounded), its thread stopped."""
        if self.status is not None:
            self.status.close()

    def _write(self, state: dict[str, Any]) -> None:
        # a reader sees the old file or the new one, never half of one; never written through a planted link
        bounded.write_atomic(self.path, json.dumps({**state, "updated_at": time.time()}).encode())
        self.written_at = time.monotonic()
