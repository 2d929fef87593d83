"""The MLflow Projects backend: golden projects, MLflow's own loader, the Kubernetes Job, local runs.

Fast tests compile and check the projects and run toy pipelines of stdlib-only steps through
``mlflow run``; the ``slow`` ones run the real pipeline on the tiny model.
"""

from __future__ import annotations

import importlib
import json
import os
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from components.commands import format_value, pipeline_values, step_args
from components.dsl import Pipeline, pipeline
from components.errors import PipelineValidationError, RunFailed
from components.finetune_pipeline import build
from components.gpu_nodes import node_affinity
from mlflow_projects import compiler, driver
from mlflow_projects.compiler import entry_point_name, render_k8s_project, render_local_project, write_project
from mlflow_projects.local import run_local

REPO = Path(__file__).resolve().parents[2]
MLFLOW_DIR = REPO / "mlflow_projects"
LOCAL = MLFLOW_DIR / compiler.LOCAL_DIR
K8S = MLFLOW_DIR / compiler.K8S_DIR
MLFLOW_CLI = Path(sys.executable).with_name("mlflow")


def _files(directory: Path) -> dict[str, str]:
    return {p.name: p.read_text(encoding="utf-8") for p in sorted(directory.iterdir()) if p.is_file()}


# --------------------------------------------------------------------------- golden files


def test_main_py_is_a_shim_that_imports_the_driver():
    for project in (LOCAL, K8S):
        text = (project / "main.py").read_text()
        assert text == compiler.MAIN_SHIM
        assert "from mlflow_projects.driver import main" in text and len(text.splitlines()) <= 12


def test_write_project_writes_both_directories(tmp_path: Path):
    out = write_project(build(), tmp_path)
    assert out == {"local": tmp_path / "finetune", "kubernetes": tmp_path / "finetune-k8s"}
    assert _files(out["local"]) == _files(LOCAL)
    (out["local"] / "kubernetes_config.json").write_text("{}")  # a file it wrote before, now stale
    write_project(build(), tmp_path)
    assert not (out["local"] / "kubernetes_config.json").exists()


# --------------------------------------------------------------------------- MLflow's loader


def _load(directory: Path):
    from mlflow.projects import _project_spec

    return _project_spec.load_project(str(directory))


@pytest.mark.parametrize("directory", [LOCAL, K8S], ids=["local", "k8s"])
def test_mlflow_loads_the_project(directory: Path):
    from mlflow.projects import env_type

    pipe = build()
    project = _load(directory)
    assert project.name == pipe.name
    names = {"main", *(entry_point_name(t) for t in pipe.tasks.values())}
    assert set(project._entry_points) == names
    if directory == K8S:
        assert project.env_type == env_type.DOCKER
        assert project.docker_env["image"] == "ghcr.io/llmpack/llmpack:0.1.0"
    else:
        assert project.env_type == env_type.PYTHON
        assert Path(project.env_config_path).name == "python_env.yaml"
        env = yaml.safe_load((directory / "python_env.yaml").read_text())
        assert env["dependencies"] == ["llmpack @ file://${LLMPACK_SOURCE}"]


def test_python_env_never_takes_llmpack_from_a_package_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """No bare ``llmpack`` (a name on PyPI that is not ours): pip reads the pin as this checkout's file URL."""
    from packaging.requirements import Requirement
    from pip._internal.network.session import PipSession
    from pip._internal.req.req_file import parse_requirements

    deps = yaml.safe_load((LOCAL / "python_env.yaml").read_text())["dependencies"]
    for dep in deps:
        assert Requirement(dep.replace("${LLMPACK_SOURCE}", "/x")).url, f"{dep!r} would be looked up on an index"
    # As MLflow's virtualenv manager hands them to pip: a requirements file in a temporary directory.
    req_file = tmp_path / "requirements.txt"
    req_file.write_text("\n".join(deps))
    monkeypatch.setenv("LLMPACK_SOURCE", str(REPO))
    (parsed,) = parse_requirements(str(req_file), session=PipSession())
    assert parsed.requirement == f"llmpack @ file://{REPO}"


