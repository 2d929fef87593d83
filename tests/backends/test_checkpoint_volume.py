"""Preemption in the compiled artifacts: finetune's checkpoints on a volume keyed by run, a grace period
that fits, retries.

Compiled with ``--checkpoint-pvc ckpt --checkpoint-minutes 10 --checkpoint-save-s 20`` (one node) and
as a 2 x 4 GPU TrainJob gang whose checkpoints share the ``--cache-pvc`` claim (``--checkpoint-pvc
shared:/ckpt --grace-period 200``), then read back on every path: the finetune pod (and only it) mounts
the claim read-write and is told where (``LLMPACK_CHECKPOINT_ROOT``: the step keys its directory by the
pipeline run, ``tests/components/test_chaos.py``); GPU pods get ``terminationGracePeriodSeconds``
(twice the measured write + 30 s, or the flag) where the path can say it (not KFP: its platform spec
has no field); Argo retries a lost pod beyond the failure budget, the MLflow Job ignores disruptions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from components import settings
from components.podspec import DEFAULT_SAVE_S, PREEMPTION_RETRIES, grace_for
from llmpack.cli import main
from llmpack.compile.artifacts import compile_all
from llmpack.compile.pod_options import CheckpointOptions, PodOptions
from tests.backends.test_pod_security import argo_pods, job_pods, restricted_violations, trainjob_pods
from tests.backends.test_podspec import argo, job, kfp, trainjob
from tests.components.test_trainjob import _schema, schema_errors, trainer_api_errors

ONE = ("--checkpoint-pvc", "ckpt", "--checkpoint-minutes", "10", "--checkpoint-save-s", "20")
GRACE = grace_for(20)  # 70
ROOT = settings.CHECKPOINT_ROOT.name
GPU_STEPS = ("finetune", "evaluate")
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("ckpt")
    one = CliRunner().invoke(main, ["compile", "--out", str(root / "one"), *ONE])
    assert one.exit_code == 0, one.output
    assert one.stderr.splitlines() == [  # the policy compiled, in one line
        "llmpack: note: finetune checkpoints to --checkpoint-pvc ckpt every 10 min (--checkpoint-minutes), every "
        "checkpoint_every steps and on SIGTERM; a retry resumes from the newest"]
    pod = PodOptions.from_flags(
        checkpoints=CheckpointOptions.from_flags(checkpoint_pvc="shared:/ckpt", grace_period=200))
    compile_all(root / "gang", pod=pod, nodes=2, gpus=4, cache_pvc="shared")
    return {"one": root / "one", "gang": root / "gang"}


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container.get("env") or []}


def test_compile_says_in_one_line_when_retries_restart_from_step_0(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """What the command prints around the compile (the artifacts themselves: the other tests)."""
    import llmpack.compile.artifacts

    monkeypatch.setattr(llmpack.compile.artifacts, "compile_all", lambda *args, **kwargs: [])
    plain = CliRunner().invoke(main, ["compile", "--out", str(tmp_path)])
    assert plain.exit_code == 0 and plain.stdout == "", plain.output
    assert plain.stderr.splitlines() == [
        "llmpack: note: no --checkpoint-pvc: finetune's checkpoints stay in its pod, so an orchestrator retry restarts "
        "training from step 0 (docs/preemption.md)"]
    grace_only = CliRunner().invoke(main, ["compile", "--out", str(tmp_path), "--grace-period", "40"])
    assert grace_only.exit_code == 0 and len(grace_only.stderr.splitlines()) == 1  # a grace period alone keeps nothing


def test_no_flag_writes_no_checkpoint_volume_grace_or_preemption_retry() -> None:
    """The committed artifacts are the no-flag compile (tests/backends/test_golden.py checks they still are)."""
    text = "".join(p.read_text() for p in (REPO / "tests" / "fixtures" / "golden").rglob("*") if p.is_file())
    text += "".join((REPO / d / "finetune.yaml").read_text() for d in ("kfp_pipelines", "argo_workflows"))
    text += (REPO / "mlflow_projects" / "finetune-k8s" / "kubernetes_job_template.yaml").read_text()
    for absent in (ROOT, "terminationGracePeriodSeconds", "lastRetry.message", "/checkpoints"):
        assert absent not in text, absent


def test_argo_finetune_mounts_the_claim_read_write_and_retries_lost_pods_apart(compiled: dict[str, Any]) -> None:
    from argo_workflows.local_model import Retry

    templates = {t["name"]: t for t in argo(compiled["one"])["spec"]["templates"] if "container" in t}
    for name, tmpl in templates.items():
        env = env_of(tmpl["container"])
        claims = {v["persistentVolumeClaim"]["claimName"]: v["persistentVolumeClaim"] for v in tmpl.get("volumes") or []
                  if "persistentVolumeClaim" in v}
        if name == "finetune":
            assert env[ROOT] == "/checkpoints" and env[settings.CHECKPOINT_MINUTES.name] == "10"
            assert env[settings.GRACE_PERIOD_S.name] == str(GRACE)
            assert claims["ckpt"] == {"claimName": "ckpt"}  # read-write: no readOnly
            assert {"name": "llmpack-checkpoints", "mountPath": "/checkpoints"} in tmpl["container"]["volumeMounts"]
        else:
            assert ROOT not in env and "ckpt" not in claims, name
        assert ((tmpl.get("podSpecPatch") == f'{{"terminationGracePeriodSeconds": {GRACE}}}')
                == (name in GPU_STEPS)), name
    strategy = templates["finetune"]["retryStrategy"]
    assert strategy["limit"] == str(2 + PREEMPTION_RETRIES)
    assert strategy["expression"].startswith("lastRetry.message matches '") and "pod deleted" in strategy["expression"]
    assert strategy["expression"].endswith("|| (asInt(lastRetry.exitCode) != 2 && asInt(retries) < 2)")
    # The local executor reads it as Argo would with no pod ever lost: failures stop at the step's own 2 retries.
    retry = Retry(strategy, "finetune.retryStrategy")
    assert [retry.should_retry(n, 1) for n in range(4)] == [True, True, False, False]
    assert not retry.should_retry(0, 2)  # bad input: never


def test_kfp_finetune_mounts_the_claim_and_gets_the_variables(compiled: dict[str, Any]) -> None:
    spec, configs = kfp(compiled["one"])
    for name, cfg in configs.items():
        mounts = {m["mountPath"]: m["constant"] for m in cfg.get("pvcMount") or []}
        assert (mounts.get("/checkpoints") == "ckpt") == (name == "exec-finetune"), name
        assert "terminationGracePeriodSeconds" not in str(cfg)  # the KFP platform spec has no such field
    env = {e["name"]: e["value"] for e in spec["deploymentSpec"]["executors"]["exec-finetune"]["container"]["env"]}
    assert env[ROOT] == "/checkpoints"
    # KFP cannot set the pod's grace period: the step must not log one it does not have (the report
    # would say a write "fits" a grace the pod never got)
    assert settings.GRACE_PERIOD_S.name not in env
    evaluate = spec["deploymentSpec"]["executors"]["exec-evaluate"]["container"].get("env") or []
    assert ROOT not in {e["name"] for e in evaluate}


def test_the_mlflow_job_mounts_the_claim_has_the_grace_and_ignores_disruptions(compiled: dict[str, Any]) -> None:
    obj = job(compiled["one"])
    pod = obj["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == GRACE and pod["restartPolicy"] == "Never"
    assert {"name": "llmpack-checkpoints", "persistentVolumeClaim": {"claimName": "ckpt"}} in pod["volumes"]
    assert {"name": "llmpack-checkpoints", "mountPath": "/checkpoints"} in pod["containers"][0]["volumeMounts"]
    assert env_of(pod["containers"][0])[ROOT] == "/checkpoints"
    rules = obj["spec"]["podFailurePolicy"]["rules"]
    assert rules[0] == {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
    header = (compiled["one"] / "mlflow_projects/finetune-k8s/kubernetes_job_template.yaml").read_text()
    assert "'ckpt' (read-write at /checkpoints)" in header


def test_trainjob_node_pods_share_the_cache_claim_for_checkpoints_with_the_grace(compiled: dict[str, Any]) -> None:
    obj = trainjob(compiled["gang"])
    assert schema_errors(obj, _schema()) == []  # the CRD's schema takes the grace period in runtimePatches
    (_, pod), = trainjob_pods(compiled["gang"] / "trainjob" / "finetune-trainjob.yaml")
    assert pod["terminationGracePeriodSeconds"] == 200
    claims = {v["name"]: v["persistentVolumeClaim"] for v in pod["volumes"] if "persistentVolumeClaim" in v}
    assert claims["llmpack-checkpoints"] == {"claimName": "shared"}  # the --cache-pvc claim, read-write
    assert {"name": "llmpack-checkpoints", "mountPath": "/ckpt"} in pod["containers"][0]["volumeMounts"]
    env = {e["name"]: e.get("value") for e in obj["spec"]["trainer"]["env"]}
    assert env[ROOT] == "/ckpt" and env[settings.GRACE_PERIOD_S.name] == "200"
    # The launcher pod carries the same, so a retried launcher's new TrainJob resumes this run too.
    launcher = {t["name"]: t for t in argo(compiled["gang"])["spec"]["templates"]}["finetune"]
    assert env_of(launcher["container"])[ROOT] == "/ckpt"


@pytest.mark.parametrize("variant", ["one", "gang"])
def test_pods_with_the_checkpoint_volume_still_pass_pod_security_restricted(compiled: dict[str, Any],
                                                                            variant: str) -> None:
    base = compiled[variant]
    pods = [*argo_pods(base / "argo_workflows" / "finetune.yaml"),
            *job_pods(base / "mlflow_projects" / "finetune-k8s" / "kubernetes_job_template.yaml")]
    if variant == "gang":
        pods += list(trainjob_pods(base / "trainjob" / "finetune-trainjob.yaml"))
    for where, pod in pods:
        assert restricted_violations(pod) == [], where


@pytest.mark.slow  # Hera's models and the Kubernetes client's: seconds to import
def test_the_artifacts_pass_the_upstream_models(compiled: dict[str, Any]) -> None:
    import kubernetes
    from hera.workflows.models import Workflow as ModelWorkflow

    for variant in ("one", "gang"):
        ModelWorkflow.model_validate(argo(compiled[variant]))
        model = kubernetes.client.ApiClient()._ApiClient__deserialize(job(compiled[variant]), "V1Job")
        assert model.spec.template.spec.termination_grace_period_seconds in (GRACE, 200)
    assert trainer_api_errors(trainjob(compiled["gang"])) == []


def test_the_grace_period_comes_from_the_flag_the_measured_save_or_the_default() -> None:
    assert CheckpointOptions.from_flags().grace_s is None
    assert CheckpointOptions.from_flags(checkpoint_pvc="c").grace_s == grace_for(DEFAULT_SAVE_S) == 150
    assert CheckpointOptions.from_flags(checkpoint_pvc="c", checkpoint_save_s=4.2).grace_s == 39
    assert CheckpointOptions.from_flags(grace_period=15).grace_s == 15  # GKE Spot's 15 s: say so with the flag


@pytest.mark.parametrize(("args", "message"), [
    (("--grace-period", "0"), "--grace-period 0: must be a whole number of seconds, 1 to 86400"),
    (("--grace-period", "999999999"), "--grace-period 999999999: must be a whole number of seconds, 1 to 86400"),
    (("--checkpoint-save-s", "-1"), "--checkpoint-save-s -1.0: must be a number of seconds > 0"),
    (("--checkpoint-save-s", "inf"), "--checkpoint-save-s inf: must be a number of seconds > 0, at most 86400"),
    (("--checkpoint-save-s", "nan"), "--checkpoint-save-s nan: must be a number of seconds > 0"),
    (("--checkpoint-minutes", "0"), "--checkpoint-minutes 0.0: must be a number of minutes > 0"),
    (("--checkpoint-minutes", "inf"), "--checkpoint-minutes inf: must be a number of minutes > 0, at most 1440"),
    (("--grace-period", "20", "--checkpoint-save-s", "5"), "--grace-period with --checkpoint-save-s: give one"),
    (("--checkpoint-pvc", "Ckpt"), "--checkpoint-pvc 'Ckpt': not a PersistentVolumeClaim name"),
    (("--checkpoint-pvc", "ckpt:rel"), "--checkpoint-pvc 'ckpt:rel': the mount path must be an absolute directory"),
    (("--checkpoint-pvc", "ckpt:/models", "--model-pvc", "weights"),
     "--checkpoint-pvc: mount path /models is --model-pvc's too"),
    (("--data-pvc", "d:/models/", "--model-pvc", "weights"), "--data-pvc: mount path /models is --model-pvc's too"),
])
def test_bad_checkpoint_flags_are_one_line_exit_2(tmp_path: Path, args: tuple[str, ...], message: str) -> None:
    result = CliRunner().invoke(main, ["compile", "--out", str(tmp_path / "out"), *args])
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, result.output
    assert message in result.output and "Traceback" not in result.output
    assert not (tmp_path / "out").exists()


def test_compare_takes_the_checkpoint_flags_only_with_cluster(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["compare", "--checkpoint-pvc", "ckpt", "--output-dir", str(tmp_path)])
    assert (result.exit_code == 2
            and "llmpack cluster compare" in result.output), result.output


@pytest.mark.slow  # a whole compile beside the submit: seconds
def test_submit_argo_with_the_checkpoint_volume_sends_it_through_the_stand_in(monkeypatch: pytest.MonkeyPatch) -> None:
    """`llmpack submit argo --checkpoint-pvc ckpt`: the Workflow the Argo Server gets keeps finetune's checkpoints."""
    from standins.argo_server import ArgoServerStandIn

    for name in ("ARGO_SERVER", "ARGO_NAMESPACE", "ARGO_SECURE", "MLFLOW_TRACKING_URI", "LLMPACK_PRICE_PER_GPU_HOUR"):
        monkeypatch.delenv(name, raising=False)
    with ArgoServerStandIn(token="argo-ckpt-token") as argo_server:
        result = CliRunner().invoke(main, ["cluster", "submit", "argo", "--host", argo_server.url,
                                           "--checkpoint-pvc", "ckpt",
                                           "--grace-period", "90", "--json"], env={"ARGO_TOKEN": "argo-ckpt-token"})
        assert result.exit_code == 0, result.output
        (post,) = argo_server.recorded("POST")
    finetune = next(t for t in post.body["workflow"]["spec"]["templates"] if t["name"] == "finetune")
    assert {"name": "llmpack-checkpoints", "mountPath": "/checkpoints"} in finetune["container"]["volumeMounts"]
    assert env_of(finetune["container"])[ROOT] == "/checkpoints"
    assert finetune["podSpecPatch"] == '{"terminationGracePeriodSeconds": 90}'
    assert finetune["retryStrategy"]["limit"] == str(2 + PREEMPTION_RETRIES)


