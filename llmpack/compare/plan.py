"""One compare plan, run the same way on this machine and on a cluster.

A comparison is paths (each backend in each packaging, :mod:`components.fusion`) x rounds, with
warm-up rounds first that are not counted. :class:`ComparePlan` is that, checked once when it is
made; :meth:`ComparePlan.runs` lists the runs in the one order both runners keep (every path once
per round, interleaved: a, b, c, a, b, c..., so a slow drift of the machine touches every path
alike), and :func:`run_all` runs them, one after the other or ``concurrency`` at a time.
:func:`llmpack.compare.rounds.compare` runs a plan locally,
:func:`llmpack.cluster.compare.cluster.compare_cluster` on a cluster; neither has a loop of its own.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from components.errors import InputError
from components.fusion import path_label

MAX_WARMUP = 10

T = TypeVar("T")
R = TypeVar("R")


def parse_backends(given: Iterable[str] | str, allowed: Sequence[str], refusal: str) -> list[str]:
    """``--backends``: the names of a comma list (or a list), in order, once each, every one in ``allowed``.

    ``refusal`` words a name that is not, e.g. ``"unknown backend {name!r}"``.
    """
    names = [b.strip() for b in given.split(",")] if isinstance(given, str) else [str(b).strip() for b in given]
    names = [n for n in names if n]
    if not names:
        raise InputError("--backends: give at least one of " + ", ".join(allowed))
    for name in names:
        if name not in allowed:
            import difflib

            close = difflib.get_close_matches(name.lower(), list(allowed), n=1, cutoff=0.65)
            raise InputError(f"--backends: {refusal.format(name=name)} (choose from {', '.join(allowed)})"
                             + (f"; did you mean {close[0]!r}?" if close else ""))
    return list(dict.fromkeys(names))


def check_repeats(repeats: int) -> None:
    """``--repeats``: a whole number >= 1."""
    if not isinstance(repeats, int) or repeats < 1:
        raise InputError(f"--repeats {repeats}: must be at least 1")


def check_warmup(warmup: int) -> int:
    """``--warmup``: 0 to :data:`MAX_WARMUP` runs per path."""
    if not 0 <= warmup <= MAX_WARMUP:
        raise InputError(f"--warmup {warmup}: must be between 0 and {MAX_WARMUP} runs per path")
    return warmup


@dataclass(frozen=True, kw_only=True)
class PlannedRun:
    """One run of a plan: its path (backend, packaging), the label progress shows, and whether it counts."""

    backend: str
    fuse: str
    label: str
    warmup: bool = False
    round: int = 0  # 1, 2...: the counted round it belongs to (0: a warm-up run)
    # a start-up round's run: the pipeline through finetune's first step (llmpack.compare.until_decided)
    startup: bool = False


@dataclass(frozen=True, kw_only=True)
class ComparePlan:
    """Paths x rounds (+ warm-up rounds), checked once: ``repeats`` >= 1, ``warmup`` 0..10."""

    backends: tuple[str, ...]
    variants: tuple[str, ...] = ("none",)  # fusion modes, each backend in each
    repeats: int = 1
    warmup: int = 0

    def __post_init__(self) -> None:
        check_repeats(self.repeats)
        check_warmup(self.warmup)

    @property
    def paths(self) -> list[tuple[str, str]]:
        """(backend, fusion mode) of every path, variants outermost: ``argo, kfp, argo+fuse-gpu...``."""
        return [(b, f) for f in self.variants for b in self.backends]

    @property
    def labels(self) -> list[str]:
        """Each path's name in the result (``argo``, ``argo+fuse-gpu``)."""
        return [path_label(b, f) for b, f in self.paths]

    def runs(self, *, warmup: bool = False) -> list[PlannedRun]:
        """The counted runs in order (or, with ``warmup=True``, the warm-up runs), labelled for progress."""
        out = []
        rounds = self.warmup if warmup else self.repeats
        for i in range(rounds):
            for (backend, fuse), name in zip(self.paths, self.labels, strict=True):
                if warmup:
                    label = f"{name} (warm-up{f' {i + 1}/{rounds}' if rounds > 1 else ''}, not counted)"
                else:
                    label = f"{name} ({i + 1}/{rounds})" if rounds > 1 else name
                out.append(PlannedRun(backend=backend, fuse=fuse, label=label, warmup=warmup,
                                      round=0 if warmup else i + 1))
        return out


def run_all(items: Sequence[T], run: Callable[[T], R], *, concurrency: int = 1) -> list[R]:
    """``run`` over ``items`` in order, at most ``concurrency`` at once; the results in the items' order.

    Client libraries (kfp, hera) swap ``sys.stdout`` while they construct; whatever a run leaves
    there is put back.
    """
    stdout = sys.stdout
    try:
        if concurrency == 1:
            return [run(item) for item in items]
        with ThreadPoolExecutor(max_workers=min(concurrency, len(items)), thread_name_prefix="llmpack-run") as pool:
            return list(pool.map(run, items))
    finally:
        sys.stdout = stdout
