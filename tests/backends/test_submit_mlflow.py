"""``llmpack submit mlflow``: an MLflow run plus a Kubernetes Job from the compiled MLflow project,
created with the real ``kubernetes`` client against the stand-in Kubernetes API on 127.0.0.1."""

from __future__ import annotations

import copy
import json
import logging
import shlex
import shutil
import socket
import time
from pathlib import Path

import pytest
import yaml
from standins.k8s_api import KubeAPIStandIn

from components.errors import InputError
from components.record import tracking
from llmpack.cluster import submit
from mlflow_projects import submit as mlflow_submit

REPO = Path(__file__).resolve().parents[2]
PROJECT = REPO / "mlflow_projects" / "finetune-k8s"
TEMPLATE = PROJECT / "kubernetes_job_template.yaml"
TOKEN = "k8s-standin-token"
BAD_TOKEN = "wrong-token-Kq55xKube0SECRET"
ENV = ("KUBECONFIG", "KUBE_MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_URI", "KUBERNETES_SERVICE_HOST",
       "KUBERNETES_SERVICE_PORT", "LLMPACK_IMAGE", "LLMPACK_PRICE_PER_GPU_HOUR")


@pytest.fixture(autouse=True)
def isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.kube/config of the user's


@pytest.fixture()
def kube():
    with KubeAPIStandIn(token=TOKEN, namespaces=("default", "llmpack")) as api:
        yield api


def write_kubeconfig(path: Path, server: str, token: str, namespace: str = "llmpack") -> str:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "standin", "cluster": {"server": server}}],
        "users": [{"name": "runner", "user": {"token": token}}],
        "contexts": [{"name": "standin", "context": {"cluster": "standin", "user": "runner", "namespace": namespace}}],
        "current-context": "standin",
    }))
    return str(path)


@pytest.fixture()
def kubeconfig(kube: KubeAPIStandIn, tmp_path: Path) -> str:
    return write_kubeconfig(tmp_path / "kubeconfig", kube.url, TOKEN)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def main_command(params: dict[str, str]) -> list[str]:
    """The ``main`` entry point's command from the committed MLproject, filled in by hand."""
    entry = yaml.safe_load((PROJECT / "MLproject").read_text())["entry_points"]["main"]
    values = {name: str(p.get("default", "")) for name, p in entry["parameters"].items()}
    values.update(params)
    return shlex.split(entry["command"].format(**{k: shlex.quote(v) for k, v in values.items()}))