def test_the_real_pods_stand_in_reads_each_paths_finetune_env_from_the_artifact(compiled: dict[str, Any],
                                                                                 tmp_path: Path) -> None:
    """``standins.real_pods`` (the loopback's real preempted pods) runs finetune with this env: the claim's mount
    mapped to the claim's stand-in dir, every path alike; without the claim it refuses (nothing to resume from)."""
    import yaml
    from standins.real_pods import RealFinetune

    spec, _ = kfp(compiled["one"])
    _, platform = yaml.safe_load_all((compiled["one"] / "kfp_pipelines" / "finetune.yaml").read_text())
    real = RealFinetune(tokens=tmp_path / "tokens", workdir=tmp_path)
    artifacts = {"kfp": {"pipeline_spec": {"pipeline_spec": spec, "platform_spec": platform}},
                 "argo": argo(compiled["one"]), "mlflow": job(compiled["one"])}
    envs = {path: real.pod_env(path, obj) for path, obj in artifacts.items()}
    for path, env in envs.items():
        assert env[ROOT] == str(tmp_path / "pvc" / "ckpt"), path
        assert env[settings.CHECKPOINT_MINUTES.name] == "10", path
        # the grace the pod really gets: none compiled on KFP (no field), so none logged there
        assert env.get(settings.GRACE_PERIOD_S.name) == (None if path == "kfp" else str(GRACE)), path
    unmounted = argo(compiled["one"])
    for tmpl in unmounted["spec"]["templates"]:
        tmpl.pop("volumes", None)  # the root names a path on no claim: the retry would find nothing
    with pytest.raises(AssertionError, match="no LLMPACK_CHECKPOINT_ROOT on a claim"):
        real.pod_env("argo", unmounted)
