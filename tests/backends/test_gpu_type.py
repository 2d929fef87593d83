"""``--gpu-type``: it selects the GPU's nodes, labels the pods and prices the run on every path; CPUs follow GPUs.

Checked on the compiled artifacts of ``llmpack compile --gpu-type a100`` (one node, and 2 nodes x 4
GPUs: the TrainJob) against the committed default ones (H100 80GB): KFP's platform spec, the Argo
Workflow, the MLflow Job template and ``pipeline.json``, the TrainJob. The in-pipeline price is what
each path's summarizing task computes from its compiled ``--uses`` (``record.price_for``, the
shipped table with no flag or env).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from components.dsl import Resources
from components.errors import InputError
from components.gpu_nodes import GPU_NODES, GPU_PRESENT_LABEL, PRODUCT_LABEL, node_affinity
from components.record import close as record
from llmpack.cli import main
from llmpack.compile.artifacts import compile_all, compiled_for_submit
from llmpack.gpu_catalogue import GPU_PRODUCTS, known_gpu_types, resolve_gpu_type, resources_for_gpus, scale_memory
from tests.conftest import REPO

A100 = "nvidia-a100-80gb"
H100 = "nvidia-h100-80gb"
GPU_STEPS = ("finetune", "evaluate")


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gpu-type")
    compile_all(root / "a100", gpu_type="a100")
    compile_all(root / "a100-2x4", gpu_type=A100, nodes=2, gpus=4, cache_pvc="llmpack-shared")
    compile_all(root / "h100-4", gpus=4)
    return {"a100": root / "a100", "a100-2x4": root / "a100-2x4", "h100-4": root / "h100-4", "default": REPO}


# --------------------------------------------------------------------------- what each path compiled


def kfp(base: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    spec, platform = yaml.safe_load_all((base / "kfp_pipelines" / "finetune.yaml").read_text())
    return spec, platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]


def argo_templates(base: Path) -> dict[str, dict[str, Any]]:
    wf = yaml.safe_load((base / "argo_workflows" / "finetune.yaml").read_text())
    return {t["name"]: t for t in wf["spec"]["templates"]}


def job_pod(base: Path) -> dict[str, Any]:
    job = yaml.safe_load((base / "mlflow_projects" / "finetune-k8s" / "kubernetes_job_template.yaml").read_text())
    return job["spec"]["template"]


def uses_by_path(base: Path) -> dict[str, list[Any]]:
    """Each path's summarizing task's ``--uses`` (MLflow: pipeline.json's)."""
    spec, _ = kfp(base)
    source = "\n".join(spec["deploymentSpec"]["executors"][f"exec-{record.CLOSE_TASK}"]["container"]["command"])
    (kfp_uses,) = re.findall(r"'--uses=(\[[^']*\])'", source)
    close = argo_templates(base)[record.CLOSE_TASK]["container"]["args"]
    argo_uses = next(a for a in close if a.startswith("--uses="))[len("--uses="):]
    mlflow = json.loads((base / "mlflow_projects" / "finetune-k8s" / "pipeline.json").read_text())["uses"]
    return {"kfp": record.parse_uses(kfp_uses), "argo": record.parse_uses(argo_uses),
            "mlflow": record.parse_uses(json.dumps(mlflow))}


def affinity_terms(affinity: dict[str, Any]) -> list[list[dict[str, Any]]]:
    return [t["matchExpressions"]
            for t in affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]]


def products(terms: list[list[dict[str, Any]]]) -> set[str]:
    return {v for term in terms for e in term if e["key"] == PRODUCT_LABEL for v in e["values"]}


# --------------------------------------------------------------------------- --gpu-type a100 on every path


@pytest.mark.parametrize(("variant", "gpu_type", "product"), [("a100", A100, "NVIDIA-A100-SXM4-80GB"),
                                                             ("default", H100, "NVIDIA-H100-80GB-HBM3")])
