"""docs/internals/architecture.md's tree is the tree: every room of ``llmpack/`` it lists exists, and every one that
exists is listed.

The rooms are the lines ``  NAME/`` under ``llmpack/`` in the page's first code block; the
folders are ``llmpack``'s packages (a directory with ``__init__.py``). Each room's ``__init__``
has a docstring (what it does, what it may import) and imports nothing, so ``llmpack --help``
stays fast.
"""

from __future__ import annotations

import ast
import re

from tests.conftest import REPO

PAGE = REPO / "docs" / "internals" / "architecture.md"


def _listed_rooms(indent: str = "  ", under: str = "llmpack/") -> list[str]:
    """The rooms the tree lists at ``indent`` in the block that starts at the line ``under`` (at one indent less)."""
    block = PAGE.read_text(encoding="utf-8").split("```")[1]
    lines = block.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(indent[2:] + under))
    rooms = []
    for line in lines[start + 1:]:
        if not line.startswith(indent) or re.match(rf"{indent[2:]}[a-z]", line):
            break
        if m := re.match(rf"{indent}([a-z0-9_]+)/\s", line):
            rooms.append(m.group(1))
    return rooms


def _rooms(folder: str = "llmpack") -> list[str]:
    return sorted(p.parent.name for p in (REPO / folder).glob("*/__init__.py"))


def test_the_tree_on_the_page_is_the_tree() -> None:
    listed = _listed_rooms()
    assert sorted(listed) == _rooms(), f"docs/internals/architecture.md lists {sorted(listed)}, llmpack/ has {_rooms()}"


def test_the_labs_rooms_on_the_page_are_its_rooms() -> None:
    listed = _listed_rooms("    ", "cluster/")
    assert "cluster" in _rooms() and sorted(listed) == _rooms("llmpack/cluster"), listed


def test_every_room_says_what_it_does_and_imports_nothing_itself() -> None:
    for room in ("cluster", "compare", "compile", "run", "ui"):
        tree = ast.parse((REPO / "llmpack" / room / "__init__.py").read_text(encoding="utf-8"))
        doc = ast.get_docstring(tree)
        assert doc and "import" in doc, room
        assert not [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))], room
