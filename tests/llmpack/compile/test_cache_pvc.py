"""``llmpack compile --cache-pvc NAME``: the Hugging Face cache on a PVC, on all three paths."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from components.dsl import HF_CACHE_MOUNT
from components.errors import InputError
from components.finetune_pipeline import build
from llmpack.compile.artifacts import compile_all, with_cache_pvc
from tests.llmpack.test_security import argo_problems, credential_findings, job_problems, kfp_problems

PVC = "hf-models"
LOADERS = {"prepare-data", "tokenize", "finetune", "evaluate"}  # steps that read the HF cache
FUSED = {"none": LOADERS, "gpu": {"prepare-data", "tokenize", "finetune-evaluate"}, "all": {"all-steps"}}


def _compiled(out: Path) -> dict[str, Any]:
    spec, platform = yaml.safe_load_all((out / "kfp_pipelines/finetune.yaml").read_text())
    return {
        "kfp": (spec, platform),
        "argo": yaml.safe_load((out / "argo_workflows/finetune.yaml").read_text()),
        "job": yaml.safe_load((out / "mlflow_projects/finetune-k8s/kubernetes_job_template.yaml").read_text()),
    }


@pytest.fixture(scope="module", params=["none", "gpu", "all"])
def compiled(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, Any]]:
    out = tmp_path_factory.mktemp(f"cache-pvc-{request.param}")
    compile_all(out, fuse=request.param, cache_pvc=PVC)
    return request.param, _compiled(out)


def test_only_steps_that_load_from_the_hf_cache_are_marked():
    pipe = build()
    assert {name for name, t in pipe.tasks.items() if t.step.execution.hf_cache} == LOADERS
    cached = with_cache_pvc(pipe, PVC)
    assert {name: t.step.execution.cache_pvc for name, t in cached.tasks.items()} == {
        name: PVC if name in LOADERS else None for name in pipe.tasks}
    assert all(t.step.execution.cache_pvc is None for t in pipe.tasks.values())  # a copy


def test_kfp_mounts_the_pvc_on_exactly_the_loading_executors(compiled: tuple[str, dict[str, Any]]):
    mode, arts = compiled
    spec, platform = arts["kfp"]
    configs = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    mounted = {name.removeprefix("exec-") for name, cfg in configs.items() if cfg.get("pvcMount")}
    assert mounted == FUSED[mode]
    for name in mounted:
        (mount,) = configs[f"exec-{name}"]["pvcMount"]
        assert mount["mountPath"] == HF_CACHE_MOUNT
        assert mount["pvcNameParameter"]["runtimeValue"]["constant"] == PVC
        env = spec["deploymentSpec"]["executors"][f"exec-{name}"]["container"]["env"]
        assert {"name": "HF_HOME", "value": HF_CACHE_MOUNT} in env
    for name, executor in spec["deploymentSpec"]["executors"].items():  # register, close-record: nothing
        if name.removeprefix("exec-") not in mounted:
            assert "HF_HOME" not in str(executor.get("container", {}).get("env"))
    assert kfp_problems(spec, platform) == []


def test_argo_templates_mount_the_pvc_and_set_hf_home(compiled: tuple[str, dict[str, Any]]):
    from kubernetes.client import ApiClient

    mode, arts = compiled
    wf = arts["argo"]
    api = ApiClient()
    containers = {t["name"]: t for t in wf["spec"]["templates"] if "container" in t}
    mounted = {name for name, t in containers.items()
               if any("persistentVolumeClaim" in v for v in t.get("volumes") or [])}
    assert mounted == FUSED[mode]
    tmp = ({"name": "tmp", "emptyDir": {}}, {"name": "tmp", "mountPath": "/tmp"})  # every template: read-only root
    for name in mounted:
        tmpl = containers[name]
        assert tmpl["volumes"] == [{"name": "hf-cache", "persistentVolumeClaim": {"claimName": PVC}}, tmp[0]]
        c = tmpl["container"]
        assert c["volumeMounts"] == [{"name": "hf-cache", "mountPath": HF_CACHE_MOUNT}, tmp[1]]
        assert {"name": "HF_HOME", "value": HF_CACHE_MOUNT} in c["env"]
        # The real client's models take every field and give the same objects back.
        pairs = [(tmpl["volumes"][0], "V1Volume"), (c["volumeMounts"][0], "V1VolumeMount"),
                 *((e, "V1EnvVar") for e in c["env"])]
        for obj, kind in pairs:
            model = api._ApiClient__deserialize(obj, kind)  # noqa: SLF001 - the client's own deserializer
            assert api.sanitize_for_serialization(model) == obj
    for name in set(containers) - mounted:
        assert containers[name]["container"]["volumeMounts"] == [tmp[1]]
    assert argo_problems(wf) == []
    assert credential_findings(yaml.safe_dump(wf)) == []


def test_mlflow_job_mounts_the_pvc_and_points_hf_home_at_it(compiled: tuple[str, dict[str, Any]]):
    from kubernetes.client import ApiClient

    _, arts = compiled
    job = arts["job"]
    pod = job["spec"]["template"]["spec"]
    assert {"name": "hf-cache", "persistentVolumeClaim": {"claimName": PVC}} in pod["volumes"]
    (c,) = pod["containers"]
    assert {"name": "hf-cache", "mountPath": HF_CACHE_MOUNT} in c["volumeMounts"]
    assert [e["value"] for e in c["env"] if e["name"] == "HF_HOME"] == [HF_CACHE_MOUNT]
    api = ApiClient()
    model = api._ApiClient__deserialize(job, "V1Job")  # noqa: SLF001 - the client's own deserializer
    assert api.sanitize_for_serialization(model) == job
    assert job_problems(job) == []


def test_without_cache_pvc_nothing_is_mounted(tmp_path: Path):
    compile_all(tmp_path)
    arts = _compiled(tmp_path)
    _, platform = arts["kfp"]
    assert not any(cfg.get("pvcMount")
                   for cfg in platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"].values())
    assert not any("persistentVolumeClaim" in v
                   for t in arts["argo"]["spec"]["templates"] for v in t.get("volumes") or [])
    pod = arts["job"]["spec"]["template"]["spec"]
    assert "hf-cache" not in {v["name"] for v in pod["volumes"]}
    assert [e["value"] for e in pod["containers"][0]["env"] if e["name"] == "HF_HOME"] == ["/tmp/huggingface"]


@pytest.mark.parametrize("bad", ["Bad_Name", "-hf", "hf-", "hf..models", "", "a" * 254, "hf models", "hf/models"])
def test_a_bad_pvc_name_is_refused(bad: str, tmp_path: Path):
    with pytest.raises(InputError, match="not a PersistentVolumeClaim name"):
        compile_all(tmp_path / "out", cache_pvc=bad)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("good", ["hf-models", "hf.models.v1", "a" * 253, "0"])
def test_a_dns1123_subdomain_is_accepted(good: str):
    with_cache_pvc(build(), good)


def test_the_cli_refuses_a_bad_name_with_one_line_and_exit_2(tmp_path: Path):
    from llmpack.cli import main

    res = CliRunner().invoke(main, ["compile", "--out", str(tmp_path / "out"), "--cache-pvc", "Bad_Name"])
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert lines == ["llmpack: error: --cache-pvc 'Bad_Name': not a PersistentVolumeClaim name "
                     "(lower-case letters, digits, '-' and '.')"]
    assert not (tmp_path / "out").exists()


def test_the_cli_compiles_with_the_cache_pvc(tmp_path: Path):
    from llmpack.cli import main

    res = CliRunner().invoke(main, ["compile", "--out", str(tmp_path), "--cache-pvc", PVC])
    assert res.exit_code == 0, res.output
    assert f"claimName: {PVC}" in (tmp_path / "argo_workflows/finetune.yaml").read_text()