@pytest.mark.parametrize("directory", [LOCAL, K8S], ids=["local", "k8s"])
def test_step_entry_points_run_the_shared_step_command(directory: Path, tmp_path: Path):
    """MLflow's own command substitution gives exactly ``python`` + components.commands.step_args."""
    pipe = build()
    project = _load(directory)
    values = pipeline_values(pipe, {"max_steps": 7, "lr": 0.01, "run_group": "g", "pipeline_run": "p"})
    values["orchestrator"] = "mlflow"
    values["mode"] = "cluster" if directory == K8S else "local"
    from components.commands import task_params
    from components.dsl import OutputRef

    for task in pipe.task_order():
        inputs = {k: str(tmp_path / v.task / v.output) for k, v in task.arguments.items() if isinstance(v, OutputRef)}
        for path in inputs.values():
            Path(path).mkdir(parents=True, exist_ok=True)
        outputs = {k: str(tmp_path / task.name / k) for k in task.step.outputs}
        params = {**{f"in_{k}": v for k, v in inputs.items()}, **{f"out_{k}": v for k, v in outputs.items()}}
        params.update({k: format_value(v) for k, v in task_params(task, values).items()})
        command = project.get_entry_point(entry_point_name(task)).compute_command(params, str(tmp_path / "storage"))
        expected = step_args(task, inputs=inputs, outputs=outputs, params=task_params(task, values))
        assert shlex.split(command) == ["python", *expected]  # MLflow shell-quotes values ('' for empty)


def test_main_entry_point_takes_every_pipeline_parameter():
    pipe = build()
    main = _load(LOCAL).get_entry_point("main")
    assert set(main.parameters) == {*pipe.all_params, "artifacts_dir", "base_dir"}
    assert main.parameters["orchestrator"].default == "mlflow"
    assert main.parameters["mode"].default == "local"
    assert main.parameters["max_steps"].default == 120
    assert main.parameters["base_dir"].type == "path"
    k8s_main = _load(K8S).get_entry_point("main")
    assert set(k8s_main.parameters) == {*pipe.all_params, "artifacts_dir"}
    assert k8s_main.parameters["mode"].default == "cluster"
    assert k8s_main.parameters["artifacts_dir"].default.startswith(compiler.ARTIFACTS_MOUNT)


def test_pipeline_json_lists_tasks_in_dag_order_with_their_wiring():
    pipe = build()
    spec = json.loads((LOCAL / "pipeline.json").read_text())
    assert [t["name"] for t in spec["tasks"]] == [t.name for t in pipe.task_order()]
    by_name = {t["name"]: t for t in spec["tasks"]}
    assert by_name["evaluate"]["inputs"] == {"in_tokens": {"task": "tokenize", "output": "tokens"},
                                             "in_model": {"task": "finetune", "output": "model"}}
    assert by_name["finetune"]["params"]["base_model"] == {"param": "model"}
    assert by_name["finetune"]["retry"]["limit"] == 2
    assert spec["runner"] == "projects"
    assert json.loads((K8S / "pipeline.json").read_text())["runner"] == "in_container"


# --------------------------------------------------------------------------- Kubernetes


def _job() -> dict:
    return yaml.safe_load((K8S / "kubernetes_job_template.yaml").read_text())


def test_job_template_asks_for_the_gpu_of_the_step_spec():
    pipe = build()
    spec = pipe.tasks["finetune"].step.execution
    job = _job()
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    for kind in ("limits", "requests"):
        assert container["resources"][kind]["nvidia.com/gpu"] == str(spec.resources.gpus)
        assert container["resources"][kind]["memory"] == spec.resources.memory
        assert container["resources"][kind]["cpu"] == "8"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert "nodeSelector" not in pod  # the step's GPU type's nodes, by a required node affinity
    assert pod["affinity"] == {"nodeAffinity": node_affinity(spec.resources.gpu_type)}
    labels = job["spec"]["template"]["metadata"]["labels"]
    assert labels["llmpack.io/orchestrator"] == "mlflow"
    assert labels["llmpack.io/gpu-type"] == spec.resources.gpu_type
    assert labels["llmpack.io/gpu-count"] == "1"
    assert job["spec"]["backoffLimit"] == spec.retry.limit
    assert job["spec"]["activeDeadlineSeconds"] == sum(t.step.execution.timeout_s for t in pipe.tasks.values())


