"""Warm-ahead: in a fused pod, a later member's start-up runs beside the earlier members' work.

A step may declare a ``warm_up`` (imports and client set-up, never its work). For each later
member that declares one, the fused process starts a *parked* process at once, told
(``LLMPACK_PARKED_MEMBER=<index>``) to run only that member: it warms up, then waits on its stdin
for the hand-over; its exit code is the member's. The member's work, outputs and records, the pod
count and the order are unchanged. A parked process whose turn never comes runs nothing;
``LLMPACK_WARM_AHEAD=0`` turns it off. Why a process and not a thread, and each failure:
docs/internals/step-process.md.
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
from components.commands import SAFE_PATH_ENV, wait_passing_signals
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
        proc = subprocess.Popen([sys.executable, "-P", "-m", "components.run", *argv], stdin=subprocess.PIPE, text=True,
                                env={**os.environ, settings.PARKED_MEMBER.name: str(index), **SAFE_PATH_ENV})
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
            print(f"llmpack: error: step {self.task!r}: its process was killed by signal {-rc}", file=sys.stderr,
                  flush=True)
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