def test_kfp_gpu_pods_select_label_and_price_the_type(compiled: dict[str, Path], variant: str, gpu_type: str,
                                                       product: str) -> None:
    _, configs = kfp(compiled[variant])
    for step in GPU_STEPS:
        cfg = configs[f"exec-{step}"]
        assert product in products([t["matchExpressions"] for t in cfg["nodeAffinity"]]), step
        assert len(cfg["nodeAffinity"]) == len(GPU_NODES[gpu_type].terms())  # one ORed term per node label
        assert GPU_PRESENT_LABEL not in (cfg.get("nodeSelector") or {}).get("labels", {})
        assert cfg["podMetadata"]["labels"]["llmpack.io/gpu-type"] == gpu_type
    assert "nodeAffinity" not in configs["exec-prepare-data"]  # a CPU step goes anywhere
    assert {u.gpu_type for u in uses_by_path(compiled[variant])["kfp"]} == {gpu_type}


def test_argo_gpu_pods_select_label_and_price_the_type(compiled: dict[str, Path]) -> None:
    templates = argo_templates(compiled["a100"])
    for step in GPU_STEPS:
        tmpl = templates[step]
        assert products(affinity_terms(tmpl["affinity"]["nodeAffinity"])) == {"NVIDIA-A100-SXM4-80GB"}
        assert GPU_PRESENT_LABEL not in (tmpl.get("nodeSelector") or {})
        assert tmpl["metadata"]["labels"]["llmpack.io/gpu-type"] == A100
    metric_labels = {label["key"]: label["value"]
                     for label in templates["finetune"]["metrics"]["prometheus"][0]["labels"]}
    assert metric_labels["gpu_type"] == A100
    assert "affinity" not in templates["prepare-data"]


def test_mlflow_job_selects_labels_and_prices_the_type(compiled: dict[str, Path]) -> None:
    pod = job_pod(compiled["a100"])
    assert products(affinity_terms(pod["spec"]["affinity"]["nodeAffinity"])) == {"NVIDIA-A100-SXM4-80GB"}
    assert GPU_PRESENT_LABEL not in (pod["spec"].get("nodeSelector") or {})
    assert pod["metadata"]["labels"]["llmpack.io/gpu-type"] == A100


@pytest.mark.parametrize("path", ["kfp", "argo", "mlflow"])
def test_the_in_pipeline_price_is_the_chosen_types(compiled: dict[str, Path], path: str) -> None:
    for variant, gpu_type in (("a100", A100), ("a100-2x4", A100), ("default", H100)):
        price = record.price_for(uses_by_path(compiled[variant])[path], env={})
        assert price is not None and price.gpu_type == gpu_type, (variant, price)
    a100 = record.price_for(uses_by_path(compiled["a100"])[path], env={})
    h100 = record.price_for(uses_by_path(compiled["default"])[path], env={})
    assert a100.per_gpu_hour != h100.per_gpu_hour  # type: ignore[union-attr]


def test_the_trainjob_selects_labels_sizes_and_prices_the_type(compiled: dict[str, Path]) -> None:
    base = compiled["a100-2x4"]
    obj = yaml.safe_load((base / "trainjob" / "finetune-trainjob.yaml").read_text())
    (patch,) = obj["spec"]["runtimePatches"]
    pod = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    assert products(affinity_terms(pod["spec"]["affinity"]["nodeAffinity"])) == {"NVIDIA-A100-SXM4-80GB"}
    assert pod["metadata"]["labels"]["llmpack.io/gpu-type"] == A100 == obj["metadata"]["labels"]["llmpack.io/gpu-type"]
    # 4 GPUs a node: 4 x the spec's 8 CPUs and 64Gi per GPU, not the single-GPU pod's
    assert obj["spec"]["trainer"]["resourcesPerNode"]["requests"] == {"cpu": "32", "memory": "256Gi",
                                                                      "nvidia.com/gpu": "4"}
    # 8Gi a GPU
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "32Gi"}} in pod["spec"]["volumes"]
    # the launcher pods hold no GPU; every path bills the gang's 8 A100s, and only them (MLflow's Job runs on CPU)
    _, configs = kfp(base)
    assert "nodeAffinity" not in configs["exec-finetune"]
    assert configs["exec-finetune"]["podMetadata"]["labels"]["llmpack.io/gpu-type"] == "none"
    assert "affinity" not in argo_templates(base)["finetune"]
    gang = {path: next(u for u in uses if u.step == "finetune") for path, uses in uses_by_path(base).items()}
    assert ({p: (u.gpus, u.gpu_type) for p, u in gang.items()}
            == {"kfp": (8, A100), "argo": (8, A100), "mlflow": (8, A100)})
    assert [u.step for u in uses_by_path(base)["mlflow"]] == ["finetune"]  # no other step billed a GPU
    job = job_pod(base)["spec"]
    assert "nvidia.com/gpu" not in job["containers"][0]["resources"]["limits"]  # no idle GPU while the gang trains
    assert "affinity" not in job and "tolerations" not in job