def test_job_template_is_non_root_and_takes_secrets_by_reference():
    job = _job()
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 1000
    sc = container["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert sc["privileged"] is False
    env = {e["name"]: e for e in container["env"]}
    assert env["MLFLOW_TRACKING_URI"]["valueFrom"]["secretKeyRef"] == {"name": "llmpack-mlflow", "key": "tracking-uri"}
    for e in container["env"]:
        if "PASSWORD" in e["name"] or "TOKEN" in e["name"]:
            assert "value" not in e and "secretKeyRef" in e["valueFrom"]


def test_mlflow_fills_the_job_template_into_a_valid_job():
    """MLflow's own substitution, then the Kubernetes client's V1Job model."""
    import kubernetes
    from mlflow.projects import _parse_kubernetes_config
    from mlflow.projects.kubernetes import _get_kubernetes_job_definition

    config = json.loads((K8S / "kubernetes_config.json").read_text())
    assert config["repository-uri"] and "kube-context" in config
    cwd = os.getcwd()
    # The template path is relative to where `mlflow run` is typed: the repository root, as documented.
    assert config["kube-job-template-path"] == "mlflow_projects/finetune-k8s/kubernetes_job_template.yaml"
    os.chdir(REPO)
    try:
        parsed = _parse_kubernetes_config(config)
    finally:
        os.chdir(cwd)
    job = _get_kubernetes_job_definition(
        project_name=_load(K8S).name,
        image_tag="registry.example.com/llmpack-mlflow-project:abc",
        image_digest="sha256:" + "0" * 64,
        command=["python", "main.py", "--artifacts-dir=/mnt/llmpack/artifacts"],
        env_vars={"MLFLOW_RUN_ID": "r1", "MLFLOW_EXPERIMENT_ID": "1", "MLFLOW_TRACKING_URI": "http://mlflow:5000"},
        job_template=parsed["kube-job-template"],
    )
    assert job["metadata"]["name"].startswith("llm-finetune-")
    api = kubernetes.client.ApiClient()
    model = api._ApiClient__deserialize(job, "V1Job")
    container = model.spec.template.spec.containers[0]
    assert container.name == "llm-finetune"
    assert container.image.endswith("@sha256:" + "0" * 64)
    assert [e.name for e in container.env][-3:] == ["MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_ID", "MLFLOW_TRACKING_URI"]
    assert container.resources.limits["nvidia.com/gpu"] == "1"
    assert model.spec.template.spec.security_context.run_as_non_root is True
    assert model.spec.pod_failure_policy.rules[0].action == "Ignore"


def test_mlflow_kubernetes_backend_submits_the_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """``mlflow run finetune-k8s --backend kubernetes`` against a loopback Kubernetes API stand-in.

    MLflow's real backend code runs; only the docker build and push (no daemon here) are stubbed.
    """
    import mlflow
    import mlflow.projects.docker as mlflow_docker
    import mlflow.projects.kubernetes as mlflow_k8s
    from mlflow.tracking import MlflowClient

    standins = pytest.importorskip("standins.k8s_api")
    token = "mlflow-k8s-token"
    built: dict = {}

    class Image:
        tags = ["registry.example.com/llmpack-mlflow-project:5f1e2d3"]

    def fake_build(**kwargs):
        built.update(kwargs)
        return Image()

    monkeypatch.setattr(mlflow_docker, "validate_docker_installation", lambda: None)
    monkeypatch.setattr(mlflow_docker, "build_docker_image", fake_build)
    monkeypatch.setattr(mlflow_k8s, "push_image_to_registry", lambda tag: "sha256:" + "a" * 64)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("KUBE_MLFLOW_TRACKING_URI", "http://mlflow.mlflow:5000")
    with standins.KubeAPIStandIn(token=token, namespaces=("llmpack",)) as api:
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "standin",
            "clusters": [{"name": "standin", "cluster": {"server": api.url}}],
            "users": [{"name": "u", "user": {"token": token}}],
            "contexts": [{"name": "standin", "context": {"cluster": "standin", "user": "u"}}],
        }))
        import kubernetes.client
        import kubernetes.config.kube_config

        # MLflow loads the kubeconfig into the client's process-wide default: restore it afterwards.
        monkeypatch.setattr(kubernetes.client.Configuration, "_default", kubernetes.client.Configuration._default)
        # read once, when kubernetes is imported: point it at the stand-in for this test
        monkeypatch.setattr(kubernetes.config.kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(kubeconfig))
        config = json.loads((K8S / "kubernetes_config.json").read_text())
        # As docs/native-tools.md types it, from the repository root: the config file and its template path
        # as committed.
        monkeypatch.chdir(REPO)
        mlflow.set_tracking_uri(uri)
        try:
            submitted = mlflow.projects.run("mlflow_projects/finetune-k8s", entry_point="main", backend="kubernetes",
                                            backend_config="mlflow_projects/finetune-k8s/kubernetes_config.json",
                                            parameters={"max_steps": "200", "pipeline_run": "k8s-1"},
                                            synchronous=False)
        finally:
            mlflow.set_tracking_uri(None)
        ((ns, name), job) = next(iter(api.jobs.items()))
        assert ns == "llmpack" and name.startswith("llm-finetune-")
        api.set_job_status(ns, name, {"startTime": "2026-11-30T03:00:00Z", "succeeded": 1,
                                      "conditions": [{"type": "Complete", "status": "True"}]})
        assert submitted.wait()

    assert (built["base_image"] == "ghcr.io/llmpack/llmpack:0.1.0"
            and built["repository_uri"] == config["repository-uri"])
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["image"] == Image.tags[0] + "@sha256:" + "a" * 64
    assert container["command"][:3] == ["python", "main.py", "--artifacts-dir=/mnt/llmpack/artifacts"]
    assert "--param=max_steps=200" in container["command"] and "--param=mode=cluster" in container["command"]
    env = [(e["name"], e.get("value")) for e in container["env"]]
    uris = [i for i, (n, _v) in enumerate(env) if n == "MLFLOW_TRACKING_URI"]
    assert len(uris) == 2 and env[uris[0]][1] is None  # the Secret's, then MLflow's (the last one wins)
    # MLflow's own backend writes the URI into the Job as a literal (documented in mlflow_projects/README.md).
    assert env[uris[1]] == ("MLFLOW_TRACKING_URI", "http://mlflow.mlflow:5000")
    assert ("MLFLOW_RUN_ID", submitted.run_id) in env
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    run = MlflowClient(uri).get_run(submitted.run_id)
    assert run.data.tags["mlflow.project.backend"] == "kubernetes"
    assert "llmpack.record" not in run.data.tags


