"""The recommended ``app.kubernetes.io/*`` labels and the user's ``--label``s on every pod.

Read back from the compiled artifacts of every path, with and without ``--label``: KFP's executors
(steps and the exit handler), Argo's container templates (steps and ``onExit``), the MLflow Job and
its pod template, the TrainJob's node pods (``runtimePatches``, labelled by the launcher at run
time), the prepull DaemonSet. The committed artifacts carry the recommended labels too. A bad
``--label`` is one line and exit 2. The labels reach the record's tags through the closing task's
environment. (The loopback cluster's pods: tests/llmpack/cluster/compare/test_labels_cluster.py.)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from components.finetune_pipeline import build
from components.podspec import (
    COMPONENT_LABEL,
    INSTANCE_LABEL,
    LABELS_ENV,
    MANAGED_BY_LABEL,
    NAME_LABEL,
    PART_OF_LABEL,
    RECOMMENDED,
    VERSION,
    VERSION_LABEL,
    label_tags,
)
from components.trainjob import gang
from llmpack.cli import main
from llmpack.compile.artifacts import compile_all
from llmpack.compile.pod_options import LABEL_NAME, PodOptions, parse_label

ROOT = Path(__file__).resolve().parents[2]
USER = {"team": "ml-platform", "example.com/cost-center": "cc-42", "owner": ""}
FLAGS = ("--label", "team=ml-platform", "--label", "example.com/cost-center=cc-42", "--label", "owner=")
STATIC = (NAME_LABEL, COMPONENT_LABEL, PART_OF_LABEL, MANAGED_BY_LABEL, VERSION_LABEL)


def static_only(where: str) -> tuple[str, ...]:
    """The recommended labels a compiled pod object must carry: all of them, but the run (``instance``) on
    KFP (labels fixed at compile time) and the MLflow Job template (``llmpack submit mlflow`` adds it)."""
    return STATIC if where.startswith(("kfp", "mlflow")) else RECOMMENDED


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One compile with --label, a 2 x 4 GPU TrainJob gang and the prepull DaemonSet: every kind of pod."""
    out = tmp_path_factory.mktemp("labels") / "out"
    pod = PodOptions.from_flags(labels=tuple(f"{k}={v}" for k, v in USER.items()))
    compile_all(out, pod=pod, nodes=2, gpus=4, cache_pvc="llmpack-shared", prepull=True)
    return out


def kfp_pod_labels(path: Path) -> dict[str, dict[str, str]]:
    """Every executor's pod labels, by executor (the steps' and the exit handler's)."""
    spec, platform = yaml.safe_load_all(path.read_text())
    configs = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    return {name: ((configs.get(name) or {}).get("podMetadata") or {}).get("labels") or {}
            for name in spec["deploymentSpec"]["executors"]}


def argo_pod_labels(path: Path) -> dict[str, dict[str, str]]:
    wf = yaml.safe_load(path.read_text())
    assert wf["spec"]["onExit"] in [t["name"] for t in wf["spec"]["templates"] if "container" in t]
    return {t["name"]: (t.get("metadata") or {}).get("labels") or {}
            for t in wf["spec"]["templates"] if "container" in t}


def job_labels(path: Path) -> dict[str, dict[str, str]]:
    job = yaml.safe_load(path.read_text())
    return {"job": job["metadata"]["labels"], "pod": job["spec"]["template"]["metadata"]["labels"]}


def trainjob_labels(path: Path) -> dict[str, dict[str, str]]:
    obj = yaml.safe_load(path.read_text())
    [patch] = obj["spec"]["runtimePatches"]
    [job] = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    return {"trainjob": obj["metadata"]["labels"],
            "node pod": job["template"]["spec"]["template"]["metadata"]["labels"]}


def every_pod(out: Path, *, gang_too: bool = True) -> dict[str, dict[str, str]]:
    """``{where: labels}`` of every pod object the compile wrote."""
    pods = {f"kfp {k}": v for k, v in kfp_pod_labels(out / "kfp_pipelines" / "finetune.yaml").items()}
    pods |= {f"argo {k}": v for k, v in argo_pod_labels(out / "argo_workflows" / "finetune.yaml").items()}
    pods |= {f"mlflow {k}": v for k, v in job_labels(out / "mlflow_projects" / "finetune-k8s" /
                                                      "kubernetes_job_template.yaml").items()}
    if gang_too:
        pods |= {f"gang {k}": v for k, v in trainjob_labels(out / "trainjob" / "finetune-trainjob.yaml").items()}
        ds = yaml.safe_load((out / "prepull" / "llmpack-prepull-daemonset.yaml").read_text())
        pods["prepull"] = ds["spec"]["template"]["metadata"]["labels"]
    return pods


