"""Start-up and exit without the garbage collector's full passes over the libraries' objects.

Importing torch, transformers and peft makes millions of objects that CPython's full collections
walk, on start-up and again at exit, freeing nothing that matters. So a step process starts with
full collections paused (young ones still run); when the step has loaded its model (or returns),
:func:`settle` freezes what exists and restores the thresholds. Results do not change.
``python benchmarks/gc_startup.py`` prints what this saves; why: docs/internals/step-process.md.
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
