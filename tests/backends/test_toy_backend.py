"""A fourth backend is one folder plus one registry line (the backend contract).

``tests/toy_backend/`` declares ``toy`` against :mod:`components.backend` only; it is registered
the way a plugin is, by ``LLMPACK_BACKENDS`` (:mod:`llmpack.backends`), with no edit to ``llmpack/``.
Then the real CLI compiles it beside the shipped backends and compares it with ``direct``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.conftest import REPO, llmpack

TOY = "toy=tests.toy_backend.backend"


def toy_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "LLMPACK_BACKENDS": TOY, **(extra or {})}


def test_registry_lists_the_toy_and_loads_it_lazily() -> None:
    from components.backend import Backend, ClusterBackend
    from llmpack import backends

    entry = backends._extra(TOY)[0]
    assert (entry.name, entry.module, entry.cluster) == ("toy", "tests.toy_backend.backend", False)
    toy = entry.load()
    assert isinstance(toy, Backend) and not isinstance(toy, ClusterBackend)
    assert toy.artifacts == (Path("toy/finetune.json"),)


def test_the_registry_line_and_the_class_agree_on_cluster() -> None:
    """Issue 47: "is it a cluster backend" is one question, isinstance(ClusterBackend); +cluster must say the same."""
    from components.errors import InputError
    from llmpack.backends import Entry

    with pytest.raises(InputError, match="registered \\+cluster, but .* is not a components.backend.ClusterBackend"):
        Entry(name="toy", module="tests.toy_backend.backend", cluster=True).load()
    with pytest.raises(InputError, match="is a ClusterBackend: register it as toyc\\+cluster"):
        Entry(name="toyc", module="tests.toy_backend.cluster").load()


@pytest.mark.parametrize("text", ["toy", "toy=", "=m", "toy+local=m"])
def test_a_bad_registry_entry_is_one_line(text: str) -> None:
    from components.errors import InputError
    from llmpack import backends

    with pytest.raises(InputError, match="LLMPACK_BACKENDS"):
        backends._extra(text)


def test_cli_compiles_the_toy_beside_the_shipped_backends(tmp_path: Path) -> None:
    r = llmpack("compile", "--out", str(tmp_path / "out"), cwd=tmp_path, env=toy_env())
    assert r.returncode == 0, r.stderr
    written = {Path(line).relative_to(tmp_path / "out").as_posix() for line in r.stdout.split()}
    assert {"toy/finetune.json", "kfp_pipelines/finetune.yaml", "argo_workflows/finetune.yaml",
            "mlflow_projects/finetune/main.py"} <= written
    plan = json.loads((tmp_path / "out" / "toy" / "finetune.json").read_text())
    assert [t["name"] for t in plan["tasks"]][0] == "prepare-data"


def test_the_toy_is_not_a_cluster_backend(tmp_path: Path) -> None:
    r = llmpack("cluster", "submit", "toy", cwd=tmp_path, env=toy_env())
    assert r.returncode == 2 and "No such command 'toy'" in r.stderr


@pytest.mark.slow
def test_cli_compares_direct_and_the_toy(tmp_path: Path, tracking_uri: str) -> None:
    env = toy_env({"MLFLOW_TRACKING_URI": tracking_uri, "HF_HUB_OFFLINE": "1"})
    r = llmpack("compare", "--backends", "direct,toy", "--max-steps", "3", "--output-dir", str(tmp_path / "runs"),
                "--report", str(tmp_path / "rep"), "--json", cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    assert {run["orchestrator"] for run in out["runs"]} == {"direct", "toy"}
    assert all(run["status"] == "succeeded" for run in out["runs"])
    assert (tmp_path / "rep" / "report.html").is_file()


PODS = [
    {"metadata": {"labels": {"pipelines.kubeflow.org/v2_component": "true"}}},
    {"metadata": {"annotations": {"pipelines.kubeflow.org/v2_component": "true"}}},
    {"metadata": {"labels": {"pipeline/runid": "r1"}}},
    {"metadata": {"labels": {"workflows.argoproj.io/workflow": "wf"}}},
    {"metadata": {"labels": {"job-name": "j"}}, "spec": {"containers": [{"env": [{"name": "MLFLOW_RUN_ID"}]}]}},
    {"metadata": {"labels": {"batch.kubernetes.io/job-name": "j"}}, "spec": {"containers": [{"env": []}]}},
    {"metadata": {"labels": {"app": "x"}}},
    {"metadata": None},
]


@pytest.mark.parametrize("pod", PODS)
def test_each_backend_recognises_its_own_pods_as_the_watcher_does(pod: dict) -> None:
    from llmpack.backends import orchestrator_of_pod
    from llmpack.cluster.k8s.podphases import orchestrator_of

    assert orchestrator_of_pod(pod) == orchestrator_of(pod)


def test_a_submitted_run_waits_reports_and_says_how_to_stop_it() -> None:
    from components.backend import ClusterBackend, ServerConnection, SubmittedRun

    calls: list[dict] = []

    class Fake(ClusterBackend):
        name = "fake"
        connection_type = ServerConnection

        def recognise_pod(self, pod: object) -> bool:
            return False

        def wait_for_completion(self, summary: object, **kwargs: object) -> dict:
            calls.append(kwargs)
            return {"status": "timeout" if kwargs["timeout_s"] == 0 else "succeeded"}

        def stop_hint(self, summary: object) -> str:
            return "fake stop r1"

    fake = Fake()
    run = SubmittedRun(fake, {"orchestrator": "fake", "pipeline_run": "r1", "server_id": "s1"},
                       fake.connect({"host": "http://h", "other": 1}))
    assert run.get_status() == "running"
    assert run.wait(5)["status"] == "succeeded" and run.summary["result"]["status"] == "succeeded"
    # an option not given is left out, so the wait takes the submission's own (its namespace: issue 52 item 5)
    assert calls[-1] == {"timeout_s": 5, "host": "http://h", "insecure_skip_tls_verify": False}
    assert run.still_running().endswith("stop it with: fake stop r1")


def test_a_connection_checks_its_fields() -> None:
    from components.backend import ServerConnection
    from components.errors import InputError

    with pytest.raises(InputError, match="connection host: expected text"):
        ServerConnection(host=3)  # type: ignore[arg-type]


# The toy as a cluster backend: its folder (tests/toy_backend/cluster.py, server.py) and this one line.
TOY_CLUSTER = "toyc+cluster=tests.toy_backend.cluster"


def test_cli_submits_to_the_toy_cluster_and_waits(tmp_path: Path) -> None:
    from tests.toy_backend.server import ToyServer

    with ToyServer() as server:
        r = llmpack("cluster", "submit", "toyc", "--host", server.host, "--max-steps", "3", "--wait", "--json",
                    cwd=tmp_path,
                    env={**toy_env(), "LLMPACK_BACKENDS": TOY_CLUSTER})
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["result"]["status"] == "succeeded" and summary["server_id"] in server.runs
    sent = server.runs[summary["server_id"]]
    assert sent["params"]["max_steps"] == 3 and sent["pipeline_run"] == summary["pipeline_run"]
    assert [t["name"] for t in sent["plan"]["tasks"]][0] == "prepare-data"


def test_the_toy_cluster_is_compiled_listed_and_its_pods_recognised(tmp_path: Path) -> None:
    import subprocess
    import sys

    code = (
        "import json; from llmpack.backends import ORCHESTRATORS, cluster_paths; "
        "from llmpack.cluster.k8s.podphases import orchestrator_of; from llmpack.cluster.k8s.slim import slim_pod; "
        "pod = {'metadata': {'name': 'p', 'namespace': 'llmpack', 'labels': {'toy.example/run': 'r-1', 'x': 'y'}},"
        " 'spec': {'containers': [{'name': 'main'}]}, 'status': {}}; "
        "print(json.dumps({'orchestrators': list(ORCHESTRATORS), 'paths': list(cluster_paths()),"
        " 'of': orchestrator_of(pod), 'kept': slim_pod(pod)['metadata']['labels']}))")
    env = {**toy_env(), "LLMPACK_BACKENDS": TOY_CLUSTER}
    got = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env,
                                    cwd=REPO).stdout)
    assert got["orchestrators"][-1] == "toyc" and "toyc" in got["paths"]
    assert got["of"] == "toyc" and got["kept"] == {"toy.example/run": "r-1"}
    r = llmpack("compile", "--out", str(tmp_path / "out"), cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "out" / "toyc" / "finetune.json").is_file()


def test_doctor_checks_the_toy_cluster(tmp_path: Path) -> None:
    from standins.k8s_api import KubeAPIStandIn
    from standins.loopback import CLIENT_ENV, write_kubeconfig
    from standins.ready_cluster import plant_ready

    from tests.toy_backend.server import VERSION, ToyServer

    env = {k: v for k, v in toy_env().items() if k not in CLIENT_ENV}
    env.update(LLMPACK_BACKENDS=TOY_CLUSTER, HOME=str(tmp_path / "home"))
    assert llmpack("compile", "--out", str(tmp_path / "out"), cwd=tmp_path, env=env).returncode == 0
    with KubeAPIStandIn(token="toy-k8s-token", namespaces=()) as kube, ToyServer() as server:
        plant_ready(kube)
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", kube.url, "toy-k8s-token")
        r = llmpack("cluster", "doctor", "--path", "toyc", "--kubeconfig", str(kubeconfig), "--compiled",
                    str(tmp_path / "out"),
                    cwd=tmp_path, env={**env, "TOY_HOST": server.host})
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("llmpack cluster doctor: toyc on ")
    assert "✓ RBAC (toyc): you may create configmaps, list/watch pods, list/watch events in llmpack" in lines, lines
    assert any(line.startswith("✓ Pod Security (toyc): ") for line in lines), lines
    assert f"✓ Toy server at {server.host} answers (version {VERSION})" in lines, lines


def test_no_module_outside_the_toy_folder_names_it() -> None:
    """The toy's whole footprint is its folder plus the registry line in this test: nothing else names it.

    Named: its package, module, classes, pod label or a quoted backend name (prose that says "a
    toy" is not a name).
    """
    import re

    names = re.compile(r"toy_backend|toy\.example|\btoyc\b|Toy[A-Z]|[\"']toy[\"']")
    roots = ("components", "kfp_pipelines", "argo_workflows", "mlflow_projects", "llmpack")
    named = [p.relative_to(REPO).as_posix() for root in roots for p in sorted((REPO / root).rglob("*.py"))
             if names.search(p.read_text(encoding="utf-8"))]
    shared = [name for name in ("pyproject.toml", "Makefile", "Dockerfile", ".ci/run") if (REPO / name).exists()
              and names.search((REPO / name).read_text(encoding="utf-8"))]
    assert not named and not shared, named + shared


def test_a_plugins_second_module_carries_its_pod_marks_and_a_bad_registration_is_one_line(tmp_path: Path) -> None:
    """Issue 47's check (helper-56): pod marks could not go in the lab's second module; a `+cluster` backend without
    a cluster path was a KeyError in `cluster submit`; a top-level module crashed every cluster command."""
    import subprocess
    import sys

    pkg = tmp_path / "plug"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "backend.py").write_text(
        "from components.backend import ClusterBackend, ClusterPath, ServerConnection\n"
        "class Plug(ClusterBackend):\n    name = 'plug'\n    connection_type = ServerConnection\n"
        "    cluster_path = ClusterPath(name='plug', artifact_option='job_path', artifact_path='plug/job.json',\n"
        "                               submit_options=(), wait_options=())\n"
        "    def recognise_pod(self, pod):\n        return False\n"
        "BACKEND = Plug()\n"
        "class Bare(ClusterBackend):\n    name = 'bare'\n    connection_type = ServerConnection\n"
        "    def recognise_pod(self, pod):\n        return False\n"
        "BARE = Bare()\n")
    (pkg / "doctor.py").write_text("from components.backend import PodMarks\n"
                                   "POD_MARKS = PodMarks(run_labels=('plug.example/run',))\n")
    (tmp_path / "lonely.py").write_text("from plug.backend import Plug\nBACKEND = Plug()\n")
    code = ("from llmpack import backends as b\n"
            "print(b.pod_marks('plug').run_labels, b.doctor_facts('plug').pod_artifact)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)]),
           "LLMPACK_BACKENDS": "plug+cluster=plug.backend"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "('plug.example/run',) None", done.stdout + done.stderr
    for registered, says in (("bare+cluster=plug.backend:BARE", "declares no connection_type and cluster_path"),
                             ("plug+cluster=lonely", None)):
        run = subprocess.run([sys.executable, "-m", "llmpack", "cluster", "doctor", "--path", registered.split("+")[0],
                              "--help"], env={**env, "LLMPACK_BACKENDS": registered}, capture_output=True, text=True,
                             timeout=120)
        assert "Traceback" not in run.stderr, run.stderr
        if says:
            assert run.returncode == 2 and says in run.stderr.strip().splitlines()[-1], run.stderr
        else:
            assert run.returncode == 0, run.stderr