def test_job_template_accepts_per_run_labels():
    job = compiler.kubernetes_job_template(build(), extra_labels={"llmpack.io/pipeline-run": "mlflow-abc"})
    assert job["spec"]["template"]["metadata"]["labels"]["llmpack.io/pipeline-run"] == "mlflow-abc"


def test_image_is_a_parameter(monkeypatch: pytest.MonkeyPatch):
    files = render_k8s_project(build(), image="registry.example.com:5000/team/llmpack:1.2")
    assert yaml.safe_load(files["MLproject"])["docker_env"]["image"] == "registry.example.com:5000/team/llmpack:1.2"
    assert (json.loads(files["kubernetes_config.json"])["repository-uri"]
            == "registry.example.com:5000/team/llmpack-mlflow-project")
    monkeypatch.setenv(compiler.IMAGE_ENV, "example.org/llmpack:dev")
    assert yaml.safe_load(render_k8s_project(build())["MLproject"])["docker_env"]["image"] == "example.org/llmpack:dev"


def test_dockerfile_builds_a_non_root_cuda_step_image():
    text = (REPO / "Dockerfile").read_text()
    assert "ARG BASE_IMAGE=pytorch/pytorch:" in text and "-cuda" in text and "FROM ${BASE_IMAGE}" in text
    assert "pip install ." in text
    assert "USER ${LLMPACK_UID}" in text and "ARG LLMPACK_UID=1000" in text
    assert "ghcr.io/llmpack/llmpack:0.1.0" in text  # the documented default image name
    assert "WORKDIR /opt/llmpack" in text and "COPY mlflow_projects/ mlflow_projects/" in text  # for submit


# --------------------------------------------------------------------------- toy pipelines