def test_submit_creates_the_job_from_the_compiled_template(kube: KubeAPIStandIn, kubeconfig: str,
                                                           tracking_uri: str) -> None:
    before = time.time()
    summary = mlflow_submit.submit(mlflow_submit.Request(kubeconfig=kubeconfig, tracking_uri=tracking_uri,
                                   params={"model": "tiny", "data": "builtin", "max_steps": 7, "seed": 3}))
    after = time.time()
    assert before <= summary["submitted_at"] <= after

    (post,) = kube.recorded("POST", "/apis/batch/v1/namespaces/llmpack/jobs")
    job = post.body
    assert job["metadata"]["name"] == summary["job_name"] == summary["pipeline_run"] == summary["server_id"]
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    # GPU, image, command, MLflow run id: what the Job needs to run `main` in the pipeline's MLflow run.
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert container["resources"]["requests"]["nvidia.com/gpu"] == "1"
    assert container["image"] == "ghcr.io/llmpack/llmpack:0.1.0" == summary["image"]
    assert container["workingDir"] == mlflow_submit.PROJECT_DIR_IN_IMAGE
    assert container["name"] == "llm-finetune"
    expected_params = {
        "model": "tiny", "data": "builtin", "max_steps": "7", "seed": "3",
        "submitted_at": repr(summary["submitted_at"]), "run_group": summary["run_group"],
        "pipeline_run": summary["pipeline_run"], "orchestrator": "mlflow", "mode": "cluster",
    }
    assert container["command"] == main_command(expected_params) == summary["command"]
    env = {e["name"]: e for e in container["env"]}
    assert env["MLFLOW_RUN_ID"]["value"] == summary["mlflow_run_id"]
    assert env["MLFLOW_EXPERIMENT_ID"]["value"] == summary["mlflow_experiment_id"]
    assert "value" not in env["MLFLOW_TRACKING_URI"]  # the tracking URI only from the Secret...
    assert summary["warnings"] and "Secret llmpack-mlflow" in summary["warnings"][0]  # ...and a local record is flagged
    labels = {"llmpack.io/run-group": summary["run_group"], "llmpack.io/pipeline-run": summary["pipeline_run"],
              "app.kubernetes.io/instance": summary["pipeline_run"]}
    assert labels.items() <= job["spec"]["template"]["metadata"]["labels"].items()
    assert labels.items() <= job["metadata"]["labels"].items()

    # Everything else is the committed template, as compiled.
    template = yaml.safe_load(TEMPLATE.read_text())
    sent = copy.deepcopy(job)
    # (The stand-in stores the recorded body itself, with the fields the API server sets.)
    sent.pop("status", None)
    for key in ("uid", "resourceVersion", "creationTimestamp"):
        sent["metadata"].pop(key, None)
    for meta in (sent["metadata"], sent["spec"]["template"]["metadata"]):
        for key in labels:
            meta["labels"].pop(key)
    sent["metadata"]["name"] = template["metadata"]["name"]
    c = sent["spec"]["template"]["spec"]["containers"][0]
    tc = template["spec"]["template"]["spec"]["containers"][0]
    for key in ("name", "image", "command"):
        c[key] = tc[key]
    del c["workingDir"]
    c["env"] = c["env"][: len(tc["env"])]
    assert sent == template

    # The MLflow record: the pipeline run, mode=cluster, with the cost tags.
    run = tracking.client(tracking_uri).get_run(summary["mlflow_run_id"])
    tags = run.data.tags
    assert tags["llmpack.mode"] == "cluster" and tags["llmpack.orchestrator"] == "mlflow"
    assert tags["llmpack.pipeline_run"] == summary["pipeline_run"] and tags["llmpack.run_group"] == summary["run_group"]
    assert tags["llmpack.record"] == "pipeline" and tags["mlflow.project.backend"] == "kubernetes"
    assert tags["llmpack.gpu_type"] == "nvidia-h100-80gb" and tags["llmpack.gpu_count"] == "1"
    assert float(tags["llmpack.price_per_gpu_hour"]) > 0 and tags["llmpack.price_source"]
    assert tags["llmpack.cpu_to_gpu_ratio"] == "8"
    assert float(run.data.params["submitted_at"]) == summary["submitted_at"]
    assert run.info.start_time == int(summary["submitted_at"] * 1000)
    assert (tracking.find_pipeline_run(tracking.client(tracking_uri), summary["pipeline_run"])
            == summary["mlflow_run_id"])
    assert all(r.authorized for r in kube.requests)
    assert TOKEN not in repr(summary)