def test_a_pod_of_several_gpus_gets_cpus_memory_and_shm_per_gpu(compiled: dict[str, Path]) -> None:
    base = compiled["h100-4"]
    spec, configs = kfp(base)
    res = spec["deploymentSpec"]["executors"]["exec-finetune"]["container"]["resources"]
    assert ((res["resourceCpuRequest"], res["resourceMemoryRequest"], res["accelerator"]["count"])
            == ("32", "256Gi", "4"))
    assert configs["exec-finetune"]["emptyDirMounts"] == [{"medium": "Memory", "mountPath": "/dev/shm",
                                                           "volumeName": "dshm", "sizeLimit": "32Gi"}]
    assert "emptyDirMounts" not in configs["exec-evaluate"]  # one GPU: no NCCL between GPUs
    tmpl = argo_templates(base)["finetune"]
    assert tmpl["container"]["resources"]["requests"]["cpu"] == "32"
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "32Gi"}} in tmpl["volumes"]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in tmpl["container"]["volumeMounts"]
    assert argo_templates(base)["evaluate"]["volumes"] == [{"name": "tmp", "emptyDir": {}}]  # one GPU: no /dev/shm
    limits = job_pod(base)["spec"]["containers"][0]["resources"]["limits"]
    assert (limits["cpu"], limits["memory"], limits["nvidia.com/gpu"]) == ("32", "256Gi", "4")


# --------------------------------------------------------------------------- names, refusals, the rule


def test_short_names_and_full_ids_are_one_type() -> None:
    assert resolve_gpu_type("a100") == resolve_gpu_type("A100-80GB") == resolve_gpu_type(" nvidia-a100-80gb") == A100
    assert resolve_gpu_type("a100-40gb") == "nvidia-a100-40gb"
    assert resolve_gpu_type("h100") == H100 and resolve_gpu_type("l4") == "nvidia-l4"
    assert set(known_gpu_types()) == set(GPU_NODES)  # every placed type is priced, and the other way round
    for gpu_type in known_gpu_types():
        assert resolve_gpu_type(gpu_type) == gpu_type and node_affinity(gpu_type) is not None
    # the node a run lands on is priced as the type whose pods select it
    assert {t for t in GPU_PRODUCTS.values()} == set(GPU_NODES)


def test_an_unknown_gpu_type_is_one_line_listing_the_known(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"--gpu-type 'b200': unknown GPU type; known: a100 \(nvidia-a100-80gb\),"):
        compile_all(tmp_path / "out", gpu_type="b200")
    assert not (tmp_path / "out").exists()
    result = CliRunner().invoke(main, ["compile", "--gpu-type", "b200", "--out", str(tmp_path / "cli")])
    assert result.exit_code == 2
    (line,) = result.output.strip().splitlines()
    assert line.startswith("llmpack: error: --gpu-type 'b200': unknown GPU type; known:") and "l4 (nvidia-l4)" in line
    assert "Traceback" not in result.output


def test_submit_gpu_type_compiles_first_and_refuses_a_named_artifact() -> None:
    with compiled_for_submit("argo", "l4", {}) as artifact:
        wf = yaml.safe_load(Path(artifact["workflow_path"]).read_text())
        finetune = next(t for t in wf["spec"]["templates"] if t["name"] == "finetune")
        assert products(affinity_terms(finetune["affinity"]["nodeAffinity"])) == {"NVIDIA-L4"}
        where = Path(artifact["workflow_path"])
    assert not where.exists()  # removed once submitted
    with pytest.raises(InputError, match="not with --package"), compiled_for_submit("kfp", "l4", {"package_path": "x"}):
        pass
    result = CliRunner().invoke(main, ["cluster", "submit", "kfp", "--gpu-type", "z9", "--host", "http://127.0.0.1:9"])
    assert result.exit_code == 2 and "unknown GPU type" in result.output


