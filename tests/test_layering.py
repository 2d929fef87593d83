"""The dependency rule, checked on the code: components <- backends <- llmpack, no circles.

Every import is read with ``ast``, those inside functions included (a function-level import is
still a dependency; it only moves when it is paid). A package's modules must form no circle of
imports among themselves, and a step must never reach the step runner that calls it.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmpack.backends import SHIPPED
from tests.conftest import REPO

# The backends' packages, from the one registry (``direct`` lives in llmpack itself).
BACKENDS = tuple(dict.fromkeys(e.module.split(".")[0] for e in SHIPPED if not e.module.startswith("llmpack.")))
PACKAGES = ("components", *BACKENDS, "llmpack")
STEP_RUNNER = ("components.process", "components.fusion", "components.runtime", "components.run")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


MODULES: dict[str, Path] = {
    _module_name(p): p for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))
    # the committed MLflow main.py shims are project files run by `mlflow run`, not modules of the package
    if p.name != "main.py" or pkg != "mlflow_projects"
}


def _imports(name: str) -> Iterator[str]:
    """Every module ``name`` imports, resolved to a module of ours where it names one (``from pkg import sub``)."""
    tree = ast.parse(MODULES[name].read_text(encoding="utf-8"))
    package = name if MODULES[name].name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                yield sub if sub in MODULES else base


def _top(module: str) -> str:
    return module.split(".")[0]


GRAPH: dict[str, set[str]] = {name: {m for m in _imports(name) if m in MODULES and m != name} for name in MODULES}


def test_components_imports_no_backend_and_not_llmpack():
    bad = {(m, d) for m, deps in GRAPH.items() if _top(m) == "components" for d in deps if _top(d) != "components"}
    assert not bad, f"components reaches above itself: {sorted(bad)}"


def test_backends_import_neither_llmpack_nor_each_other():
    bad = {(m, d) for m, deps in GRAPH.items() if _top(m) in BACKENDS
           for d in deps if _top(d) not in ("components", _top(m))}
    assert not bad, f"a backend reaches llmpack or another backend: {sorted(bad)}"


def test_steps_never_import_the_step_runner():
    bad = {(m, d) for m, deps in GRAPH.items() if m.startswith("components.steps.") for d in deps
           if d.startswith(STEP_RUNNER)}
    assert not bad, f"a step imports the step process that runs it: {sorted(bad)}"


def _cycles(nodes: set[str]) -> list[list[str]]:
    """Tarjan's strongly connected components of GRAPH restricted to ``nodes``: the ones with a circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in GRAPH[v] & nodes:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                found.append(sorted(part))

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_circle_inside_a_package(package: str):
    assert not _cycles({m for m in MODULES if _top(m) == package}), f"import circles in {package}"


def test_the_circle_check_finds_a_planted_circle():
    GRAPH["components.errors"].add("components.binding")  # binding imports errors: errors -> binding closes a circle
    try:
        assert ["components.binding", "components.errors"] in _cycles({m for m in MODULES if _top(m) == "components"})
    finally:
        GRAPH["components.errors"].discard("components.binding")


def test_importing_a_step_loads_no_runner_launcher_fusion_or_server_code():
    code = ("import json, sys; import components.steps.prepare_data; "
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('components'))))")
    loaded = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                       cwd=REPO).stdout)
    assert "components.steps.prepare_data" in loaded
    assert not [m for m in loaded if m.startswith((*STEP_RUNNER, "components.servers"))], loaded


# The pack and the lab (docs/internals/architecture.md): llmpack.cluster may import the pack;
# nothing of the pack imports it.
LAB = "llmpack.cluster"
# What llmpack.ui may import of llmpack: itself and the leaves below every room.
UI_MAY_IMPORT = ("llmpack.ui", "llmpack.backends", "llmpack.gpu_catalogue", "llmpack.configuration")


def _in_lab(module: str) -> bool:
    return module == LAB or module.startswith(LAB + ".")


def pack_imports_of_the_lab(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    return {(m, d) for m, deps in graph.items() if not _in_lab(m) for d in deps if _in_lab(d)}


def test_the_pack_imports_nothing_of_the_lab():
    assert any(_in_lab(m) for m in MODULES) and any(not _in_lab(m) and _top(m) == "llmpack" for m in MODULES)
    bad = pack_imports_of_the_lab(GRAPH)
    assert not bad, f"the pack reaches into the lab: {sorted(bad)}"


def test_the_lab_check_finds_a_planted_import():
    planted = {**GRAPH, "llmpack.report.render": GRAPH["llmpack.report.render"] | {"llmpack.cluster.k8s.watcher"}}
    assert pack_imports_of_the_lab(planted) == {("llmpack.report.render", "llmpack.cluster.k8s.watcher")}


def test_ui_imports_nothing_above_it():
    bad = {(m, d) for m, deps in GRAPH.items() if m.startswith("llmpack.ui") for d in deps
           if _top(d) == "llmpack" and not d.startswith(UI_MAY_IMPORT)}
    assert not bad, f"llmpack.ui reaches above itself: {sorted(bad)}"


@pytest.mark.parametrize("argv", [["--help"], ["compare", "--help"], ["run", "--help"], ["compile", "--help"],
                                  ["report", "--help"], ["sync", "--help"], ["clean", "--help"]])
def test_the_packs_commands_load_no_module_of_the_lab_nor_a_backends_lab_module(argv: list[str]):
    code = ("import json, sys\nfrom llmpack.cli import main\n"
            "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            "lab = [m for m in sys.modules if m.startswith('llmpack.cluster') or m.endswith('.doctor')]\n"
            "print(json.dumps(sorted(lab)), file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, check=True, cwd=REPO)
    assert "Usage: " in done.stdout
    assert json.loads(done.stderr.splitlines()[-1]) == []


def test_a_backends_doctor_facts_are_in_its_second_module_which_only_the_lab_imports():
    from llmpack.backends import ORCHESTRATORS, doctor_facts

    modules = {f"{e.module.rpartition('.')[0]}.doctor" for e in SHIPPED if e.cluster}
    assert modules == {f"{b}.doctor" for b in BACKENDS}
    importers = {m for m, deps in GRAPH.items() for d in deps if d in modules and _top(m) == "llmpack"}
    assert importers == set()  # the registry finds them by name (importlib), the lab asks the registry
    facts = {name: doctor_facts(name) for name in ORCHESTRATORS}
    assert facts["argo"].checks is not None and facts["kfp"].probe is not None and facts["mlflow"].verbs
