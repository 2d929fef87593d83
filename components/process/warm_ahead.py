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
parked process, which has only started up; a parked process whose fused process died before its
turn reads end-of-file on its stdin and exits 0 without running anything. During the member's
turn the fused process waits for it as for its own work: a SIGTERM is passed on, a Ctrl-C (which
the whole process group gets) is left to the member, and the exit code is the member's (128+N
when signalled). ``LLMPACK_WARM_AHEAD=0`` in a step's environment (locally: the client's)
turns the feature off: every member then runs in the fused process, as before.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING

from components import settings
from components.commands import wait_passing_signals
from components.dsl import Step

if TYPE_CHECKING:
    from components.fusion import Member



def enabled() -> bool:
    return os.environ.get(settings.WARM_AHEAD.name, "1") != "0"


def parked_index() -> int | None:
    """The member this process was parked for, or None in an ordinary step process.

    Read once and taken out of the environment: nothing the member starts is told it is parked.
    """
    value = os.environ.pop(settings.PARKED_MEMBER.name, "")
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
    """Block until the fused process hands over: ``(started, injected delay)``; None when it never will.

    None at end-of-file (the fused process ended, or died) and on Ctrl-C before the turn came.
    """
    try:
        line = (stream or sys.stdin).readline()
    except KeyboardInterrupt:  # the fused process, interrupted too, ends the step
        return None
    if not line.strip():
        return None
    started, delay = line.split()
    return float(started), float(delay)


@dataclass(kw_only=True)
class Parked:
    """A parked process of one member, as the fused process holds it."""

    task: str
    proc: subprocess.Popen[str]
    handed_over: bool = False

    @classmethod
    def start(cls, index: int, task: str, argv: Sequence[str]) -> Parked:
        proc = subprocess.Popen([sys.executable, "-m", "components.run", *argv], stdin=subprocess.PIPE, text=True,
                                env={**os.environ, settings.PARKED_MEMBER.name: str(index)})
        return cls(task=task, proc=proc)

    def go(self, started: float, delay: float) -> int | None:
        """Hand the member over and wait for it: its exit code (128+N when signalled), or None
        when the parked process is already gone (the member then runs in the fused process)."""
        if self.proc.poll() is not None or self.proc.stdin is None:
            return None
        try:
            self.proc.stdin.write(f"{started!r} {delay!r}\n")
            self.proc.stdin.close()
        except BrokenPipeError:
            return None
        self.handed_over = True
        return self._wait()

    def _wait(self) -> int:
        """Wait for the member, as if it ran here.

        SIGTERM (a pod's end, a ``kill``: sent to the fused process only) is passed on, so the
        member ends its records as it would in the fused process. SIGINT (Ctrl-C, llmpack's own
        interrupt of a step) reaches the whole process group, the parked process included, so it
        is not sent twice: the fused process waits while the member ends its records.
        """
        rc, signalled = wait_passing_signals(self.proc, (signal.SIGTERM,))
        if signalled is not None:
            return 128 + signalled
        if rc < 0:  # killed, and not by us: say so (a member's own error is already in its output)
            print(f"llmpack: error: step {self.task!r}: its process was killed by signal {-rc}", file=sys.stderr, flush=True)
            return 128 - rc
        return rc

    def close(self, grace_s: float = 15.0) -> None:
        """End a parked process whose turn never came (it has only started up: killed at once);
        give one that has the member ``grace_s`` to end its records, then kill it."""
        if self.proc.poll() is None and self.handed_over:
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def park(members: Sequence[Member], argv: Sequence[str]) -> dict[int, Parked]:
    """Start a parked process for every member after the first whose step declares a warm-up.

    A process that cannot be started is left out: that member runs in the fused process.
    """
    if not enabled():
        return {}
    parked = {}
    for n, member in enumerate(members):
        if n > 0 and member.step.warm_up is not None:
            try:
                parked[n] = Parked.start(n, member.task, argv)
            except OSError as exc:
                print(f"llmpack: warning: warm-ahead: {member.task} not parked ({exc}); it starts up in its turn",
                      file=sys.stderr, flush=True)
    return parked
