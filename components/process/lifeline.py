"""A child process dies with the process that started it, however that one dies.

Step processes and local runners run in sessions of their own, so an interrupt reaches their
group; a client killed with SIGKILL ends nothing. Linux's ``PR_SET_PDEATHSIG`` closes that gap:
:func:`preexec` in every ``Popen`` of ours, :func:`at_start` first thing in every process a library
may start. The signal is SIGTERM (a training step checkpoints on it). A no-op off Linux. Why
two places: docs/internals/step-process.md.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
DEATH_SIGNAL = signal.SIGTERM


def die_with_parent(sig: int = DEATH_SIGNAL) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent (the thread that forked it) ends.

    False off Linux.
    """
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0


def preexec(sig: int = DEATH_SIGNAL) -> Callable[[], None] | None:
    """A ``preexec_fn`` that binds the child to this process; None off Linux (``Popen`` takes None)."""
    if not sys.platform.startswith("linux"):
        return None
    parent = os.getpid()

    def bind() -> None:  # in the child, between fork and exec: async-signal-safe calls only
        die_with_parent(sig)
        if os.getppid() != parent:  # the parent died before the death signal was armed
            os.kill(os.getpid(), sig)

    return bind


def at_start(sig: int = DEATH_SIGNAL) -> None:
    """Bind this process to its parent as it starts; a process already orphaned (parent 1) ends at once."""
    if die_with_parent(sig) and os.getppid() == 1:
        os.kill(os.getpid(), sig)