def test_the_tracking_uri_is_never_a_literal_in_the_job(kube: KubeAPIStandIn, kubeconfig: str, tracking_uri: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Unlike MLflow's own backend, which appends KUBE_MLFLOW_TRACKING_URI (or the submitter's URI) as a value."""
    cluster_uri = "http://mlflow.llmpack.svc:5000"
    monkeypatch.setenv("KUBE_MLFLOW_TRACKING_URI", cluster_uri)
    summary = mlflow_submit.submit(mlflow_submit.Request(kubeconfig=kubeconfig, tracking_uri=tracking_uri,
                                                         image="registry.example/llmpack:9"))
    job = kube.jobs[("llmpack", summary["job_name"])]
    container = job["spec"]["template"]["spec"]["containers"][0]
    (uri,) = [e for e in container["env"] if e["name"] == "MLFLOW_TRACKING_URI"]
    assert uri == {"name": "MLFLOW_TRACKING_URI",
                   "valueFrom": {"secretKeyRef": {"name": "llmpack-mlflow", "key": "tracking-uri"}}}
    for e in container["env"]:
        assert "value" not in e or e["name"] not in mlflow_submit.SECRET_ONLY_ENV, e
    assert cluster_uri not in json.dumps(job) and tracking_uri not in json.dumps(job)
    assert summary["job_tracking_uri"] == cluster_uri  # what the user said the Secret holds, reported only
    assert container["image"] == "registry.example/llmpack:9"
    with pytest.raises(ValueError, match="MLFLOW_TRACKING_URI"):
        mlflow_submit.build_mlflow_job(yaml.safe_load(TEMPLATE.read_text()), project_name="p", job_name="j",
                                       namespace="llmpack", image="i", command=["c"], working_dir="/w",
                                       env={"MLFLOW_TRACKING_URI": cluster_uri}, labels={})


def test_job_template_is_the_one_beside_the_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The config's template path is relative to where `mlflow run` is typed; this path reads the project's own."""
    project = tmp_path / "elsewhere" / "finetune-k8s"
    shutil.copytree(PROJECT, project)
    monkeypatch.chdir(tmp_path)  # where mlflow_projects/finetune-k8s/... does not exist
    path, template = mlflow_submit._job_template(project)
    assert path == project / "kubernetes_job_template.yaml" and template["kind"] == "Job"
    container = template["spec"]["template"]["spec"]["containers"][0]
    container["env"] = [e for e in container["env"] if e["name"] != "MLFLOW_TRACKING_URI"]
    with pytest.raises(InputError, match="no MLFLOW_TRACKING_URI from a Secret"):
        mlflow_submit._tracking_secret(path, template)


def test_wait_for_completion_follows_the_job_and_ends_the_mlflow_run(kube: KubeAPIStandIn, kubeconfig: str,
                                                                      tracking_uri: str) -> None:
    summary = mlflow_submit.submit(mlflow_submit.Request(kubeconfig=kubeconfig, tracking_uri=tracking_uri))
    name = summary["job_name"]
    pending = submit.wait_for_completion(summary, kubeconfig=kubeconfig, poll_s=0.01, timeout_s=0.1)
    assert pending["status"] == "timeout" and pending["state"] == "Pending"
    assert pending["waiting_on"] == "no pod was created yet"  # the stand-in makes no pod of a Job
    kube.set_job_status("llmpack", name, {"startTime": "2026-01-01T00:00:00Z", "active": 1})
    running = submit.wait_for_completion(summary, kubeconfig=kubeconfig, poll_s=0.01, timeout_s=0.1)
    assert running["state"] == "Running"
    kube.set_job_status("llmpack", name, {"startTime": "2026-01-01T00:00:00Z", "succeeded": 1, "conditions": [
        {"type": "Complete", "status": "True", "lastTransitionTime": "2026-01-01T00:10:00Z"}]})
    done = submit.wait_for_completion(summary, kubeconfig=kubeconfig, poll_s=0.01, timeout_s=5)
    assert done["status"] == "succeeded" and done["state"] == "Complete"
    assert tracking.client(tracking_uri).get_run(summary["mlflow_run_id"]).info.status == "FINISHED"


def test_wait_reports_a_failed_job(kube: KubeAPIStandIn, kubeconfig: str, tracking_uri: str) -> None:
    summary = mlflow_submit.submit(mlflow_submit.Request(kubeconfig=kubeconfig, tracking_uri=tracking_uri))
    kube.set_job_status("llmpack", summary["job_name"], {
        "startTime": "2026-01-01T00:00:00Z", "failed": 1, "conditions": [
            {"type": "Failed", "status": "True", "reason": "PodFailurePolicy",
             "message": "Container llm-finetune for pod llmpack/x-abc failed with exit code 1 matching FailJob rule"}]})
    result = mlflow_submit.wait_for_job(summary["job_name"], namespace="llmpack", kubeconfig=kubeconfig,
                                               mlflow_run_id=summary["mlflow_run_id"], tracking_uri=tracking_uri,
                                               poll_s=0.01, timeout_s=5)
    assert result["status"] == "failed" and "exit code 1" in result["error"]
    assert tracking.client(tracking_uri).get_run(summary["mlflow_run_id"]).info.status == "FAILED"


