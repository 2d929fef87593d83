"""A child process dies with the process that started it, however that one dies.

The step processes, kfp.local's child, the Argo local runner and ``mlflow run``'s driver each run in
a session of their own (``start_new_session=True``), so that an interrupt of the client reaches
their whole group through :func:`components.commands.end_group`. That needs the client alive: a
client killed with SIGKILL ends nothing, and its steps kept training with parent 1. Linux's
``PR_SET_PDEATHSIG`` closes that gap: the kernel itself sends the child a signal when the thread
that started it ends, whatever ended it.

Two places set it, because some children are started by libraries we do not call ``Popen`` for
(kfp.local's task processes, MLflow's entry points):

* :func:`preexec` in every ``Popen`` of ours (``preexec_fn``): set between fork and exec, then the
  parent checked, so a parent that died in between is not missed;
* :func:`at_start` first thing in every process a library may start (``components.run``, the
  local runners' entry points, MLflow's driver): a chain of them dies link by link.

The signal is SIGTERM: a training step checkpoints on it and every runner ends its own group on
it (a SIGKILL would leave their children to this same rule, one level down). A no-op off Linux.
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
    """Ask the kernel to send ``sig`` to this process when its parent (the thread that forked it) ends; False off Linux."""
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
