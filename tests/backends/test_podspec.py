"""Model and data volumes, HF_TOKEN, one image and pull spec on every pod.

Compiled with ``--image repo@sha256:... --model-pvc --data-pvc --hf-token-secret --image-pull-secret``
(one node, and a 2 x 4 GPU TrainJob gang with the prepull DaemonSet), then read back on every path:
KFP's IR and platform spec, the Argo Workflow, the MLflow project and Job template, the TrainJob,
the DaemonSet. ``/models`` and ``/data`` are mounted read-only into the steps that read them,
``HF_TOKEN`` is a required ``secretKeyRef``, and every pod has the same image, pull policy and
pull Secrets. The artifacts pass the validators the other tests use (Argo's models, the Trainer
API models and CRD schema, the Kubernetes client's models, Pod Security ``restricted``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from components.errors import InputError
from llmpack.cli import main
from llmpack.compile.artifacts import compile_all, compiled_for_submit
from llmpack.compile.pod_options import PodOptions
from llmpack.compile.prepull import PAUSE_IMAGE
from tests.backends.test_pod_security import argo_pods, job_pods, kfp_pods, restricted_violations, trainjob_pods
from tests.components.test_trainjob import _schema, schema_errors, trainer_api_errors

IMAGE = "registry.example.com/team/llmpack@sha256:" + "4f" * 32
FLAGS = ("--image", IMAGE, "--model-pvc", "llmpack-models", "--data-pvc", "llmpack-data:/datasets",
         "--hf-token-secret", "hf-token", "--image-pull-secret", "regcred", "--image-pull-secret", "mirror")
POD = PodOptions.from_flags(image=IMAGE, model_pvc="llmpack-models", data_pvc="llmpack-data:/datasets",
                            hf_token_secret="hf-token", image_pull_secrets=("regcred", "mirror"))
PULL_SECRETS = [{"name": "regcred"}, {"name": "mirror"}]
MODEL_STEPS = ("tokenize", "finetune", "evaluate", "register")  # take the model parameter or a Model artifact
HF_TOKEN = {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}}}


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("podspec")
    result = CliRunner().invoke(main, ["compile", "--out", str(root / "one"), *FLAGS, "--namespace", "team-a",
                                       "--mlflow-repository-uri", "registry.example.com/team/mlflow-projects"])
    assert result.exit_code == 0, result.output
    compile_all(root / "gang", pod=POD, nodes=2, gpus=4, cache_pvc="llmpack-shared", prepull=True)
    return {"one": root / "one", "gang": root / "gang"}


def kfp(base: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    spec, platform = yaml.safe_load_all((base / "kfp_pipelines" / "finetune.yaml").read_text())
    return spec, platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]


def argo(base: Path) -> dict[str, Any]:
    return yaml.safe_load((base / "argo_workflows" / "finetune.yaml").read_text())


def job(base: Path) -> dict[str, Any]:
    return yaml.safe_load((base / "mlflow_projects" / "finetune-k8s" / "kubernetes_job_template.yaml").read_text())


def trainjob(base: Path) -> dict[str, Any]:
    return yaml.safe_load((base / "trainjob" / "finetune-trainjob.yaml").read_text())


# --------------------------------------------------------------------------- /models and /data reach the steps


@pytest.mark.parametrize("variant", ["one", "gang"])
def test_kfp_mounts_model_and_data_and_maps_hf_token(compiled: dict[str, Path], variant: str) -> None:
    _, configs = kfp(compiled[variant])
    for name, cfg in configs.items():
        step = name.removeprefix("exec-")
        mounts = {m["mountPath"]: m["constant"] for m in cfg.get("pvcMount") or []}
        assert (mounts.get("/models") == "llmpack-models") == (step in MODEL_STEPS), name
        assert (mounts.get("/datasets") == "llmpack-data") == (step == "prepare-data"), name
        hf = [s for s in cfg.get("secretAsEnv") or [] if any(k["envVar"] == "HF_TOKEN" for k in s["keyToEnv"])]
        assert hf == ([{"keyToEnv": [{"envVar": "HF_TOKEN", "secretKey": "token"}], "optional": False,
                        "secretName": "hf-token", "secretNameParameter": {"runtimeValue": {"constant": "hf-token"}}}]
                      if step in MODEL_STEPS else []), name


@pytest.mark.parametrize("variant", ["one", "gang"])
def test_argo_mounts_model_and_data_read_only_and_maps_hf_token(compiled: dict[str, Path], variant: str) -> None:
    templates = {t["name"]: t for t in argo(compiled[variant])["spec"]["templates"] if "container" in t}
    for name, tmpl in templates.items():
        mounts = {m["mountPath"]: m for m in tmpl["container"].get("volumeMounts") or []}
        claims = {v["name"]: v["persistentVolumeClaim"]
                  for v in tmpl.get("volumes") or [] if "persistentVolumeClaim" in v}
        reads_model, reads_data = name in MODEL_STEPS, name == "prepare-data"
        assert ("/models" in mounts) == reads_model and ("/datasets" in mounts) == reads_data, name
        for path, claim in (("/models", "llmpack-models"), ("/datasets", "llmpack-data")):
            if path in mounts:
                assert mounts[path]["readOnly"] is True
                assert claims[mounts[path]["name"]] == {"claimName": claim, "readOnly": True}
        assert (HF_TOKEN in tmpl["container"].get("env", [])) == reads_model, name


def test_mlflow_job_mounts_both_and_maps_hf_token(compiled: dict[str, Path]) -> None:
    doc = job(compiled["one"])
    pod = doc["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts["/models"]["readOnly"] and mounts["/datasets"]["readOnly"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert (volumes[mounts["/models"]["name"]]["persistentVolumeClaim"]
            == {"claimName": "llmpack-models", "readOnly": True})
    assert HF_TOKEN in container["env"]
    assert doc["metadata"]["namespace"] == "team-a"  # compile --namespace
    config = json.loads((compiled["one"] / "mlflow_projects" / "finetune-k8s" / "kubernetes_config.json").read_text())
    assert config["repository-uri"] == "registry.example.com/team/mlflow-projects"


def test_trainjob_node_pods_mount_the_model_and_get_hf_token(compiled: dict[str, Path]) -> None:
    (_, pod), = trainjob_pods(compiled["gang"] / "trainjob" / "finetune-trainjob.yaml")
    (node,) = pod["containers"]
    mounts = {m["mountPath"]: m for m in node["volumeMounts"]}
    assert mounts["/models"]["readOnly"] is True and "/datasets" not in mounts  # finetune reads tokens, not the data
    assert HF_TOKEN in trainjob(compiled["gang"])["spec"]["trainer"]["env"]


def test_model_and_data_paths_resolve_inside_the_mounts() -> None:
    """`--model /models/x` needs the model volume; with it, the path lies inside the mount."""
    POD.check_mounted("/models/llama-3.2-1b", "--model")
    POD.check_mounted("/datasets/train.jsonl", "--data")
    with pytest.raises(InputError, match="^--model /models/llama: no volume is mounted at /models in the pods; "
                                         "pass --model-pvc NAME"):
        PodOptions().check_mounted("/models/llama", "--model")
    with pytest.raises(InputError, match="^--data /data/train.jsonl: .* pass --data-pvc NAME"):
        PodOptions().check_mounted("/data/train.jsonl", "--data")
    PodOptions().check_mounted("meta-llama/Llama-3.2-1B", "--model")  # an HF hub id needs no volume


# --------------------------------------------------------------------------- one image, one pull spec, every pod


def all_pods(base: Path) -> list[tuple[str, str, str | None, list[dict[str, str]]]]:
    """(where, image, imagePullPolicy, imagePullSecrets) of every pod container llmpack compiles under ``base``."""
    out = []
    spec, configs = kfp(base)
    for name, executor in spec["deploymentSpec"]["executors"].items():
        cfg = configs[name]
        out.append((f"kfp {name}", executor["container"]["image"], cfg.get("imagePullPolicy"),
                    [{"name": s["secretName"]} for s in cfg.get("imagePullSecret") or []]))
    wf = argo(base)
    for tmpl in wf["spec"]["templates"]:
        if "container" in tmpl:
            out.append((f"argo {tmpl['name']}", tmpl["container"]["image"], tmpl["container"].get("imagePullPolicy"),
                        wf["spec"].get("imagePullSecrets") or []))
    project = yaml.safe_load((base / "mlflow_projects" / "finetune-k8s" / "MLproject").read_text())
    pod = job(base)["spec"]["template"]["spec"]
    out.append(("mlflow Job", project["docker_env"]["image"], pod["containers"][0].get("imagePullPolicy"),
                pod.get("imagePullSecrets") or []))
    if (base / "trainjob").is_dir():
        obj = trainjob(base)
        (_, node), = trainjob_pods(base / "trainjob" / "finetune-trainjob.yaml")
        # The trainer has no imagePullPolicy field (Trainer v2.3): Kubernetes' default for a digest, IfNotPresent.
        out.append(("TrainJob node pods", obj["spec"]["trainer"]["image"], node.get("imagePullPolicy", "IfNotPresent"),
                    node.get("imagePullSecrets") or []))
    if (base / "prepull").is_dir():
        ds = yaml.safe_load(
            (base / "prepull" / "llmpack-prepull-daemonset.yaml").read_text())["spec"]["template"]["spec"]
        for c in ds["initContainers"]:
            out.append((f"prepull {c['name']}", c["image"], c.get("imagePullPolicy"), ds.get("imagePullSecrets") or []))
    return out


@pytest.mark.parametrize("variant", ["one", "gang"])
def test_every_pod_on_every_path_has_the_same_image_policy_and_pull_secrets(compiled: dict[str, Path],
                                                                            variant: str) -> None:
    pods = all_pods(compiled[variant])
    paths = {where.split()[0] for where, *_ in pods}
    assert paths == ({"kfp", "argo", "mlflow"} | ({"TrainJob", "prepull"} if variant == "gang" else set()))
    # five steps and the summarizing task on KFP and on Argo, the MLflow Job; the gang's node pods and the DaemonSet
    assert len(pods) == 2 * (5 + 1) + 1 + (2 if variant == "gang" else 0)
    for where, image, policy, secrets in pods:
        assert (image, policy, secrets) == (IMAGE, "IfNotPresent", PULL_SECRETS), where


def test_the_pause_image_is_pinned_by_digest_and_pulled_like_the_rest(compiled: dict[str, Path]) -> None:
    ds = yaml.safe_load((compiled["gang"] / "prepull" / "llmpack-prepull-daemonset.yaml").read_text())
    (idle,) = ds["spec"]["template"]["spec"]["containers"]
    assert (idle["image"] == PAUSE_IMAGE and PAUSE_IMAGE.split("@")[1].startswith("sha256:")
            and len(PAUSE_IMAGE.split(":")[-1]) == 64)
    assert ds["spec"]["template"]["spec"]["imagePullSecrets"] == PULL_SECRETS


@pytest.mark.parametrize(("image", "policy"), [("ghcr.io/o/llmpack:latest", "Always"), ("ghcr.io/o/llmpack", "Always"),
                                               ("ghcr.io/o/llmpack:0.2", "IfNotPresent"),
                                               ("localhost:5000/llmpack", "Always"), (IMAGE, "IfNotPresent")])
def test_the_default_pull_policy_is_kubernetes_own(image: str, policy: str) -> None:
    assert PodOptions.from_flags(image=image).pull_policy == policy
    assert PodOptions.from_flags(image=image, image_pull_policy="Never").pull_policy == "Never"
    assert PodOptions().pull_policy is None  # nothing asked: nothing written, the goldens stay


# --------------------------------------------------------------------------- the validators the other tests use


@pytest.mark.slow  # the first import of kubernetes, Hera's models and the Trainer API models: seconds
def test_the_artifacts_pass_the_upstream_models_and_schemas(compiled: dict[str, Path]) -> None:
    import kubernetes
    from hera.workflows.models import Workflow as ModelWorkflow

    for variant in ("one", "gang"):
        ModelWorkflow.model_validate(argo(compiled[variant]))
        api = kubernetes.client.ApiClient()
        model = api._ApiClient__deserialize(job(compiled[variant]), "V1Job")
        assert model.spec.template.spec.image_pull_secrets[0].name == "regcred"
        assert model.spec.template.spec.containers[0].image_pull_policy == "IfNotPresent"
    obj = trainjob(compiled["gang"])
    assert trainer_api_errors(obj) == [] and schema_errors(obj, _schema()) == []
    ds = yaml.safe_load((compiled["gang"] / "prepull" / "llmpack-prepull-daemonset.yaml").read_text())
    api = kubernetes.client.ApiClient()
    assert api._ApiClient__deserialize(ds, "V1DaemonSet").spec.template.spec.image_pull_secrets[1].name == "mirror"


def test_the_kfp_platform_spec_parses_as_kfp_kubernetes_proto(compiled: dict[str, Path]) -> None:
    from google.protobuf import json_format
    from kfp.kubernetes import kubernetes_executor_config_pb2 as pb

    _, configs = kfp(compiled["one"])
    for cfg in configs.values():  # unknown fields are an error: a misspelt key shows here
        json_format.ParseDict(cfg, pb.KubernetesExecutorConfig())


@pytest.mark.parametrize("variant", ["one", "gang"])
def test_pods_with_the_volumes_still_pass_pod_security_restricted(compiled: dict[str, Path], variant: str) -> None:
    base = compiled[variant]
    pods = [*kfp_pods(base / "kfp_pipelines" / "finetune.yaml"), *argo_pods(base / "argo_workflows" / "finetune.yaml"),
            *job_pods(base / "mlflow_projects" / "finetune-k8s" / "kubernetes_job_template.yaml")]
    if variant == "gang":
        pods += list(trainjob_pods(base / "trainjob" / "finetune-trainjob.yaml"))
    for where, pod in pods:
        assert restricted_violations(pod) == [], where


# --------------------------------------------------------------------------- flags: bad input, submit, compare


@pytest.mark.parametrize(("args", "message"), [
    (("--image", "ghcr.io/o/llmpack@sha256:abc"), "--image 'ghcr.io/o/llmpack@sha256:abc': digest 'sha256:abc' is not "
                                                  "sha256:<64 lower-case hex digits>"),
    (("--image", "ghcr.io/o/llmpack@sha256:" + "A" * 64), "is not sha256:<64 lower-case hex digits>"),
    (("--image-pull-policy", "Sometimes"),
     "--image-pull-policy 'Sometimes': must be one of Always, IfNotPresent, Never"),
    (("--model-pvc", "Models"), "--model-pvc 'Models': not a PersistentVolumeClaim name"),
    (("--data-pvc", "data:relative"), "--data-pvc 'data:relative': the mount path must be an absolute directory"),
    (("--hf-token-secret", "hf:bad key"), "--hf-token-secret 'hf:bad key': key 'bad key' is not a Secret key"),
    (("--image-pull-secret", "Reg_Cred"), "--image-pull-secret 'Reg_Cred': not a Secret name"),
    (("--nodes", "2", "--gpus", "4", "--cache-pvc", "s", "--image-pull-policy", "Always"),
     "--image-pull-policy Always with --nodes 2: a TrainJob's trainer has no pull policy"),
])
def test_bad_pod_flags_are_one_line_exit_2(tmp_path: Path, args: tuple[str, ...], message: str) -> None:
    result = CliRunner().invoke(main, ["compile", "--out", str(tmp_path / "out"), *args])
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, result.output
    assert message in result.output and "Traceback" not in result.output
    assert not (tmp_path / "out").exists()


def test_submit_with_a_model_under_models_and_no_volume_fails_naming_the_flag() -> None:
    for path in ("kfp", "argo", "mlflow"):
        result = CliRunner().invoke(main, ["cluster", "submit", path, "--model", "/models/llama-3.2-1b"])
        assert result.exit_code == 2, result.output
        assert result.output.strip() == (
            "llmpack: error: --model /models/llama-3.2-1b: no volume is mounted at /models "
            "in the pods; pass --model-pvc NAME (the PersistentVolumeClaim that holds it), "
            "or an HF hub id with --hf-token-secret")


@pytest.mark.slow  # a compile of its own
def test_submit_compiles_with_the_pod_flags_and_refuses_them_with_a_named_artifact(tmp_path: Path) -> None:
    with compiled_for_submit("argo", None, {}, pod=POD, values={"model": "/models/x"}) as artifact:
        wf = yaml.safe_load(Path(artifact["workflow_path"]).read_text())
        assert {t["container"]["image"] for t in wf["spec"]["templates"] if "container" in t} == {IMAGE}
    assert not Path(artifact["workflow_path"]).exists()  # removed after the submission
    with (pytest.raises(InputError, match="not with --package"),
          compiled_for_submit("kfp", None, {"package_path": "x"}, pod=POD)):
        pass
    # MLflow's submit takes the Job's image itself: --image with --project is passed through, not compiled
    with compiled_for_submit("mlflow", None, {"project_dir": "p"}, pod=PodOptions.from_flags(image=IMAGE)) as extra:
        assert extra == {"image": IMAGE}


def test_compare_takes_the_pod_flags_only_with_cluster() -> None:
    result = CliRunner().invoke(main, ["compare", "--image", IMAGE])
    assert result.exit_code == 2 and "llmpack cluster compare" in result.output, result.output
    result = CliRunner().invoke(main, ["cluster", "compare", "--backends", "argo", "--model", "/models/x"])
    assert result.exit_code == 2 and "pass --model-pvc NAME" in result.output, result.output


@pytest.mark.slow  # a compile and a submission
def test_submit_argo_with_the_flags_sends_the_volumes_through_the_stand_in(monkeypatch: pytest.MonkeyPatch) -> None:
    """`llmpack submit argo --model-pvc ... --model /models/x`: the Workflow the Argo Server gets mounts /models."""
    from standins.argo_server import ArgoServerStandIn

    for name in ("ARGO_SERVER", "ARGO_NAMESPACE", "ARGO_SECURE", "MLFLOW_TRACKING_URI", "LLMPACK_PRICE_PER_GPU_HOUR"):
        monkeypatch.delenv(name, raising=False)
    with ArgoServerStandIn(token="argo-podspec-token") as argo_server:
        result = CliRunner().invoke(main, ["cluster", "submit", "argo", "--host", argo_server.url, "--model",
                                           "/models/llama",
                                           "--model-pvc", "llmpack-models", "--hf-token-secret", "hf-token",
                                           "--image", IMAGE, "--image-pull-secret", "regcred", "--json"],
                                    env={"ARGO_TOKEN": "argo-podspec-token"})
        assert result.exit_code == 0, result.output
        (post,) = argo_server.recorded("POST")
    sent = post.body["workflow"]
    assert {p["name"]: p["value"] for p in sent["spec"]["arguments"]["parameters"]}["model"] == "/models/llama"
    assert sent["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    finetune = next(t for t in sent["spec"]["templates"] if t["name"] == "finetune")
    assert {"name": "llmpack-model", "mountPath": "/models", "readOnly": True} in finetune["container"]["volumeMounts"]
    assert HF_TOKEN in finetune["container"]["env"] and finetune["container"]["image"] == IMAGE
