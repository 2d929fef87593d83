"""``from components.runtime import main``: the name compiled KFP components call (kept for them).

The step process itself lives in :mod:`components.process.runner`.
"""

from components.process.runner import main

__all__ = ["main"]
