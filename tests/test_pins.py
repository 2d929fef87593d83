"""The pins agree with each other: the Dockerfile's base torch inside pyproject's torch range,
ruff's target the declared Python floor, the floors check's pins the declared floors.

Cheap and always on; the expensive half, installing every floor and running the pipeline on it,
is `.ci/floors` (CI runs it after the tests).
"""

from __future__ import annotations

import importlib.util
import re
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def declared(name: str) -> Requirement:
    found = [Requirement(r) for r in PYPROJECT["project"]["dependencies"] if Requirement(r).name == name]
    assert len(found) == 1, f"pyproject.toml: one {name} dependency expected, found {len(found)}"
    return found[0]


def base_image_torch(dockerfile: str) -> Version:
    """The torch version of the Dockerfile's default base image (``pytorch/pytorch:<version>-cuda...``)."""
    match = re.search(r"^ARG BASE_IMAGE=pytorch/pytorch:(\d+\.\d+(?:\.\d+)?)"
                      r"-cuda[\w.]+-cudnn\d+-\w+(?:@sha256:[0-9a-f]{64})?$",
                      dockerfile, re.MULTILINE)
    assert match, "Dockerfile: no `ARG BASE_IMAGE=pytorch/pytorch:<torch>-cuda<x.y>-cudnn<n>-<flavour>` line"
    return Version(match.group(1))


def out_of_range(dockerfile: str, torch_range: SpecifierSet) -> str | None:
    have = base_image_torch(dockerfile)
    return (None if torch_range.contains(have)
            else f"Dockerfile's base image has torch {have}, outside torch{torch_range}")


def test_dockerfile_base_torch_is_inside_the_declared_range():
    assert out_of_range((REPO / "Dockerfile").read_text(), declared("torch").specifier) is None


@pytest.mark.parametrize(("base", "bad"), [
    ("pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime", True),  # the old base: transformers 5 disables it
    ("pytorch/pytorch:3.0.0-cuda13.0-cudnn9-runtime", True),
    ("pytorch/pytorch:2.6.0-cuda12.4-cudnn9-runtime", False),
    ("pytorch/pytorch:2.9.1-cuda12.8-cudnn9-runtime@sha256:" + "a" * 64, False),
])
def test_the_range_check_catches_a_base_outside_it(base: str, bad: bool):
    text = (REPO / "Dockerfile").read_text()
    planted = re.sub(r"^ARG BASE_IMAGE=.*$", f"ARG BASE_IMAGE={base}", text, flags=re.MULTILINE)
    assert (out_of_range(planted, declared("torch").specifier) is not None) == bad


def test_the_floors_transformers_5_needs():
    """transformers 5 disables torch below 2.6 (and fully_shard needs it) and needs peft 0.18."""
    assert not declared("torch").specifier.contains("2.5.1") and declared("torch").specifier.contains("2.6.0")
    assert declared("torch").specifier.contains("2.13.0")  # the CPU build the Makefile installs
    assert not declared("transformers").specifier.contains("4.57.6")
    assert not declared("peft").specifier.contains("0.17.1")


def test_ruff_targets_the_declared_python_floor():
    floor = SpecifierSet(PYPROJECT["project"]["requires-python"])
    assert not floor.contains("3.10.99") and floor.contains("3.11.0")
    assert PYPROJECT["tool"]["ruff"]["target-version"] == "py311"
    assert sys.version_info >= (3, 11)


def test_the_floors_check_pins_every_direct_dependency_to_its_floor(tmp_path: Path):
    spec = importlib.util.spec_from_file_location("floors_pins", REPO / ".ci" / "floors_pins.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["floors_pins", str(REPO / "pyproject.toml"), str(tmp_path)]) == 0
    pins = (tmp_path / "floors.txt").read_text().split()
    assert (tmp_path / "torch-floor.txt").read_text().strip() == "torch==2.6"
    direct = {Requirement(d).name: Requirement(d) for d in
              [*PYPROJECT["project"]["dependencies"], *PYPROJECT["project"]["optional-dependencies"]["dev"]]}
    pinned = {Requirement(p).name: Requirement(p) for p in pins}
    assert set(pinned) == set(direct) - {"torch"}  # torch is installed first, from its own index
    for name, pin in pinned.items():
        (exact,) = pin.specifier
        assert exact.operator == "==" and direct[name].specifier.contains(exact.version), pin
        lower = [s.version for s in direct[name].specifier if s.operator in (">=", "==", "~=")]
        assert lower == [exact.version], f"{pin} is not the floor of {direct[name]}"
    assert "transformers==5.0" in pins and "peft==0.18" in pins and "hera[cli]==7.1" in pins
    with pytest.raises(SystemExit, match="no single floor"):
        module.floor(Requirement("numpy<3"))


def test_ci_runs_the_floors_check_after_the_tests():
    run = (REPO / ".ci" / "run").read_text()
    assert "bash .ci/floors" in run and run.index("make test-slow") < run.index("bash .ci/floors")


def test_the_lab_is_an_extra_and_dev_includes_it():
    extras = PYPROJECT["project"]["optional-dependencies"]
    cluster = {Requirement(d).name: str(Requirement(d).specifier) for d in extras["cluster"]}
    dev = {Requirement(d).name: str(Requirement(d).specifier) for d in extras["dev"]}
    assert "kubernetes" in cluster and cluster.items() <= dev.items()