def test_bad_token_is_one_line_without_the_token(kube: KubeAPIStandIn, tmp_path: Path, tracking_uri: str,
                                                 capsys: pytest.CaptureFixture[str],
                                                 caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    config = write_kubeconfig(tmp_path / "bad", kube.url, BAD_TOKEN)
    with pytest.raises(InputError) as info:
        mlflow_submit.submit(mlflow_submit.Request(kubeconfig=config, tracking_uri=tracking_uri,
                                                   pipeline_run="mlflow-bad-token-1"))
    message = str(info.value)
    assert "401" in message and "\n" not in message
    out, err = capsys.readouterr()
    for text in (message, out, err, caplog.text):
        assert BAD_TOKEN not in text
    assert kube.jobs == {}
    # A submission that never reached the cluster leaves no active pipeline record behind.
    assert tracking.find_pipeline_run(tracking.client(tracking_uri), "mlflow-bad-token-1") is None


def test_unreachable_api_server(tmp_path: Path, tracking_uri: str) -> None:
    config = write_kubeconfig(tmp_path / "closed", f"http://127.0.0.1:{closed_port()}", BAD_TOKEN)
    start = time.monotonic()
    with pytest.raises(InputError, match="unreachable") as info:
        mlflow_submit.submit(mlflow_submit.Request(kubeconfig=config, tracking_uri=tracking_uri))
    assert time.monotonic() - start < 10
    assert BAD_TOKEN not in str(info.value)


def test_no_cluster_configured(tracking_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-such-kubeconfig"))
    with pytest.raises(InputError, match="no Kubernetes cluster configured"):
        mlflow_submit.submit(mlflow_submit.Request(tracking_uri=tracking_uri))
    with pytest.raises(InputError, match="--kubeconfig .*: no such file"):
        mlflow_submit.submit(mlflow_submit.Request(kubeconfig=str(tmp_path / "missing"), tracking_uri=tracking_uri))


def test_namespace_not_found(kube: KubeAPIStandIn, kubeconfig: str, tracking_uri: str) -> None:
    with pytest.raises(InputError, match="namespace 'team-z' not found"):
        mlflow_submit.submit(mlflow_submit.Request(kubeconfig=kubeconfig, tracking_uri=tracking_uri,
                                                   namespace="team-z"))
    assert kube.jobs == {}


def test_forbidden(tmp_path: Path, tracking_uri: str) -> None:
    with KubeAPIStandIn(token=TOKEN, forbidden=("jobs",)) as api:
        config = write_kubeconfig(tmp_path / "kc", api.url, TOKEN)
        with pytest.raises(InputError, match="403 Forbidden.*cannot create"):
            mlflow_submit.submit(mlflow_submit.Request(kubeconfig=config, tracking_uri=tracking_uri))


def test_bad_parameters_fail_before_any_request(kube: KubeAPIStandIn, kubeconfig: str, tracking_uri: str) -> None:
    with pytest.raises(InputError, match="unknown pipeline parameter"):
        mlflow_submit.submit(mlflow_submit.Request(kubeconfig=kubeconfig, tracking_uri=tracking_uri,
                                                   params={"steps": 3}))
    with pytest.raises(InputError, match="--run-group"):
        mlflow_submit.submit(mlflow_submit.Request(kubeconfig=kubeconfig, tracking_uri=tracking_uri,
                                                   run_group="Run Group!"))
    assert kube.requests == []


def test_cli_submit_wait_without_namespace_waits_in_the_compiled_one(kube: KubeAPIStandIn, kubeconfig: str,
                                                                   tracking_uri: str) -> None:
    """issue 52 item 5: `llmpack cluster submit mlflow --wait` with no --namespace waits on the Job where it was
    created (the compiled template's namespace), not namespace None; a run still going at --timeout is named
    with the command that removes it."""
    from click.testing import CliRunner

    from llmpack.cli import main

    result = CliRunner().invoke(main, ["cluster", "submit", "mlflow", "--kubeconfig", kubeconfig, "--tracking-uri",
                                       tracking_uri, "--wait", "--timeout", "0.2"])
    ((namespace, name),) = kube.jobs
    assert result.exit_code == 1 and namespace == "llmpack", result.output
    assert "ApiValueError" not in result.output and "Missing the required parameter" not in result.output
    assert f"kubectl delete job {name} -n llmpack" in result.stderr and "keeps running" in result.stderr
    assert "mlflow: timeout" in result.stdout


def test_cli_submit_a_failure_after_the_job_exists_names_it_and_how_to_remove_it(
        kube: KubeAPIStandIn, kubeconfig: str, tracking_uri: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from components.backend import SubmittedRun
    from llmpack.cli import main

    def broken(self: SubmittedRun, timeout_s: float, **kwargs: object) -> dict:
        raise InputError("Kubernetes API at https://x: 503 Service Unavailable")

    monkeypatch.setattr(SubmittedRun, "wait", broken)
    result = CliRunner().invoke(main, ["cluster", "submit", "mlflow", "--kubeconfig", kubeconfig, "--tracking-uri",
                                       tracking_uri, "--wait"])
    ((_, name),) = kube.jobs
    line = result.stderr.splitlines()[-1]  # after the submission's own warnings
    assert result.exit_code == 1, result.stderr
    assert line.startswith("llmpack: error: mlflow: Kubernetes API at https://x: 503 Service Unavailable; ")
    assert f"was created on the cluster (server id {name}, namespace llmpack)" in line
    assert line.endswith(f"remove it with: kubectl delete job {name} -n llmpack")


def test_a_project_of_ones_own_with_the_default_image_is_refused_in_one_line(
        kube: KubeAPIStandIn, kubeconfig: str, tracking_uri: str, tmp_path: Path) -> None:
    """Issue 52 (leftover 4): a project of one's own compiled without --image kept llmpack's default image, and
    `cluster submit mlflow --project` only warned that the Job runs the project the image holds: the shipped
    pipeline, never the user's. Refused now (exit 2, no Job, one line); with an image of one's own, one warning
    line while the Job's project directory is the shipped one's, none once --project-dir-in-image names it."""
    import json

    from click.testing import CliRunner

    from llmpack.cli import main

    shipped_elsewhere = tmp_path / "shipped" / "finetune-k8s"  # the shipped pipeline compiled elsewhere (compare
    shutil.copytree(PROJECT, shipped_elsewhere)  # --cluster, --gpu-type): the default image holds it
    res = CliRunner().invoke(main, ["cluster", "submit", "mlflow", "--project", str(shipped_elsewhere),
                                    "--kubeconfig", kubeconfig, "--tracking-uri", tracking_uri])
    assert res.exit_code == 0 and len(kube.jobs) == 1 and "default" not in res.stderr, res.output
    kube.jobs.clear()
    own = tmp_path / "mine" / "finetune-k8s"
    shutil.copytree(PROJECT, own)  # docker_env.image: the default, as `llmpack compile --pipeline` leaves it
    described = json.loads((own / "pipeline.json").read_text())
    (own / "pipeline.json").write_text(json.dumps({**described, "pipeline": "my-own-pipeline"}))
    base = ["cluster", "submit", "mlflow", "--project", str(own), "--kubeconfig", kubeconfig,
            "--tracking-uri", tracking_uri]
    refused = CliRunner().invoke(main, base)
    assert refused.exit_code == 2 and not kube.jobs, refused.output
    (line,) = refused.stderr.splitlines()
    assert "image ghcr.io/llmpack/llmpack:0.1.0 is llmpack's default, which does not hold your pipeline" in line
    assert "pass --image and --project-dir-in-image" in line and "mlflow run on this machine needs no image" in line
    warned = CliRunner().invoke(main, [*base, "--image", "registry.example/mine:1"])
    assert warned.exit_code == 0 and len(kube.jobs) == 1, warned.output
    (line,) = [x for x in warned.stderr.splitlines() if "--project-dir-in-image" in x]
    assert "the Job runs the project that image registry.example/mine:1 holds at /opt/llmpack/" in line
    quiet = CliRunner().invoke(main, [*base, "--image", "registry.example/mine:1", "--project-dir-in-image", "/opt/m"])
    assert quiet.exit_code == 0 and "--project-dir-in-image" not in quiet.stderr, quiet.output


@pytest.mark.slow  # a compile of its own pipeline
def test_cli_submit_a_project_of_ones_own_pipeline(kube: KubeAPIStandIn, kubeconfig: str, tracking_uri: str,
                                                    tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fifth newcomer trial: `cluster submit mlflow --project DIR` was `No such option` though docs/cli.md
    names it, so one's own pipeline could not reach `make cluster-up`. Its values are checked against the
    project's own main entry point, not the shipped pipeline's."""
    import sys

    from click.testing import CliRunner

    from llmpack.cli import main
    from llmpack.compile.artifacts import compile_all

    (tmp_path / "own_mlflow_52.py").write_text(
        "import json\nfrom pathlib import Path\n"
        "from components import Dataset, Input, Metrics, Output, pipeline, step\n"
        "from components.steps.prepare_data import prepare_data\n\n\n"
        "@step()\ndef count_rows(dataset: Input[Dataset], counts: Output[Metrics], top: int = 2) -> None:\n"
        "    rows = (Path(dataset.path) / 'train.jsonl').read_text().splitlines()[:top]\n"
        "    (Path(counts.path) / 'counts.json').write_text(json.dumps({'rows': len(rows)}))\n\n\n"
        "@pipeline(name='own-stats')\ndef own_stats(seed: int = 4, top: int = 2) -> None:\n"
        "    count_rows(dataset=prepare_data(seed=seed).outputs['dataset'], top=top)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "own_mlflow_52", raising=False)
    from own_mlflow_52 import own_stats  # type: ignore[import-not-found]

    compile_all(tmp_path / "out", own_stats())
    project = tmp_path / "out" / "mlflow_projects" / "finetune-k8s"
    base = ["cluster", "submit", "mlflow", "--project", str(project), "--project-dir-in-image", "/opt/own",
            "--image", "registry.example/own:1", "--kubeconfig", kubeconfig, "--tracking-uri", tracking_uri]
    bad = CliRunner().invoke(main, [*base, "--param", "max_steps=3"])
    assert bad.exit_code == 2 and "max_steps" in bad.output and not kube.jobs, bad.output
    result = CliRunner().invoke(main, [*base, "--param", "top=5"])
    assert result.exit_code == 0, result.output
    (post,) = kube.recorded("POST", "/apis/batch/v1/namespaces/llmpack/jobs")
    (container,) = post.body["spec"]["template"]["spec"]["containers"]
    assert container["workingDir"] == "/opt/own"
    command = " ".join(container.get("command", []) + container.get("args", []))
    assert "top=5" in command or "--top 5" in command or "'5'" in command or " 5" in command, command


def test_an_own_projects_unknown_parameter_lists_only_the_pipelines_own(kube: KubeAPIStandIn, kubeconfig: str,
                                                                       tracking_uri: str, tmp_path: Path) -> None:
    """Trial 11: `--param min_len=3` on a project of one's own listed the project's internal artifacts_dir among the
    known parameters."""
    import json

    from click.testing import CliRunner

    from llmpack.cli import main

    own = tmp_path / "mine" / "finetune-k8s"
    shutil.copytree(PROJECT, own)
    described = json.loads((own / "pipeline.json").read_text())
    (own / "pipeline.json").write_text(json.dumps({**described, "pipeline": "my-own-pipeline"}))
    res = CliRunner().invoke(main, ["cluster", "submit", "mlflow", "--project", str(own), "--kubeconfig", kubeconfig,
                                    "--tracking-uri", tracking_uri, "--image", "registry.example/mine:1",
                                    "--param", "min_len=3"])
    assert res.exit_code == 2 and "min_len" in res.output and "known:" in res.output, res.output
    assert "artifacts_dir" not in res.output and "base_dir" not in res.output and not kube.jobs