TOY_STEPS = '''
from pathlib import Path

from components.dsl import Dataset, Execution, Input, Metrics, Output, Retry, step
from components.errors import InputError, StepFailed


@step(name="toy-report")
def toy_report(metrics: Input[Metrics], report: Output[Metrics], note: str = "hello") -> None:
    """Write a report beside the evaluation."""
    (Path(report.path) / "report.txt").write_text(note)


@step(name="toy-make")
def toy_make(out: Output[Dataset], text: str = "hello") -> None:
    """Write the text."""
    (Path(out.path) / "data.txt").write_text(text)


@step(name="toy-flaky", execution=Execution(retry=Retry(limit=2, backoff_s=0)))
def toy_flaky(data: Input[Dataset], out: Output[Dataset], fail_times: int = 0, bad_input: bool = False,
              gate: float = 0.0) -> None:
    """Upper-case the text; crash ``fail_times`` times first, or fail on purpose."""
    if bad_input:
        raise InputError("toy: the input is bad")
    counter = Path(out.path) / "attempts"
    n = int(counter.read_text()) if counter.exists() else 0
    counter.write_text(str(n + 1))
    if gate > 0:
        raise StepFailed(f"toy: gate {gate} not met")
    if n < fail_times:
        raise RuntimeError(f"toy: planned failure {n + 1}")
    (Path(out.path) / "data.txt").write_text((Path(data.path) / "data.txt").read_text().upper())
'''


@pytest.fixture(scope="module")
def toy_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("mlflow-toy")
    (root / "llmpack_mlflow_toy_steps.py").write_text(textwrap.dedent(TOY_STEPS), encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def toy_mod(toy_dir: Path):
    sys.path.insert(0, str(toy_dir))
    try:
        return importlib.import_module("llmpack_mlflow_toy_steps")
    finally:
        sys.path.remove(str(toy_dir))


@pytest.fixture(scope="module")
def toy_pipe(toy_mod) -> Pipeline:
    @pipeline(name="toy")
    def toy(text: str = "hello", fail_times: int = 0, bad_input: bool = False, gate: float = 0.0):
        made = toy_mod.toy_make(text=text)
        toy_mod.toy_flaky(data=made.outputs["out"], fail_times=fail_times, bad_input=bad_input, gate=gate)

    return toy()


@pytest.fixture()
def toy_env(toy_dir: Path, fresh_tracking_uri: str) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(toy_dir), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "LLMPACK_MLFLOW_LOGGING": "0", "MLFLOW_TRACKING_URI": fresh_tracking_uri}


def test_an_added_step_appears_as_an_entry_point(toy_mod):
    from components.steps.evaluate import evaluate
    from components.steps.finetune import finetune
    from components.steps.prepare_data import prepare_data
    from components.steps.register import register
    from components.steps.tokenize import tokenize

    @pipeline(name="llm-finetune-plus")
    def plus(model: str = "tiny", max_steps: int = 60, note: str = "hi"):
        prepared = prepare_data()
        tokens = tokenize(dataset=prepared.outputs["dataset"], model=model)
        tuned = finetune(tokens=tokens.outputs["tokens"], base_model=model, max_steps=max_steps)
        scored = evaluate(tokens=tokens.outputs["tokens"], model=tuned.outputs["model"])
        register(model=tuned.outputs["model"], metrics=scored.outputs["metrics"])
        toy_mod.toy_report(metrics=scored.outputs["metrics"], note=note)

    pipe = plus()
    for files in (render_local_project(pipe), render_k8s_project(pipe)):
        project = yaml.safe_load(files["MLproject"])
        ep = project["entry_points"]["toy_report"]
        assert set(ep["parameters"]) >= {"in_metrics", "out_report", "note"}
        assert ep["command"].startswith("python -m components.run llmpack_mlflow_toy_steps:toy_report ")
        assert "--param=note={note}" in ep["command"]
        assert "note" in project["entry_points"]["main"]["parameters"]
        spec = json.loads(files["pipeline.json"])
        assert spec["tasks"][-1]["name"] == "toy-report"
        assert spec["tasks"][-1]["inputs"] == {"in_metrics": {"task": "evaluate", "output": "metrics"}}


def test_a_task_named_main_is_refused(toy_mod):
    @pipeline(name="clash")
    def clash():
        toy_mod.toy_make()

    pipe = clash()
    task = pipe.tasks.pop("toy-make")
    task.name = "main"
    pipe.tasks["main"] = task
    with pytest.raises(PipelineValidationError, match="'main' is taken"):
        render_local_project(pipe)


