"""Warm-ahead: in a fused pod, a later member's start-up runs beside the earlier members' work.

A fused step runs its members one after the other (:mod:`components.fusion`), so a member's
start-up (register's ~2 s of importing MLflow and opening its tracking store) is paid after
training, on the critical path, while the pod's other cores sat idle during the model load.
A step may declare a ``warm_up`` (``@step(warm_up=...)``): imports and client set-up only,
never its work. For each later member that declares one, the fused process starts a *parked*
process at once: the same command line, told (``LLMPACK_PARKED_MEMBER=<index>``) to run only
that member. It runs the warm-up, then waits on its stdin. When the member's turn comes, the
fused process writes the hand-over time there and waits for the parked process to finish the
member; its exit code is the member's.

What it does not change: the member's work, outputs and records (its ``process_started`` is
the hand-over, as for any fused member), the pod count, the order of the members. A threaded
warm-up in the fused process itself was measured and dropped: the imports hold the GIL and
slowed the training loop by more than they saved (README, "tried and dropped").

When the fused process ends before the member's turn (an earlier member failed), it kills the
parked process, which has only started up; one whose fused process died reads end-of-file on its
stdin and exits 0 without running anything. ``LLMPACK_WARM_AHEAD=0`` turns
the feature off: every member then runs in the fused process, as before.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import IO

from components.dsl import Step

PARKED_ENV = "LLMPACK_PARKED_MEMBER"  # set on a parked process: the index of the member it runs
SWITCH_ENV = "LLMPACK_WARM_AHEAD"  # "0": no parked processes


def enabled() -> bool:
    return os.environ.get(SWITCH_ENV, "1") != "0"


def parked_index() -> int | None:
    """The member this process was parked for, or None in an ordinary step process."""
    value = os.environ.get(PARKED_ENV, "")
    return int(value) if value.isdigit() else None


def warm(step: Step) -> float:
    """Run the step's warm-up; its seconds. A failure is left for the step's own run to meet and report."""
    t0 = time.monotonic()
    if step.warm_up is not None:
        try:
            step.warm_up()
        except Exception:  # noqa: BLE001 - the member's run raises it again, where it is reported
            pass
    return time.monotonic() - t0


def wait_for_go(stream: IO[str] | None = None) -> tuple[float, float] | None:
    """Block until the fused process hands over: ``(started, injected delay)``, or None at end-of-file."""
    line = (stream or sys.stdin).readline()
    if not line.strip():
        return None
    started, delay = line.split()
    return float(started), float(delay)


@dataclass(kw_only=True)
class Parked:
    """A parked process of one member, as the fused process holds it."""

    index: int
    proc: subprocess.Popen[str]

    @classmethod
    def start(cls, index: int, argv: Sequence[str]) -> Parked:
        proc = subprocess.Popen([sys.executable, "-m", "components.run", *argv], stdin=subprocess.PIPE, text=True,
                                env={**os.environ, PARKED_ENV: str(index)})
        return cls(index=index, proc=proc)

    def go(self, started: float, delay: float) -> int | None:
        """Hand the member over and wait for it; its exit code, or None when the process is already gone."""
        if self.proc.poll() is not None or self.proc.stdin is None:
            return None
        try:
            self.proc.stdin.write(f"{started!r} {delay!r}\n")
            self.proc.stdin.close()
        except BrokenPipeError:
            return None
        return self.proc.wait()

    def close(self) -> None:
        """End a parked process whose turn never came (it has only started up); reap one that ran."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def park(members: Sequence[Step], argv: Sequence[str]) -> dict[int, Parked]:
    """Start a parked process for every member after the first that declares a warm-up."""
    if not enabled():
        return {}
    return {n: Parked.start(n, argv) for n, step in enumerate(members) if n > 0 and step.warm_up is not None}
