"""How ``main`` of a generated MLflow project takes SIGINT and SIGTERM (:mod:`mlflow_projects.driver`).

Three stages: held during the set-up (:func:`raise_on_signals`: noted, not raised, while the
early steps start and MLflow's set-up runs), raised as a KeyboardInterrupt while the steps run
(:func:`release_signals`), ignored while the final block closes the record (:func:`hold_signals`).
"""

from __future__ import annotations

from typing import Any

SIGNAL_RECEIVED: list[int] = []
HOLDING: list[bool] = [False]


def raise_on_signals() -> None:
    """SIGTERM unwinds like Ctrl-C: a KeyboardInterrupt, which mlflow.projects answers by cancelling
    the running step; ``main`` then ends the record KILLED and exits 128 + the signal's number.

    Until :func:`release_signals`, SIGTERM and SIGINT are only noted: ``main``'s set-up (the first
    step already started, MLflow importing, the record being tagged) is not cut in the middle;
    the signal is raised as soon as the set-up is done, where ``main`` ends the step and the record.
    """
    import signal

    def handler(signum: int, _frame: Any) -> None:
        SIGNAL_RECEIVED.append(signum)
        if not HOLDING[0]:
            raise KeyboardInterrupt

    HOLDING[0] = True
    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def release_signals() -> None:
    """End the set-up's hold: a signal noted during it is raised now."""
    HOLDING[0] = False
    if SIGNAL_RECEIVED:
        raise KeyboardInterrupt


def hold_signals() -> None:
    """Ignore further SIGINT/SIGTERM while the final block closes the record (bounded by its upload wait).

    Ctrl-C reaches both ``mlflow run`` and ``main`` (same process group); ``mlflow run`` then sends
    ``main`` SIGTERM and waits for it. A second interrupt inside the final block used to abort the
    closing half-way: the record kept ``llmpack.status=killed`` but MLflow ended it FAILED.
    """
    import signal

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