def test_toy_run_through_mlflow_run(toy_pipe: Pipeline, toy_env: dict[str, str], tmp_path: Path):
    from mlflow.tracking import MlflowClient

    text = "a b'c $HOME"  # through three shells' worth of quoting
    values = pipeline_values(toy_pipe, {"text": text, "fail_times": 1, "pipeline_run": "toy-1",
                                        "orchestrator": "mlflow"})
    out = run_local(toy_pipe, values, tmp_path / "work", toy_env)
    assert set(out) == {"toy-make.out", "toy-flaky.out"}
    assert (out["toy-flaky.out"] / "data.txt").read_text() == text.upper()
    assert (out["toy-flaky.out"] / "attempts").read_text() == "2"  # one crash, retried
    assert (tmp_path / "work" / "project" / "MLproject").exists()
    log = (tmp_path / "work" / "logs" / "mlflow.log").read_text()
    assert log.startswith(f"$ {MLFLOW_CLI} run {tmp_path / 'work' / 'project'} -e main --env-manager local ")
    assert f"-P text={text}" in log and "toy: planned failure 1" in log

    mc = MlflowClient(toy_env["MLFLOW_TRACKING_URI"])
    runs = mc.search_runs([e.experiment_id for e in mc.search_experiments()])
    (parent,) = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(runs) == 1 + len(children)
    assert sorted((r.data.tags["llmpack.step"], r.info.status) for r in children) == [
        ("toy-flaky", "FAILED"), ("toy-flaky", "FINISHED"), ("toy-make", "FINISHED")]
    assert parent.info.status == "FINISHED"
    # The run `mlflow run` created for main is the pipeline's record; its steps are child runs.
    assert [r.info.run_id for r in runs if r.data.tags.get("llmpack.record") == "pipeline"] == [parent.info.run_id]
    for r in runs:
        assert r.data.tags["llmpack.pipeline_run"] == "toy-1"
        assert r.data.tags["llmpack.orchestrator"] == "mlflow"
    make = next(r for r in children if r.data.tags["llmpack.step"] == "toy-make")
    assert make.data.tags["mlflow.project.entryPoint"] == "toy_make"
    assert make.data.params["text"] == text
    assert [a.path for a in mc.list_artifacts(make.info.run_id, "logs")] == ["logs/toy-make.log"]


@pytest.mark.parametrize(("overrides", "message", "attempts"), [
    # not retried, as deliberate
    pytest.param({"bad_input": True}, "toy: the input is bad", None, marks=pytest.mark.slow),
    ({"gate": 2.5}, "toy: gate 2.5 not met", "1"),
    ({"fail_times": 9}, "RuntimeError: toy: planned failure 3", "3"),
], ids=["bad-input", "deliberate", "crash"])
def test_a_failed_step_fails_main_with_its_error_line(toy_pipe: Pipeline, toy_env: dict[str, str], tmp_path: Path,
                                                      overrides: dict, message: str, attempts: str | None):
    values = pipeline_values(toy_pipe, {**overrides, "pipeline_run": "toy-f", "orchestrator": "mlflow"})
    with pytest.raises(RunFailed) as err:
        run_local(toy_pipe, values, tmp_path, toy_env)
    assert err.value.step == "toy-flaky"
    assert message in str(err.value)
    run_dir = tmp_path / "artifacts" / "toy-f"
    if attempts is not None:  # deliberate failures are not retried; crashes are, up to the limit
        assert (run_dir / "toy-flaky" / "out" / "attempts").read_text() == attempts
    status = json.loads((run_dir / driver.STATUS_FILE).read_text())
    assert status["status"] == "FAILED" and status["failed_step"] == "toy-flaky"
    assert f"llmpack: error: step 'toy-flaky' failed: {message}" in (tmp_path / "logs" / "mlflow.log").read_text()


def test_bad_parameter_value_fails_before_any_step(toy_pipe: Pipeline, toy_env: dict[str, str], tmp_path: Path):
    values = pipeline_values(toy_pipe, {"fail_times": "two", "pipeline_run": "toy-b"})
    with pytest.raises(RunFailed, match="parameter 'fail_times': 'two' is not a valid int") as err:
        run_local(toy_pipe, values, tmp_path, toy_env)
    assert err.value.step == "main"
    assert not (tmp_path / "artifacts").exists()


