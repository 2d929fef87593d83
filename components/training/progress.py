"""Live progress of a training step: ``llmpack-progress.json`` beside the step's events.

Step k of N, tokens/s and ETA, so ``llmpack`` shows the same live progress whichever
orchestrator ran the step.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

PROGRESS_FILE = "llmpack-progress.json"


class ProgressFile:
    """Step k of N, tokens/s and ETA in a tiny JSON file, replaced atomically at most every ``every_s``.

    The throttle and the missing fsync are deliberate: a watcher only needs a recent value, and
    the loop must not wait on the disk.
    """

    def __init__(self, path: Path, *, start_step: int, max_steps: int, every_s: float = 0.5) -> None:
        self.path, self.start_step, self.max_steps, self.every_s = path, start_step, max_steps, every_s
        self.written_at = -math.inf
        self._write({"step": start_step, "max_steps": max_steps, "tokens_per_s": None, "eta_s": None})

    def update(self, step_no: int, tokens: int, elapsed_s: float) -> None:
        """Record ``step_no`` steps done; written only when ``every_s`` has passed, and at the last step."""
        if time.monotonic() - self.written_at < self.every_s and step_no < self.max_steps:
            return
        s_per_step = elapsed_s / max(1, step_no - self.start_step)
        self._write({"step": step_no, "max_steps": self.max_steps,
                     "tokens_per_s": tokens / elapsed_s if elapsed_s > 0 else None,
                     "eta_s": s_per_step * (self.max_steps - step_no)})

    def _write(self, state: dict[str, Any]) -> None:
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(json.dumps({**state, "updated_at": time.time()}))
        os.replace(tmp, self.path)  # a reader sees the old file or the new one, never half of one
        self.written_at = time.monotonic()