def test_compare_cluster_takes_gpu_type_and_checks_it_before_submitting() -> None:
    from llmpack.cluster.compare.cluster import compare_cluster

    with pytest.raises(InputError, match="unknown GPU type"):
        compare_cluster(backends="argo", repeats=1, params={}, gpu_type="b200")


@pytest.mark.parametrize(("res", "gpus", "cpu", "memory"), [
    (Resources(cpu=8, memory="64Gi", gpus=1, gpu_type=H100), 4, 32, "256Gi"),
    (Resources(cpu=8, memory="64Gi", gpus=1, gpu_type=H100), 1, 8, "64Gi"),
    (Resources(cpu=8, memory="64Gi", gpus=2, gpu_type=H100), 3, 12, "96Gi"),
    (Resources(cpu=6, memory="10Gi", gpus=4, gpu_type=H100), 1, 1.5, "2560Mi"),
    (Resources(cpu=8, memory="64Gi", gpus=1, gpu_type=H100), 0, 8, "64Gi"),  # on CPUs: the spec's numbers
])
def test_cpus_and_memory_are_per_gpu_times_gpus(res: Resources, gpus: int, cpu: float, memory: str) -> None:
    out = resources_for_gpus(res, gpus)
    assert (out.gpus, out.cpu, out.memory) == (gpus, cpu, memory)


def test_scale_memory_rounds_up_in_mi_and_refuses_what_it_cannot_read() -> None:
    assert (scale_memory("64Gi", 0.5) == "32Gi" and scale_memory("1G", 3) == "3G"
            and scale_memory("1Gi", 1 / 3) == "342Mi")
    with pytest.raises(InputError, match="memory"):
        scale_memory("lots", 2)


def test_run_gpu_type_takes_short_names_and_keeps_other_names_for_a_price_file() -> None:
    from llmpack.ui.options import gpu_type_name

    assert gpu_type_name(None, None, "a100") == A100  # type: ignore[arg-type]
    assert gpu_type_name(None, None, "acme-x1000") == "acme-x1000"  # type: ignore[arg-type]


def test_the_local_argo_executor_takes_a_multi_gpu_pods_shm_and_no_other_volume(compiled: dict[str, Path]) -> None:
    """``llmpack run --backend argo --nproc-per-node 2`` compiles a 2-GPU finetune: its /dev/shm has no local effect."""
    from argo_workflows.local import load_workflow

    text = (compiled["h100-4"] / "argo_workflows" / "finetune.yaml").read_text()
    assert "finetune" in load_workflow(text).templates
    doc = yaml.safe_load(text)
    finetune = next(t for t in doc["spec"]["templates"] if t["name"] == "finetune")
    finetune["volumes"].append({"name": "host", "hostPath": {"path": "/"}})
    with pytest.raises(InputError, match="unsupported feature volumes"):
        load_workflow(yaml.safe_dump(doc))


def test_every_listed_gpu_type_is_one_answer_for_run_and_compile(tmp_path: Path) -> None:
    """Issue 52 (item 6): ``run --gpu-type l40s`` failed "no known price" while listing ``nvidia-l40s`` as known,
    and ``compile --gpu-type nvidia-l40s`` said "unknown GPU type": the price table knew a type the node table did
    not. Every type either lists, by its full id or its short name, now resolves alike for run (and is priced) and
    for compile (and is placed)."""
    from components.record import cost
    from llmpack.gpu_catalogue import short_names
    from llmpack.ui.options import gpu_type_name

    assert set(cost.known_gpu_types()) == set(known_gpu_types()) == set(GPU_NODES)
    names = {**{t: t for t in known_gpu_types()}, **short_names()}
    assert "l40s" in names and "nvidia-l40s" in names
    for name, full in names.items():
        for typed in (name, name.upper()):
            ran = gpu_type_name(None, None, typed)  # type: ignore[arg-type]
            assert ran == full and resolve_gpu_type(typed) == full, typed
            assert cost.resolve_price(ran) is not None and node_affinity(full) is not None, typed
    result = CliRunner().invoke(main, ["compile", "--gpu-type", "l40s", "--out", str(tmp_path / "l40s")])
    assert result.exit_code == 0, result.output