def test_k8s_main_runs_steps_in_place_inside_the_image(toy_pipe: Pipeline, toy_env: dict[str, str], tmp_path: Path):
    """In the Job, main.py runs each entry point's own command in place (no docker in the pod).

    Exercised here by running the k8s project's main.py by hand, as the container's command does.
    """
    from mlflow.tracking import MlflowClient

    project = compiler.write_k8s_project(toy_pipe, tmp_path / "k8s", image="example.org/toy:1")
    env = {**toy_env, "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    env.pop("MLFLOW_RUN_ID", None)
    args = [sys.executable, "main.py", f"--artifacts-dir={tmp_path / 'art'}", "--param=text=xyz"]
    proc = subprocess.run(args, cwd=project, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_dir,) = (tmp_path / "art").iterdir()
    assert run_dir.name.startswith("mlflow-")  # no pipeline_run given: one is made from the run id
    assert (run_dir / "toy-flaky" / "out" / "data.txt").read_text() == "XYZ"
    mc = MlflowClient(toy_env["MLFLOW_TRACKING_URI"])
    runs = mc.search_runs([e.experiment_id for e in mc.search_experiments()])
    (parent,) = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert parent.info.status == "FINISHED"
    assert sorted(r.data.tags["llmpack.step"] for r in runs if r is not parent) == ["toy-flaky", "toy-make"]
    assert all(r.data.tags["llmpack.pipeline_run"] == run_dir.name for r in runs)


# --------------------------------------------------------------------------- driver units


def test_driver_checks_parameters():
    spec = json.loads((LOCAL / "pipeline.json").read_text())
    values, artifacts, base = driver.parse_args(["--artifacts-dir=a", "--base-dir=/b", "--param=max_steps=3"], spec)
    assert values["max_steps"] == "3" and values["model"] == "tiny" and values["orchestrator"] == "mlflow"
    assert driver.resolve_artifacts_dir(artifacts, base) == Path("/b/a")
    with pytest.raises(driver.MainError, match="'max_steps': '3.5' is not a valid int"):
        driver.parse_args(["--artifacts-dir=/a", "--param=max_steps=3.5"], spec)
    with pytest.raises(driver.MainError, match="unknown parameter 'maxsteps'"):
        driver.parse_args(["--artifacts-dir=/a", "--maxsteps", "3"], spec)
    with pytest.raises(driver.MainError, match="must be an absolute path"):
        driver.resolve_artifacts_dir("rel", "")


def test_driver_makes_relative_tracking_uris_absolute():
    assert driver.absolute_tracking_uri("sqlite:///mlflow.db", "/home/u") == "sqlite:////home/u/mlflow.db"
    assert driver.absolute_tracking_uri("sqlite:////abs/m.db", "/home/u") == "sqlite:////abs/m.db"
    assert driver.absolute_tracking_uri("mlruns", "/home/u") == "/home/u/mlruns"
    assert driver.absolute_tracking_uri("http://mlflow:5000", "/home/u") == "http://mlflow:5000"


# --------------------------------------------------------------------------- the real pipeline


def _adapter(model_dir: Path) -> bytes:
    return (model_dir / "adapter" / "adapter_model.safetensors").read_bytes()


@pytest.mark.slow
def test_local_run_matches_direct(tmp_path: Path):
    from mlflow.tracking import MlflowClient

    from llmpack.run.direct import run_local as direct_run_local

    pipe = build()
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}", "HF_HUB_OFFLINE": "1"}
    base = {"max_steps": 5, "run_group": "eq", "submitted_at": 1.0e9}
    direct = direct_run_local(pipe, pipeline_values(pipe, {**base, "pipeline_run": "eq-direct"}), tmp_path / "d", env)
    values = pipeline_values(pipe, {**base, "pipeline_run": "eq-mlflow", "orchestrator": "mlflow"})
    ours = run_local(pipe, values, tmp_path / "m", env)
    assert set(ours) == set(direct)
    assert _adapter(ours["finetune.model"]) == _adapter(direct["finetune.model"])
    assert ((ours["evaluate.metrics"] / "metrics.json").read_text()
            == (direct["evaluate.metrics"] / "metrics.json").read_text())

    mc = MlflowClient(env["MLFLOW_TRACKING_URI"])
    runs = mc.search_runs([e.experiment_id for e in mc.search_experiments()],
                          filter_string="tags.`llmpack.pipeline_run` = 'eq-mlflow'")
    records = [r for r in runs if r.data.tags.get("llmpack.record") == "pipeline"]
    assert len(records) == 1  # made by the first step, as with every backend
    (parent,) = [r for r in runs if r.data.tags.get("mlflow.project.entryPoint") == "main"]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert [r.data.tags["llmpack.step"] for r in sorted(children, key=lambda r: r.info.start_time)] == [
        t.name for t in pipe.task_order()]
    assert all(r.info.status == "FINISHED" for r in [parent, *children])