def test_every_pod_on_every_path_carries_the_recommended_labels_and_the_users(compiled: Path) -> None:
    pods = every_pod(compiled)
    tasks = len(build().tasks)
    # kfp, argo: each task + the exit handler; Job + pod; TrainJob + pod; DaemonSet
    assert len(pods) == 2 * (tasks + 1) + 2 + 2 + 1
    for where, labels in pods.items():
        wanted = static_only(where)
        assert set(wanted) <= set(labels), (where, sorted(set(wanted) - set(labels)))
        assert USER.items() <= labels.items(), where
        assert labels[PART_OF_LABEL] == "llmpack" and labels[VERSION_LABEL] == VERSION, where
    # What each path's labels say: the step, the run, who manages the pod.
    argo = argo_pod_labels(compiled / "argo_workflows" / "finetune.yaml")
    assert argo["finetune"][COMPONENT_LABEL] == "finetune" and argo["close-record"][COMPONENT_LABEL] == "close-record"
    assert {v[INSTANCE_LABEL] for v in argo.values()} == {"{{workflow.parameters.pipeline_run}}"}
    assert {v[MANAGED_BY_LABEL] for v in argo.values()} == {"argo"}
    kfp = kfp_pod_labels(compiled / "kfp_pipelines" / "finetune.yaml")
    assert (kfp["exec-evaluate"][COMPONENT_LABEL] == "evaluate"
            and kfp["exec-close-record"][COMPONENT_LABEL] == "close-record")
    # KFP cannot template a label per run (docs/internals/decisions.md)
    assert not any(INSTANCE_LABEL in v for v in kfp.values())
    assert {v[MANAGED_BY_LABEL] for v in kfp.values()} == {"kfp"}
    assert pods["mlflow pod"][MANAGED_BY_LABEL] == "mlflow" and pods["mlflow pod"][COMPONENT_LABEL] == "main"
    assert pods["gang node pod"][INSTANCE_LABEL] == "example-run"  # the launcher's: the run it serves
    assert pods["gang node pod"][MANAGED_BY_LABEL] == "kubeflow-trainer"
    assert pods["prepull"][COMPONENT_LABEL] == "prepull"


def test_the_prepull_selector_is_unchanged_by_labels(compiled: Path) -> None:
    ds = yaml.safe_load((compiled / "prepull" / "llmpack-prepull-daemonset.yaml").read_text())
    selector = ds["spec"]["selector"]["matchLabels"]
    assert selector == {NAME_LABEL: "llmpack-prepull", PART_OF_LABEL: "llmpack"}  # immutable on a DaemonSet
    assert selector.items() <= ds["spec"]["template"]["metadata"]["labels"].items()


def test_the_committed_artifacts_carry_the_recommended_labels_without_user_labels() -> None:
    pods = every_pod(ROOT, gang_too=False)
    pods |= {f"gang {k}": v for k, v in trainjob_labels(ROOT / "examples" / "multinode" / "trainjob" /
                                                        "finetune-trainjob.yaml").items()}
    for where, labels in pods.items():
        assert set(static_only(where)) <= set(labels), where
        assert not set(USER) & set(labels), where


def test_the_closing_task_hands_the_labels_to_the_record(compiled: Path) -> None:
    """Each path's closing process gets LLMPACK_LABELS; the record turns it into llmpack.label.* tags."""
    expected = json.dumps(USER, sort_keys=True, separators=(",", ":"))
    wf = yaml.safe_load((compiled / "argo_workflows" / "finetune.yaml").read_text())
    [close] = [t for t in wf["spec"]["templates"] if t["name"] == wf["spec"]["onExit"]]
    assert {"name": LABELS_ENV, "value": expected} in close["container"]["env"]
    _, platform = yaml.safe_load_all((compiled / "kfp_pipelines" / "finetune.yaml").read_text())
    spec, _ = yaml.safe_load_all((compiled / "kfp_pipelines" / "finetune.yaml").read_text())
    env = spec["deploymentSpec"]["executors"]["exec-close-record"]["container"]["env"]
    assert {"name": LABELS_ENV, "value": expected} in env
    job = yaml.safe_load((compiled / "mlflow_projects" / "finetune-k8s" / "kubernetes_job_template.yaml").read_text())
    assert {"name": LABELS_ENV, "value": expected} in job["spec"]["template"]["spec"]["containers"][0]["env"]
    assert label_tags({LABELS_ENV: expected}) == {f"llmpack.label.{k}": v for k, v in USER.items()}
    assert label_tags({LABELS_ENV: "not json"}) == {} and label_tags({}) == {}


