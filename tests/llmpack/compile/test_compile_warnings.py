"""What compiles but is likely a mistake is said on stderr; the Workflow bounds its own life.

``--nodes 1000 --gpus 8`` (8000 GPUs) warns past ``LLMPACK_NODES_WARN`` (default 64); an ``--image``
with no tag or digest warns (every pod would pull it ``Always`` and run whatever ``latest`` is then).
The compiled Argo Workflow carries ``activeDeadlineSeconds``, ``ttlStrategy`` and ``podGC``, and the
MLflow backend config names no absolute path of the compiling machine.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import yaml

from components import settings
from llmpack.compile.artifacts import compile_warnings
from llmpack.compile.pod_options import PodOptions
from tests.conftest import REPO, llmpack


def test_too_many_nodes_warns_past_the_configurable_count() -> None:
    (line,) = compile_warnings(None, nodes=1000, gpus=8, env={})
    assert line == ("llmpack: warning: --nodes 1000 (x --gpus 8 = 8000 GPUs) is past 64 nodes; check the number "
                    "(set LLMPACK_NODES_WARN to move this warning)")
    assert compile_warnings(None, nodes=64, gpus=8, env={}) == []
    assert compile_warnings(None, nodes=1000, gpus=8, env={settings.NODES_WARN.name: "1024"}) == []
    assert len(compile_warnings(None, nodes=3, gpus=8, env={settings.NODES_WARN.name: "2"})) == 1


def test_an_untagged_image_warns_a_tag_or_digest_does_not() -> None:
    (line,) = compile_warnings(PodOptions.from_flags(image="ghcr.io/acme/llmpack"), nodes=None, gpus=None, env={})
    assert "--image ghcr.io/acme/llmpack has no tag or digest" in line and "Always" in line
    for image in ("ghcr.io/acme/llmpack:1.2.0", "ghcr.io/acme/llmpack@sha256:" + "ab" * 32,
                  "registry.example:5000/llmpack:0.1"):
        assert compile_warnings(PodOptions.from_flags(image=image), nodes=None, gpus=None, env={}) == [], image


def test_the_cli_prints_the_warnings_and_still_compiles(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != settings.NODES_WARN.name}
    done = llmpack("compile", "--out", str(tmp_path / "out"), "--nodes", "1000", "--gpus", "8", "--cache-pvc", "s",
                   "--image", "ghcr.io/acme/llmpack", cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if line.startswith("llmpack: warning:")]
    assert len(warnings) == 2 and "--nodes 1000" in warnings[0] and "no tag or digest" in warnings[1]
    assert (tmp_path / "out" / "trainjob" / "finetune-trainjob.yaml").is_file()


def test_the_workflow_bounds_its_own_life_and_mounts_no_token() -> None:
    wf = yaml.safe_load((REPO / "argo_workflows" / "finetune.yaml").read_text())["spec"]
    assert wf["activeDeadlineSeconds"] > sum(int(t["activeDeadlineSeconds"]) for t in wf["templates"]
                                             if "activeDeadlineSeconds" in t)
    assert wf["ttlStrategy"] == {"secondsAfterCompletion": 7 * 24 * 3600}
    assert wf["podGC"] == {"strategy": "OnPodSuccess"}
    assert wf["automountServiceAccountToken"] is False and wf["executor"] == {"serviceAccountName": "default"}
    # one node: no template talks to the API, none asks for a token back
    assert not [t["name"] for t in wf["templates"] if t.get("automountServiceAccountToken")]


def test_the_committed_backend_config_names_no_absolute_path() -> None:
    for base in (REPO, REPO / "examples" / "multinode"):
        config = json.loads((base / "mlflow_projects" / "finetune-k8s" / "kubernetes_config.json").read_text())
        assert not Path(config["kube-job-template-path"]).is_absolute(), config
