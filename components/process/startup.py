"""Start-up and exit without the garbage collector's full passes over the libraries' objects.

Importing torch, transformers and peft creates millions of container objects, and CPython's
cyclic collector walks all of them in every full (oldest-generation) collection it triggers on
the way: on the 2-core build machine 2-3.5 s of a 9.5 s import. At exit the interpreter collects
once more over everything still alive: 2-2.5 s more after the same imports. Neither pass can
free anything that matters: what start-up built (modules, classes, the loaded model) lives
as long as the process.

So a step process (``components.runtime``) starts with full collections paused: young
collections still run, so reference cycles among fresh objects are freed as usual. When the step
has loaded its model (its ``model_loaded`` event) or, for a step with no model, when it returns,
:func:`settle` freezes what exists (``gc.freeze``: never scanned again) and restores the
collector's thresholds, so the training loop runs with the normal collector over its own
objects only, and the exit finds almost nothing left to scan. Results do not change: the
collector decides when unreachable cycles are freed, never what a step computes.

``python benchmarks/gc_startup.py`` prints what this saves.
"""

from __future__ import annotations

import gc

# Young collections as often as usual; full ones only after 50,000 x 20 x 100 allocations,
# i.e. not during any start-up.
_START_UP_THRESHOLDS = (50_000, 20, 100)
_saved: tuple[int, int, int] | None = None


def pause_full_collections() -> None:
    """From now until :func:`settle`, only young collections (no-op when already paused)."""
    global _saved
    if _saved is None:
        _saved = gc.get_threshold()
        gc.set_threshold(*_START_UP_THRESHOLDS)


def settle() -> None:
    """What exists now lives as long as the process: freeze it and restore the collector's thresholds.

    Called when a step's model is loaded, when a step returns and before the process exits;
    later calls freeze only what came since.
    """
    global _saved
    gc.freeze()
    if _saved is not None:
        gc.set_threshold(*_saved)
        _saved = None


def paused() -> bool:
    """Whether full collections are paused now (for tests)."""
    return _saved is not None