def test_gang_labels_are_the_launchers_at_run_time() -> None:
    spec = gang.GangSpec(image="img:1", gpus_per_node=4, cpu=8, memory="64Gi", claim="c", pipeline="llm-finetune",
                         labels={"team": "ml"})
    labels = gang.gang_labels(spec, run_group="g-1", pipeline_run="run-7", orchestrator="argo", step="finetune")
    assert labels[INSTANCE_LABEL] == "run-7" and labels[NAME_LABEL] == "llm-finetune" and labels["team"] == "ml"
    assert labels["llmpack.io/pipeline-run"] == "run-7" and labels[COMPONENT_LABEL] == "finetune"
    assert gang.GangSpec.from_json(spec.to_json(), "x") == spec  # the labels travel in the compiled spec


@pytest.mark.parametrize(("flag", "needle"), [
    ("team", "expected KEY=VALUE"),
    ("=x", "is not a label key"),
    ("-team=x", "is not a label key"),
    ("a" * 64 + "=x", "is not a label key"),
    ("Bad_Prefix!/team=x", "is not a label key"),
    ("/team=x", "is not a label key"),
    ("team=ml platform", "is not a label value"),
    ("team=" + "v" * 64, "is not a label value"),
    ("team=-ml", "is not a label value"),
    ("app.kubernetes.io/instance=x", "set by llmpack"),
    ("llmpack.io/step=x", "set by llmpack"),
])
def test_a_bad_label_is_one_line_and_exit_2(tmp_path: Path, flag: str, needle: str) -> None:
    with pytest.raises(Exception) as info:
        parse_label(flag)
    assert needle in str(info.value) and "\n" not in str(info.value)
    result = CliRunner().invoke(main, ["compile", "--out", str(tmp_path / "out"), "--label", flag])
    assert result.exit_code == 2, result.output
    assert needle in result.output and "Traceback" not in result.output
    assert not (tmp_path / "out").exists()  # refused before anything is written


def test_a_label_given_twice_differently_is_refused_and_the_same_twice_is_one() -> None:
    with pytest.raises(Exception, match="given twice"):
        PodOptions.from_flags(labels=("team=a", "team=b"))
    assert PodOptions.from_flags(labels=("team=a", "team=a", "x.io/y=")).labels == (("team", "a"), ("x.io/y", ""))


def test_labels_on_submit_and_compare_too() -> None:
    """Declared once with the pod flags: compile, cluster submit and cluster compare take --label."""
    for command in (["compile"], ["cluster", "submit", "argo"], ["cluster", "compare"]):
        result = CliRunner().invoke(main, [*command, "--help"])
        assert "--label KEY=VALUE" in result.output, command


def test_the_version_label_is_the_packs() -> None:
    import tomllib

    import llmpack

    assert VERSION == llmpack.__version__ == tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def test_compiled_pod_labels_are_valid_kubernetes_labels(compiled: Path) -> None:
    for where, labels in every_pod(compiled).items():
        for key, value in labels.items():
            name = key.rpartition("/")[2]
            assert len(name) <= 63 and LABEL_NAME.fullmatch(name), (where, key)
            if not value.startswith("{{"):  # an orchestrator placeholder is resolved at run time
                assert len(value) <= 63 and (value == "" or LABEL_NAME.fullmatch(value)), (where, key, value)


def test_the_record_is_tagged_with_the_labels(tmp_path: Path) -> None:
    """The closing task with the compiled LLMPACK_LABELS: its record's tags (client mode: the summary file)."""
    from components import settings
    from components.record import close

    env = {settings.CLIENT_UPLOADS.name: "1", LABELS_ENV: json.dumps(USER)}
    summary = close.close(values={"pipeline_run": "p1", "run_group": "g", "orchestrator": "argo", "mode": "cluster"},
                          status="Succeeded", uses=[], finished_at=10.0, records_dir=tmp_path, env=env)
    assert {k: v for k, v in summary["tags"].items() if k.startswith("llmpack.label.")} == {
        "llmpack.label.team": "ml-platform", "llmpack.label.example.com/cost-center": "cc-42",
        "llmpack.label.owner": ""}
