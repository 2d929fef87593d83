"""YAML that cannot bomb: aliases refused before they expand, files read up to a limit, errors quote a bounded excerpt.

The billion-laughs file (nine levels of nine aliases, 342 bytes) expanded by ``yaml.safe_load`` is
9^9 strings; ``repr()``-ed into an error line, hundreds of MB. Here it is refused at its first alias:
as ``--price-file`` and ``--control-plane-costs`` through the real CLI (one short line, exit 2,
quickly, the process's peak memory measured), and through every other loader of a file the CLI or
a runner reads.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from components import yamltext
from components.errors import InputError
from tests.conftest import REPO

BOMB = "\n".join(['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]'] + [
    f"{cur}: &{cur} [" + ",".join([f"*{prev}"] * 9) + "]"
    for prev, cur in zip("abcdefgh", "bcdefghi", strict=True)]) + "\n"
PEAK_RSS_LIMIT_MB = 300  # measured: about 30 MB when refused; the expanded bomb takes gigabytes
# The child's exit code, output and peak memory (its own: the wrapper has no other child), as JSON.
MEASURED = """
import json, resource, subprocess, sys
r = subprocess.run(sys.argv[1:], capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
print(json.dumps({"rc": r.returncode, "stdout": r.stdout, "stderr": r.stderr,
                  "peak_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))
"""


def test_the_bomb_is_the_reported_size() -> None:
    assert 300 < len(BOMB.encode()) < 400


@pytest.mark.parametrize("argv", [
    ("run", "--price-file", "bomb.yaml", "--output-dir", "runs"),
    ("compare", "--control-plane-costs", "bomb.yaml", "--output-dir", "runs", "--report", "report"),
], ids=["price-file", "control-plane-costs"])
def test_an_alias_bomb_is_one_short_line_exit_2_quickly_in_bounded_memory(
        tmp_path: Path, argv: tuple[str, ...]) -> None:
    (tmp_path / "bomb.yaml").write_text(BOMB)
    began = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", MEASURED, sys.executable, "-m", "llmpack", *argv], cwd=tmp_path,
                          capture_output=True, text=True, timeout=180)
    elapsed_s = time.monotonic() - began
    result = json.loads(proc.stdout)
    lines = [line for line in result["stderr"].splitlines() if line.strip()]
    assert result["rc"] == 2 and len(lines) == 1 and result["stdout"] == "", result
    assert len(lines[0]) < 300 and "bomb.yaml: not valid YAML (line 2: alias *a is not accepted" in lines[0], lines[0]
    assert result["peak_mb"] < PEAK_RSS_LIMIT_MB, result["peak_mb"]
    assert elapsed_s < 60, elapsed_s  # seconds on a loaded machine; the expansion never ends
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bomb.yaml"]  # nothing written


@pytest.mark.parametrize("text", [
    "a: &x 1\nb: *x\n",
    "base: &b {gpu: nvidia-l4}\nprices:\n  - <<: *b\n    per_gpu_hour: 1\n",  # a merge key is an alias too
    "- &x [1]\n- *x\n",
])
def test_every_alias_is_refused_in_one_line(text: str) -> None:
    with pytest.raises(InputError, match=r"^f\.yaml: not valid YAML \(line \d+: alias \*\w+ is not accepted"):
        yamltext.safe_load(text, "f.yaml")


def test_an_anchor_without_an_alias_and_plain_yaml_still_load() -> None:
    assert yamltext.safe_load("a: &x 1\nb: 2\n", "f.yaml") == {"a": 1, "b": 2}
    assert yamltext.safe_load("---\na: 1\n---\nb: [2]\n", "f.yaml", documents=True) == [{"a": 1}, {"b": [2]}]


def test_a_file_past_the_size_limit_is_one_line_and_is_not_read_whole(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    with big.open("wb") as fh:
        fh.truncate(yamltext.MAX_FILE_BYTES + 1)  # sparse: no 16 MiB written
    with pytest.raises(InputError, match=r"^big\.yaml: larger than the 16 MiB limit for a YAML file"):
        yamltext.read_bytes(big, "big.yaml")
    with big.open("r+b") as fh:
        fh.truncate(yamltext.MAX_FILE_BYTES)
    assert len(yamltext.read_bytes(big, "big.yaml")) == yamltext.MAX_FILE_BYTES


def test_an_excerpt_is_bounded_whatever_the_value() -> None:
    assert yamltext.excerpt("-2") == "'-2'" and yamltext.excerpt(["a", "b"]) == "['a', 'b']"
    for value in ("x" * 10_000_000, ["lol"] * 10_000_000, {i: i for i in range(100_000)}, [["x" * 100] * 50]):
        assert len(yamltext.excerpt(value)) <= yamltext.EXCERPT_CHARS


def test_a_huge_value_in_a_price_file_is_quoted_short(tmp_path: Path) -> None:
    from components.record import cost

    path = tmp_path / "p.yaml"
    path.write_text("prices:\n  - {gpu: nvidia-l4, per_gpu_hour: '" + "9x" * 2_000_000 + "'}\n")
    with pytest.raises(InputError) as caught:
        cost.resolve_price("nvidia-l4", price_file=str(path), env={})
    assert len(str(caught.value)) < 300 and "is not a number" in str(caught.value)


def test_every_other_loader_of_a_file_refuses_the_bomb(tmp_path: Path) -> None:
    """The compiled artifacts doctor reads, the submit paths' package, Workflow and Job template, the local runners."""
    from argo_workflows import local as argo_local
    from argo_workflows import submit as argo_submit
    from kfp_pipelines import submit as kfp_submit
    from llmpack.cluster.doctor import pods as doctor_pods
    from mlflow_projects import submit as mlflow_submit

    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(BOMB)
    project = tmp_path / "project"
    project.mkdir()
    (project / "kubernetes_job_template.yaml").write_text(BOMB)
    loaders = {
        "doctor --compiled": lambda: doctor_pods.load_compiled(bomb),
        "submit kfp --package": lambda: kfp_submit._root_parameters(bomb),
        "submit argo --workflow": lambda: argo_submit.load_workflow(bomb),
        "submit mlflow (Job template)": lambda: mlflow_submit._job_template(project),
        "python -m argo_workflows.local": lambda: argo_local.load_workflow(bomb),
    }
    for name, load in loaders.items():
        with pytest.raises(InputError, match="alias \\*a is not accepted") as caught:
            load()
        assert len(str(caught.value)) < 300, name


def test_the_kfp_local_runner_refuses_the_bomb(tmp_path: Path) -> None:
    (tmp_path / "bomb.yaml").write_text(BOMB)
    (tmp_path / "args.json").write_text("{}")
    r = subprocess.run([sys.executable, "-m", "kfp_pipelines.local", "bomb.yaml", "--pipeline-root", "root",
                        "--arguments", "args.json"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 2 and "alias *a is not accepted" in r.stderr and len(r.stderr.strip()) < 300, r.stderr
