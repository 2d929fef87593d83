"""``python -m llmpack.configuration``: docs/configuration.md, every LLMPACK_* setting of the pack and its backends.

The settings live in one typed registry (:mod:`components.settings`); a backend declares its own
there when it is imported, so this imports every registered backend before rendering.
"""

from __future__ import annotations

from components.settings import render_markdown
from llmpack.backends import BACKENDS, backend


def render() -> str:
    """The configuration page, with every backend's settings declared."""
    for name in BACKENDS:
        backend(name)
    return render_markdown()


if __name__ == "__main__":
    print(render(), end="")
