"""The torchrun launcher: the step process that starts a step's ranks on this node.

The process every orchestrator starts (``python -m components.run STEP ...``) becomes the
launcher when the step asks for more than one process (:mod:`components.training.distributed`
says what a rank knows): it starts ``torchrun --standalone --nproc-per-node P`` with the same
arguments, passes SIGTERM/SIGINT on, and returns torchrun's exit status.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Sequence

from components import settings
from components.commands import SAFE_PATH_ENV, wait_passing_signals
from components.process import lifeline


def launch_command(nproc: int, argv: Sequence[str]) -> list[str]:
    """``torchrun --standalone --nproc-per-node P -m components.run ARGV`` with this interpreter, safe path (``-P``;
    the ranks, which torchrun starts as ``python -u -m``, get it from ``PYTHONSAFEPATH``: :func:`launch`)."""
    return [sys.executable, "-P", "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
            "-m", "components.run", *argv]


def launch(nproc: int, argv: Sequence[str], *, attempt: int) -> int:
    """Run ``argv``'s step on ``nproc`` ranks under torchrun; its exit code (128+N when signalled).

    SIGTERM and SIGINT are passed on to torchrun, which passes them to every rank: a SIGTERM'd
    finetune checkpoints on every rank's agreement and exits 143, as a single process does.
    """
    env = {**os.environ, settings.LAUNCHER.name: "1", settings.ATTEMPT.name: str(attempt), **SAFE_PATH_ENV}
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # --standalone: every rank is on this host
    proc = subprocess.Popen(launch_command(nproc, argv), env=env, preexec_fn=lifeline.preexec())
    rc, signalled = wait_passing_signals(proc, (signal.SIGTERM, signal.SIGINT))
    return rc if signalled is None else 128 + signalled
