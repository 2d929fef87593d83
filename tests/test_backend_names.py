"""No module of ``llmpack`` or ``components`` names a backend: what differs per backend is declared on it.

Read with ``ast`` from every module of ``llmpack/`` and ``components/`` but the registry, so
docstrings, comments and messages are out of it: an identifier with ``kfp`` or ``argo`` among its
``_``-separated words, an import of a backend's package, or a backend's name (``"kfp"``, ``"argo"``,
``"mlflow"``) compared, looked up or listed. ``mlflow`` in an identifier names the tracking library,
not the backend; the strings that name a library are :data:`LIBRARIES`, each with its reason.
:data:`LEFT` lists what still names a backend, to move onto it (empty now); the test fails on anything new
and on an entry that no longer holds, so the list only shrinks. The rule: docs/internals/architecture.md,
"The backend contract".
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from llmpack.backends import SHIPPED
from tests.conftest import REPO

NAMES = tuple(e.name for e in SHIPPED if e.cluster)  # kfp, argo, mlflow
PACKAGES = tuple(dict.fromkeys(e.module.split(".")[0] for e in SHIPPED if not e.module.startswith("llmpack.")))
WORD = re.compile(r"(?:^|_)(kfp|argo)(?:_|$)", re.IGNORECASE)  # "mlflow" in a name is the tracking library
REGISTRY = "llmpack/backends.py"

# A string naming a library, not a backend.
LIBRARIES = {
    ("components/record/rest_auth.py", "'mlflow'"),  # the [mlflow] section of MLflow's credentials file
    ("components/record/trace_export.py", "'mlflow'"),  # a trace sent to an MLflow tracking server
    ("components/record/retries.py", "'mlflow'"),  # whether the mlflow library is imported (sys.modules)
    ("components/serving/package.py", "'mlflow'"),  # the served model's pip requirement on the mlflow library
    *{(m, n) for m in ("llmpack/ui/display.py", "llmpack/ui/terminal.py") for n in ("'mlflow'", "'kfp'")},  # loggers
}
# Still naming a backend: to move onto the backend (components.backend), each in its own folder.
LEFT: set[tuple[str, str]] = set()  # empty: every backend fact is declared on its backend


def _identifiers(node: ast.AST) -> Iterator[str]:
    if isinstance(node, ast.Name):
        yield node.id
    elif isinstance(node, ast.Attribute):
        yield node.attr
    elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        yield node.name
    elif isinstance(node, ast.arg):
        yield node.arg
    elif isinstance(node, ast.keyword) and node.arg:
        yield node.arg


def _looked_up(tree: ast.AST) -> Iterator[ast.expr]:
    """The expressions code branches on, looks up by or lists: comparison operands, dict keys, subscripts,
    elements of literal tuples, lists and sets."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            yield node.left
            yield from node.comparators
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            yield from node.elts
        elif isinstance(node, ast.Dict):
            yield from (k for k in node.keys if k is not None)
        elif isinstance(node, ast.Subscript):
            yield node.slice


def names_of_backends(path: Path) -> set[str]:
    """What ``path`` names of a backend under the rule above: identifiers, imported packages, quoted names."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = {name for node in ast.walk(tree) for name in _identifiers(node) if WORD.search(name)}
    for node in ast.walk(tree):
        modules = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) else []
        found |= {m for m in modules if m.split(".")[0] in PACKAGES}
    found |= {repr(e.value) for e in _looked_up(tree) if isinstance(e, ast.Constant) and e.value in NAMES}
    return found


def _scanned() -> dict[tuple[str, str], None]:
    out: dict[tuple[str, str], None] = {}
    for package in ("llmpack", "components"):
        for path in sorted((REPO / package).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            if rel != REGISTRY:
                out.update(dict.fromkeys((rel, name) for name in sorted(names_of_backends(path))))
    return out


def test_no_module_of_llmpack_or_components_names_a_backend() -> None:
    found = set(_scanned())
    new = sorted(found - LIBRARIES - LEFT)
    assert not new, f"names a backend outside the registry (declare it on the backend instead): {new}"
    stale = sorted((LIBRARIES | LEFT) - found)
    assert not stale, f"no longer found: take these off the lists in {Path(__file__).name}: {stale}"


def test_the_rule_finds_each_kind_of_naming(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text('"""Compare kfp with argo (a docstring: not counted)."""\n'
                       "import mlflow\n"
                       "from argo_workflows.backend import BACKEND\n"
                       "def f(orchestrator, kfp_runs, table):\n"
                       "    mlflow.log_metric('x', 1)  # the tracking library: not counted\n"
                       "    if orchestrator == 'kfp' or orchestrator in ('direct', 'argo'):\n"
                       "        return {'mlflow': 1}[orchestrator] + table['argo'], 'text'\n"
                       "    return 'kfp'  # returned alone: not a lookup, not counted\n")
    assert names_of_backends(planted) == {"argo_workflows.backend", "kfp_runs", "'kfp'", "'argo'", "'mlflow'"}
