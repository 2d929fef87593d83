"""Live progress from the steps' own JSONL events: the same signal for every backend."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from components.telemetry import find_event_files, group_by_step, read_records


def current_step(root: Path) -> tuple[str, int]:
    """(the step running now, or the last one finished; how many steps finished) under ``root``."""
    try:
        steps = group_by_step(read_records(find_event_files(root)))
    except (OSError, ValueError, TypeError):
        return "", 0
    done = [s for s in steps.values() if "finished" in s.events]
    running = [s for s in steps.values() if "finished" not in s.events and "process_started" in s.events]
    if running:
        return running[-1].step, len(done)
    if done:
        return max(done, key=lambda s: s.events["finished"]).step + " done", len(done)
    return "starting", 0


@contextmanager
def watch(root: Path, update: Callable[[str, int, float], None], interval: float = 0.3) -> Iterator[None]:
    """Call ``update(step, steps_done, elapsed_s)`` every ``interval`` while the block runs."""
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
