"""Live progress from the steps' own files under the run's staging directory: the same signal for every backend.

Every step writes its JSONL events beside its first output, whichever orchestrator runs it, and
the training step also keeps ``llmpack-progress.json`` there (step k of N, tokens/s, ETA). Both
are found by walking the staging directory, so direct, kfp, argo and mlflow runs show the same
line: ``finetune 23/60 · 1,234 tok/s · ETA 0:12``.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from components.record.telemetry import find_event_files, group_by_step, read_records
from components.training.progress import PROGRESS_FILE


@dataclass(frozen=True, kw_only=True)
class TrainProgress:
    """What the training step last wrote: ``step`` of ``max_steps`` done at ``updated_at`` (epoch s)."""

    step: int
    max_steps: int
    tokens_per_s: float | None
    eta_s: float | None
    updated_at: float


def read_train_progress(path: Path) -> TrainProgress | None:
    """The progress file at ``path``, or None when it is absent or not (yet) a progress file."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        return TrainProgress(
            step=int(raw["step"]),
            max_steps=int(raw["max_steps"]),
            tokens_per_s=None if raw.get("tokens_per_s") is None else float(raw["tokens_per_s"]),
            eta_s=None if raw.get("eta_s") is None else float(raw["eta_s"]),
            updated_at=float(raw["updated_at"]),
        )
    except (OSError, ValueError, TypeError, KeyError):
        return None


def clock(seconds: float) -> str:
    """``0:12``, ``12:34``, ``1:02:03``."""
    minutes, secs = divmod(int(round(max(0.0, seconds))), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def format_train(step: str, p: TrainProgress, now: float) -> str:
    """``finetune 23/60 · 1,234 tok/s · ETA 0:12``; the ETA counts down between the step's writes."""
    parts = [f"{step} {p.step}/{p.max_steps}"]
    if p.tokens_per_s is not None:
        parts.append(f"{p.tokens_per_s:,.0f} tok/s")
    if p.eta_s is not None:
        parts.append(f"ETA {clock(p.eta_s - max(0.0, now - p.updated_at))}")
    return " · ".join(parts)


def current_step(root: Path, now: float | None = None) -> tuple[str, int]:
    """(what to show, how many steps finished) under ``root``.

    What to show: the training step's ``finetune 23/60 · 1,234 tok/s · ETA 0:12`` while it reports
    them, else the step running now and how many finished, else the last one finished.
    """
    try:
        files = find_event_files(root)
        steps = group_by_step(read_records(files))
    except (OSError, ValueError, TypeError):
        return "", 0
    done = [s for s in steps.values() if "finished" in s.events]
    running = [s for s in steps.values() if "finished" not in s.events and "process_started" in s.events]
    if running:
        step = running[-1].step
        progress = _progress_of(step, files)
        if progress is None:
            return f"{step} · {len(done)} steps done", len(done)
        return format_train(step, progress, time.time() if now is None else now), len(done)
    if done:
        return max(done, key=lambda s: s.events["finished"]).step + " done", len(done)
    return "starting", 0


def _progress_of(step: str, event_files: list[Path]) -> TrainProgress | None:
    """The newest progress file beside one of ``step``'s event files (retries may leave several)."""
    found = []
    for events in event_files:
        progress = read_train_progress(events.parent / PROGRESS_FILE)
        if progress is not None and any(r.step == step for r in read_records([events])):
            found.append(progress)
    return max(found, key=lambda p: p.updated_at, default=None)


@contextmanager
def watch(root: Path, update: Callable[[str, int, float], None], interval: float = 0.3) -> Iterator[None]:
    """Call ``update(what, steps_done, elapsed_s)`` every ``interval`` while the block runs (as :func:`current_step`)."""
    stop = threading.Event()
    t0 = time.monotonic()

    def loop() -> None:
        while not stop.wait(interval):
            step, done = current_step(root)
            update(step, done, time.monotonic() - t0)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
