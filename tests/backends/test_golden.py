"""Every committed compiled artifact (golden copy) against a fresh ``llmpack compile``: backends x variants.

One parametrized loop, as Hera's ``tests/test_examples.py`` keeps its example YAML: each backend's
artifacts (``Backend.artifacts``, plus the TrainJob and launcher RBAC ``--nodes`` writes) compiled for each variant
into a scratch directory, compared byte for byte with the copies committed under the variant's
``--out``. ``make golden`` (``LLMPACK_REGEN_GOLDEN=1 pytest -k golden``) rewrites them all.

Why compiled in a scratch directory with a relative ``--out``: the MLflow project records its paths
as typed from where ``llmpack compile`` runs (``mlflow_projects.compiler``), so a compile there of
``--out examples/multinode`` writes what the same command typed in the repository root writes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from llmpack.backends import BACKENDS, backend
from llmpack.compile.artifacts import RBAC_FILE, TRAINJOB_FILE, compile_all
from llmpack.compile.signatures import SIGNATURES
from tests.conftest import REPO

REGEN_ENV = "LLMPACK_REGEN_GOLDEN"


@dataclass(frozen=True, kw_only=True)
class Variant:
    """One ``llmpack compile`` whose output is committed: its ``--out`` and its other options."""

    name: str
    out: Path  # relative to the repository root
    options: dict[str, Any] = field(default_factory=dict)

    def command(self) -> str:
        flags = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in self.options.items())
        return f"llmpack compile {flags} --out {self.out}".replace("  ", " ")


VARIANTS = {v.name: v for v in (
    Variant(name="default", out=Path(".")),
    Variant(name="fuse-gpu", out=Path("tests/fixtures/golden/fuse-gpu"), options={"fuse": "gpu"}),
    Variant(name="multinode", out=Path("examples/multinode"),
            options={"nodes": 2, "gpus": 4, "cache_pvc": "llmpack-shared"}),
)}


def _targets() -> dict[str, tuple[Path, ...]]:
    """What each golden target owns, relative to a variant's ``--out``: each backend's artifacts, the TrainJob
    and its launcher's RBAC."""
    owned = {name: backend(name).artifacts for name in BACKENDS}
    return {**{name: paths for name, paths in owned.items() if paths}, "trainjob": (TRAINJOB_FILE, RBAC_FILE)}


TARGETS = _targets()
CASES = [pytest.param(t, v, id=f"{t}-{v}") for v in VARIANTS for t in TARGETS
         if t != "trainjob" or "nodes" in VARIANTS[v].options]


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each variant compiled once in its own scratch directory (the ``--out`` inside it is the variant's)."""
    roots = {}
    cwd = Path.cwd()
    for v in VARIANTS.values():
        root = tmp_path_factory.mktemp(f"golden-{v.name}")
        os.chdir(root)
        try:
            compile_all(v.out, **v.options)
        finally:
            os.chdir(cwd)
        roots[v.name] = root
    return roots


def _files(base: Path, owned: tuple[Path, ...]) -> dict[Path, bytes]:
    """The files under ``base`` of the owned paths (a file or a directory), by path relative to ``base``."""
    found: dict[Path, bytes] = {}
    for rel in owned:
        path = base / rel
        for f in ([path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())):
            found[f.relative_to(base)] = f.read_bytes()
    return found


def _regenerate(committed_base: Path, committed: dict[Path, bytes], fresh: dict[Path, bytes]) -> None:
    """Make the committed copies the fresh ones: stale files removed, the rest written."""
    for rel in committed.keys() - fresh.keys():
        (committed_base / rel).unlink()
    for rel, data in fresh.items():
        (committed_base / rel).parent.mkdir(parents=True, exist_ok=True)
        (committed_base / rel).write_bytes(data)


@pytest.mark.parametrize(("target", "variant"), CASES)
def test_golden_matches_a_fresh_compile(target: str, variant: str, compiled: dict[str, Path]) -> None:
    v = VARIANTS[variant]
    owned = TARGETS[target]
    fresh = _files(compiled[variant] / v.out, owned)
    assert fresh, f"{target}: `{v.command()}` wrote none of {[str(p) for p in owned]}"
    committed_base = REPO / v.out
    if os.environ.get(REGEN_ENV) == "1":
        _regenerate(committed_base, _files(committed_base, owned), fresh)
    committed = _files(committed_base, owned)
    hint = f"regenerate with `make golden` ({REGEN_ENV}=1 pytest -k golden; it runs `{v.command()}`)"
    assert sorted(committed) == sorted(fresh), f"{v.out}: {target}'s file set differs; {hint}"
    for rel, data in fresh.items():
        assert committed[rel] == data, f"{v.out / rel} is stale; {hint}"


@pytest.mark.parametrize("variant", VARIANTS)
def test_golden_every_compiled_file_is_a_target(variant: str, compiled: dict[str, Path]) -> None:
    """Nothing a variant's compile writes escapes the comparison, and its committed directory holds nothing else."""
    v = VARIANTS[variant]
    written = {p.relative_to(compiled[variant] / v.out)  # less the compile's signatures: the user's key, not a golden
               for p in (compiled[variant] / v.out).rglob("*") if p.is_file() and p.name != SIGNATURES}
    covered = {rel for owned in TARGETS.values() for rel in _files(compiled[variant] / v.out, owned)}
    assert written == covered
    if v.out != Path("."):  # the repository root holds much else; a variant's own directory only its compile
        committed = {p.relative_to(REPO / v.out) for p in (REPO / v.out).rglob("*")
                     if p.is_file() and p.name not in ("README.md", SIGNATURES)}
        assert committed == written, f"{v.out}: holds files `{v.command()}` does not write"
