"""components.trainjob.launch: create a TrainJob, follow it, delete it when cancelled; and the stand-in's
custom-object endpoints it talks to. The real ``kubernetes`` client against tests/standins/k8s_api.py."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes import watch
from kubernetes.client.exceptions import ApiException
from standins.k8s_api import TRAINJOBS, KubeAPIStandIn

from components.errors import InputError, Interrupted, StepFailed
from components.trainjob import launch
from components.trainjob.spec import TrainJobSpec

REPO = Path(__file__).resolve().parents[2]
TOKEN = "trainjob-standin-token-Zq81"
NS = "llmpack"
G, V, P = "trainer.kubeflow.org", "v1alpha1", "trainjobs"
LABELS = {"llmpack.io/pipeline-run": "run-7", "llmpack.io/step": "finetune", "llmpack.io/orchestrator": "kfp"}


@pytest.fixture
def kube():
    with KubeAPIStandIn(token=TOKEN, namespaces=("default", NS)) as api:
        yield api


def api_client(kube: KubeAPIStandIn, token: str = TOKEN) -> k8s.ApiClient:
    cfg = k8s.Configuration(host=kube.url, api_key={"authorization": f"Bearer {token}"})
    return k8s.ApiClient(cfg)


def trainjob(name: str = "ft-run-7", labels: dict[str, str] | None = None,
             image: str = "ghcr.io/llmpack/llmpack:0.1.0") -> dict:
    return TrainJobSpec(name=name, namespace=NS, image=image, num_nodes=2, gpus_per_node=8, cpu=8, memory="64Gi",
                        command=["torchrun", "-m", "components.run", "components.steps.finetune:finetune",
                                 "--param=nnodes=2"],
                        labels=LABELS if labels is None else labels, queue="gpu").build()


def finish_later(kube: KubeAPIStandIn, type: str = "Complete", delay: float = 0.3, **kwargs: str) -> None:
    """Play the Trainer controller: Suspended (Kueue admits it) then ``type`` a little after the create."""

    def created(obj: dict) -> None:
        ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]

        def run() -> None:
            kube.set_trainjob_condition(ns, name, "Suspended", "False", "Resumed", "admitted by ClusterQueue gpu")
            kube.set_trainjob_condition(ns, name, type, "True", **kwargs)

        threading.Timer(delay, run).start()

    kube.on_custom_object_created = created


# --------------------------------------------------------------------------- create and wait


def test_created_trainjob_that_completes_is_a_success_with_its_times(kube: KubeAPIStandIn) -> None:
    finish_later(kube, reason="AllJobsCompleted", message="jobset completed")
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    seen: list[dict] = []
    result = launch.create_and_wait(trainjob(), namespace=NS, api=api_client(kube), poll_s=0.05, on_status=seen.append)

    assert result.succeeded and result.exit_code == 0 and not result.adopted
    assert (result.outcome, result.reason, result.message) == ("Complete", "AllJobsCompleted", "jobset completed")
    assert result.created_at and result.finished_at and result.duration_s is not None and result.duration_s >= 0
    assert result.check() is result and result.name == "ft-run-7" and result.namespace == NS
    stored = kube.trainjobs[(NS, "ft-run-7")]
    assert result.uid == stored["metadata"]["uid"] and result.created_at == stored["metadata"]["creationTimestamp"]
    (post,) = kube.recorded("POST", f"/apis/{G}/{V}/namespaces/{NS}/{P}")
    assert post.body == trainjob()  # sent as the builder made it
    assert kube.recorded("GET", f"/apis/{G}/{V}/namespaces/{NS}/{P}/ft-run-7")
    assert not kube.recorded("DELETE")
    # on_status once per resourceVersion: the first read, then as the conditions change
    rvs = [o["metadata"]["resourceVersion"] for o in seen]
    assert len(rvs) == len(set(rvs)) >= 2 and "conditions" not in seen[0].get("status", {})
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def test_failed_trainjob_is_returned_with_its_message(kube: KubeAPIStandIn) -> None:
    finish_later(kube, "Failed", reason="DeadlineExceeded", message="TrainJob exceeded its\nactiveDeadlineSeconds")
    result = launch.create_and_wait(trainjob(), namespace=NS, api=api_client(kube), poll_s=0.05)
    assert not result.succeeded and result.exit_code == 1
    assert (result.outcome, result.reason) == ("Failed", "DeadlineExceeded")
    assert result.message == "TrainJob exceeded its activeDeadlineSeconds"
    with pytest.raises(StepFailed) as info:
        result.check()
    assert str(info.value) == (f"TrainJob {NS}/ft-run-7 Failed (DeadlineExceeded: TrainJob exceeded its "
                               "activeDeadlineSeconds)")


def test_a_retried_launcher_adopts_the_trainjob_it_created(kube: KubeAPIStandIn) -> None:
    custom = k8s.CustomObjectsApi(api_client(kube))
    first = custom.create_namespaced_custom_object(G, V, NS, P, trainjob())  # the attempt that died
    finish_later(kube)  # no hook call on a 409: complete it from here
    threading.Timer(0.3, kube.set_trainjob_condition, (NS, "ft-run-7", "Complete")).start()
    result = launch.create_and_wait(trainjob(), namespace=NS, api=api_client(kube), poll_s=0.05)
    assert result.succeeded and result.adopted and result.uid == first["metadata"]["uid"]
    assert list(kube.trainjobs) == [(NS, "ft-run-7")] and len(kube.recorded("POST")) == 2
    assert not kube.recorded("DELETE")


def test_an_adopted_trainjob_that_already_failed_is_replaced(kube: KubeAPIStandIn) -> None:
    custom = k8s.CustomObjectsApi(api_client(kube))
    old = custom.create_namespaced_custom_object(G, V, NS, P, trainjob())
    kube.set_trainjob_condition(NS, "ft-run-7", "Failed", reason="FailedJobs", message="node-0 OOMKilled")
    finish_later(kube)
    result = launch.create_and_wait(trainjob(), namespace=NS, api=api_client(kube), poll_s=0.05)
    assert result.succeeded and not result.adopted and result.uid != old["metadata"]["uid"]
    (delete,) = kube.recorded("DELETE")
    assert (delete.body["propagationPolicy"] == "Foreground"
            and delete.body["preconditions"] == {"uid": old["metadata"]["uid"]})
    # replace_failed=False: the old failure is the answer
    kube.set_trainjob_condition(NS, "ft-run-7", "Failed", reason="FailedJobs")
    kube.on_custom_object_created = None
    again = launch.create_and_wait(trainjob(), namespace=NS, api=api_client(kube), poll_s=0.05, replace_failed=False)
    assert again.adopted and again.outcome == "Failed" and len(kube.recorded("DELETE")) == 1


def test_a_same_named_trainjob_of_another_run_is_refused_and_left_alone(kube: KubeAPIStandIn) -> None:
    custom = k8s.CustomObjectsApi(api_client(kube))
    theirs = custom.create_namespaced_custom_object(G, V, NS, P,
                                                    trainjob(labels={**LABELS, "llmpack.io/pipeline-run": "run-6"}))
    with pytest.raises(InputError,
                       match=r"already exists and is not this run's \(label llmpack.io/pipeline-run='run-6'"):
        launch.create_and_wait(trainjob(), namespace=NS, api=api_client(kube), poll_s=0.05)
    custom.create_namespaced_custom_object(G, V, NS, P, trainjob("ft-run-9"))
    other_image = trainjob("ft-run-9", image="ghcr.io/llmpack/llmpack:0.2.0")
    with pytest.raises(InputError, match=r"ft-run-9 already exists and is not this run's \(another trainer image\)"):
        launch.create_and_wait(other_image, namespace=NS, api=api_client(kube), poll_s=0.05)
    assert kube.trainjobs[(NS, "ft-run-7")]["metadata"]["uid"] == theirs["metadata"]["uid"]
    assert not kube.recorded("DELETE")


def test_timeout_deletes_the_trainjob(kube: KubeAPIStandIn) -> None:
    with pytest.raises(StepFailed, match=f"TrainJob {NS}/ft-run-7 did not finish within 0.3 s; deleted it"):
        launch.create_and_wait(trainjob(), namespace=NS, api=api_client(kube), poll_s=0.05, timeout_s=0.3)
    assert kube.trainjobs == {} and kube.recorded("DELETE")[0].body["propagationPolicy"] == "Foreground"


def test_a_trainjob_deleted_under_the_launcher_fails_the_step(kube: KubeAPIStandIn) -> None:
    kube.on_custom_object_created = lambda obj: threading.Timer(0.2, kube.delete_custom_object,
                                                                ("trainjobs", NS, obj["metadata"]["name"])).start()
    with pytest.raises(StepFailed, match="was deleted before it finished"):
        launch.create_and_wait(trainjob(), namespace=NS, api=api_client(kube), poll_s=0.05)


def test_a_signal_during_the_create_request_still_deletes_the_new_trainjob(kube: KubeAPIStandIn) -> None:
    # The hook runs in the server thread while the launcher (this, the main thread) waits for the answer.
    kube.on_custom_object_created = lambda obj: os.kill(os.getpid(), signal.SIGTERM)
    with pytest.raises(Interrupted) as info:
        launch.create_and_wait(trainjob(), namespace=NS, api=api_client(kube), poll_s=0.05)
    assert info.value.exit_code == 143 and kube.trainjobs == {}
    (delete,) = kube.recorded("DELETE")
    assert delete.body["preconditions"]["uid"] and not kube.recorded("GET")


SCRIPT = """
import json, sys
from kubernetes import client
from components.trainjob import launch as trainjob_launch
from components.errors import Interrupted

host, token, obj = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
api = client.ApiClient(client.Configuration(host=host, api_key={"authorization": "Bearer " + token}))
try:
    trainjob_launch.create_and_wait(obj, namespace="llmpack", api=api, poll_s=0.05,
                                    on_status=lambda o: print("waiting", o["metadata"]["uid"], flush=True))
except Interrupted as exc:
    sys.exit(exc.exit_code)
sys.exit(99)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_cancelled_launcher_deletes_its_trainjob(kube: KubeAPIStandIn, sig: int) -> None:
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, kube.url, TOKEN, json.dumps(trainjob())], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("waiting "), proc.stderr.read()
        uid = line.split()[1]
        assert kube.trainjobs[(NS, "ft-run-7")]["metadata"]["uid"] == uid
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + sig, err
    assert kube.trainjobs == {}
    (delete,) = kube.recorded("DELETE", f"/apis/{G}/{V}/namespaces/{NS}/{P}/ft-run-7")
    assert delete.body["propagationPolicy"] == "Foreground" and delete.body["preconditions"] == {"uid": uid}
    assert f"deleted TrainJob {NS}/ft-run-7" in err and "Traceback" not in err


# --------------------------------------------------------------------------- errors, one line


def test_forbidden_names_the_rbac_rule(kube: KubeAPIStandIn) -> None:
    with KubeAPIStandIn(token=TOKEN, namespaces=(NS,), forbidden=("create trainjobs",)) as api:
        with pytest.raises(InputError) as info:
            launch.create_and_wait(trainjob(), namespace=NS, api=api_client(api))
    message = str(info.value)
    assert "\n" not in message and TOKEN not in message
    assert ("403 Forbidden: system:serviceaccount:llmpack:llmpack-runner "
            "may not create trainjobs.trainer.kubeflow.org" in message)
    assert 'apiGroups ["trainer.kubeflow.org"], resources ["trainjobs"], verbs ["create", "get", "delete"]' in message


@pytest.mark.parametrize("case, error, pattern", [
    ("no-crd", InputError,
     r"does not serve trainjobs.trainer.kubeflow.org/v1alpha1 .*: is Kubeflow Trainer v2 installed\?"),
    ("namespace", InputError, "namespace 'team-z' not found"),
    ("token", InputError, r"rejected the credentials \(401 Unauthorized\)"),
    ("unreachable", StepFailed, "is unreachable"),
])
def test_api_errors_are_one_line(kube: KubeAPIStandIn, case: str, error: type, pattern: str) -> None:
    namespace, api = NS, api_client(kube)
    if case == "namespace":
        namespace = "team-z"
    elif case == "token":
        api = api_client(kube, token="wrong-token-SECRET99")
    elif case == "unreachable":
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        cfg = k8s.Configuration(host=f"http://127.0.0.1:{port}")
        cfg.retries = 0
        api = k8s.ApiClient(cfg)
    obj = trainjob()
    obj["metadata"]["namespace"] = namespace
    with (KubeAPIStandIn(token=TOKEN, namespaces=(NS,), custom_resources=()) if case == "no-crd" else kube) as server:
        if case == "no-crd":
            api = api_client(server)
        with pytest.raises(error, match=pattern) as info:
            launch.create_and_wait(obj, namespace=namespace, api=api)
    assert "\n" not in str(info.value) and "SECRET99" not in str(info.value)


def test_bad_input_fails_before_any_request(kube: KubeAPIStandIn) -> None:
    with pytest.raises(InputError, match="expected a trainer.kubeflow.org/v1alpha1 TrainJob"):
        launch.create_and_wait({"apiVersion": "batch/v1", "kind": "Job"}, namespace=NS, api=api_client(kube))
    with pytest.raises(InputError, match="is not the namespace it is created in"):
        launch.create_and_wait(trainjob(), namespace="default", api=api_client(kube))
    assert kube.requests == []


def test_transient_errors_are_waited_out() -> None:
    import urllib3

    assert launch._transient(ApiException(status=503)) and launch._transient(ApiException(status=429))
    assert launch._transient(urllib3.exceptions.ProtocolError("connection reset"))
    assert not launch._transient(ApiException(status=403)) and not launch._transient(ApiException(status=0))


# --------------------------------------------------------------------------- configuration


def write_kubeconfig(path: Path, server: str, namespace: str | None) -> Path:
    context = {"cluster": "standin", "user": "runner", **({"namespace": namespace} if namespace else {})}
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "standin",
        "clusters": [{"name": "standin", "cluster": {"server": server}}],
        "users": [{"name": "runner", "user": {"token": TOKEN}}],
        "contexts": [{"name": "standin", "context": context},
                     {"name": "other", "context": {**context, "namespace": "team-b"}}],
    }))
    return path


def test_load_config_from_kubeconfig_and_the_namespace_order(kube: KubeAPIStandIn, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("KUBERNETES_SERVICE_HOST", "POD_NAMESPACE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    no_sa = tmp_path / "no-sa"
    monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "kc", kube.url, "team-a")))
    cluster = launch.load_config(service_account_dir=no_sa)
    assert cluster.namespace == "team-a" and cluster.api.configuration.host == kube.url
    assert launch.load_config(context="other", service_account_dir=no_sa).namespace == "team-b"
    monkeypatch.setenv("POD_NAMESPACE", "team-c")
    assert launch.load_config(service_account_dir=no_sa).namespace == "team-c"
    monkeypatch.delenv("POD_NAMESPACE")
    monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "kc2", kube.url, None)))
    cluster = launch.load_config(service_account_dir=no_sa)
    assert cluster.namespace == "default"
    finish_later(kube, delay=0.05)  # the client it gives works
    obj = trainjob()
    obj["metadata"]["namespace"] = "default"
    assert launch.create_and_wait(obj, namespace="default", api=cluster.api, poll_s=0.05).succeeded

    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    with pytest.raises(InputError, match="no Kubernetes cluster configured"):
        launch.load_config(service_account_dir=no_sa)


def test_load_config_in_a_pod(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sa = tmp_path / "serviceaccount"
    sa.mkdir()
    (sa / "token").write_text("pod-token-abc123")
    (sa / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n")
    (sa / "namespace").write_text("team-pod\n")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    monkeypatch.setenv("POD_NAMESPACE", "team-env")
    cluster = launch.load_config(service_account_dir=sa)
    assert cluster.namespace == "team-pod" and cluster.api.configuration.host == "https://10.96.0.1:443"
    (sa / "namespace").unlink()
    assert launch.load_config(service_account_dir=sa).namespace == "team-env"
    (sa / "token").unlink()
    with pytest.raises(InputError, match="in-cluster Kubernetes config"):
        launch.load_config(service_account_dir=sa)


# --------------------------------------------------------------------------- the stand-in's custom objects


def test_standin_serves_custom_objects_through_the_client(kube: KubeAPIStandIn) -> None:
    custom = k8s.CustomObjectsApi(api_client(kube))
    created_hook: list[dict] = []
    kube.on_custom_object_created = created_hook.append
    obj = trainjob()
    obj["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}  # dropped: the status subresource
    made = custom.create_namespaced_custom_object(G, V, NS, P, obj)
    meta = made["metadata"]
    assert meta["uid"] and meta["creationTimestamp"] and meta["resourceVersion"] and meta["generation"] == 1
    assert "status" not in made and created_hook[0]["metadata"]["uid"] == meta["uid"]
    custom.create_namespaced_custom_object(G, V, NS, P, trainjob("ft-run-8", labels={"llmpack.io/step": "other"}))

    listed = custom.list_namespaced_custom_object(G, V, NS, P, label_selector="llmpack.io/pipeline-run=run-7")
    assert [o["metadata"]["name"] for o in listed["items"]] == ["ft-run-7"] and listed["kind"] == "TrainJobList"
    assert listed["apiVersion"] == TRAINJOBS.api_version

    with pytest.raises(ApiException) as info:
        custom.create_namespaced_custom_object(G, V, NS, P, trainjob())
    body = json.loads(info.value.body)
    assert info.value.status == 409 and body["reason"] == "AlreadyExists" and body["kind"] == "Status"
    assert body["message"] == 'trainjobs.trainer.kubeflow.org "ft-run-7" already exists'
    with pytest.raises(ApiException) as info:
        custom.get_namespaced_custom_object(G, V, NS, P, "nope")
    assert info.value.status == 404 and json.loads(info.value.body)["reason"] == "NotFound"

    patched = custom.patch_namespaced_custom_object_status(
        G, V, NS, P, "ft-run-7",
        {"status": {"conditions": [{"type": "Suspended", "status": "True"}]}, "spec": {"x": 1}})
    assert patched["status"]["conditions"][0]["type"] == "Suspended" and "x" not in patched["spec"]
    assert custom.get_namespaced_custom_object_status(G, V, NS, P, "ft-run-7")["status"] == patched["status"]
    relabelled = custom.patch_namespaced_custom_object(G, V, NS, P, "ft-run-7",
                                                       {"metadata": {"labels": {"extra": "1"}}, "status": None})
    assert relabelled["metadata"]["labels"]["extra"] == "1" and relabelled["status"] == patched["status"]
    assert relabelled["metadata"]["uid"] == meta["uid"] and relabelled["metadata"]["generation"] == 1
    patch = kube.recorded("PATCH")[0]
    assert patch.headers["Content-Type"] == "application/merge-patch+json" and patch.path.endswith("/ft-run-7/status")

    kube.set_trainjob_condition(NS, "ft-run-7", "Complete", reason="AllJobsCompleted")
    conds = {c["type"]: c for c in custom.get_namespaced_custom_object(G, V, NS, P, "ft-run-7")["status"]["conditions"]}
    assert conds["Complete"]["reason"] == "AllJobsCompleted" and conds["Complete"]["lastTransitionTime"]
    assert conds["Suspended"]["status"] == "True"

    with pytest.raises(ApiException) as info:
        custom.delete_namespaced_custom_object(G, V, NS, P, "ft-run-7", body={"preconditions": {"uid": "other"}})
    assert info.value.status == 409 and "Precondition failed" in json.loads(info.value.body)["message"]
    gone = custom.delete_namespaced_custom_object(G, V, NS, P, "ft-run-7", propagation_policy="Foreground")
    assert gone["metadata"]["deletionTimestamp"] and "foregroundDeletion" in gone["metadata"]["finalizers"]
    assert ((NS, "ft-run-7") not in kube.trainjobs
            and kube.recorded("DELETE")[-1].query["propagationPolicy"] == "Foreground")

    # Kueue workloads are served from the same table; unknown resources are 404 as without the CRD
    wl = custom.create_namespaced_custom_object("kueue.x-k8s.io", "v1beta1", NS, "workloads", {
        "apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "Workload", "metadata": {"name": "trainjob-ft-run-8-1a2b3"}})
    assert wl["metadata"]["uid"] and kube.custom_object("workloads", NS, "trainjob-ft-run-8-1a2b3")
    with pytest.raises(ApiException) as info:
        custom.list_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", NS, "jobsets")
    assert info.value.status == 404


def test_standin_watches_custom_objects(kube: KubeAPIStandIn) -> None:
    custom = k8s.CustomObjectsApi(api_client(kube))
    custom.create_namespaced_custom_object(G, V, NS, P, trainjob("ft-other"))
    rv = custom.list_namespaced_custom_object(G, V, NS, P)["metadata"]["resourceVersion"]

    def play() -> None:
        kube.wait_for_watches(1)
        custom.create_namespaced_custom_object(G, V, NS, P, trainjob())
        kube.set_trainjob_condition(NS, "ft-other", "Complete")  # filtered out by the field selector
        kube.set_trainjob_condition(NS, "ft-run-7", "Complete")
        custom.delete_namespaced_custom_object(G, V, NS, P, "ft-run-7")

    threading.Thread(target=play, daemon=True).start()
    events = []
    for event in watch.Watch().stream(custom.list_namespaced_custom_object, G, V, NS, P, resource_version=rv,
                                      field_selector="metadata.name=ft-run-7", timeout_seconds=5):
        events.append((event["type"], event["object"]["metadata"]["name"]))
        if event["type"] == "DELETED":
            break
    assert events == [("ADDED", "ft-run-7"), ("MODIFIED", "ft-run-7"), ("DELETED", "ft-run-7")]


def test_standin_forbids_one_verb_and_rejects_json_patch() -> None:
    with KubeAPIStandIn(token=TOKEN, namespaces=(NS,), forbidden=("delete trainjobs.trainer.kubeflow.org",)) as api:
        custom = k8s.CustomObjectsApi(api_client(api))
        custom.create_namespaced_custom_object(G, V, NS, P, trainjob())
        with pytest.raises(ApiException) as info:
            custom.delete_namespaced_custom_object(G, V, NS, P, "ft-run-7")
        assert info.value.status == 403 and (
            'cannot delete resource "trainjobs" in API group "trainer.kubeflow.org"'
            in json.loads(info.value.body)["message"])
        with pytest.raises(ApiException) as info:  # a merge patch must be an object
            custom.patch_namespaced_custom_object(G, V, NS, P, "ft-run-7", [{"op": "add", "path": "/x", "value": 1}])
        assert info.value.status == 400
        request = urllib.request.Request(f"{api.url}/apis/{G}/{V}/namespaces/{NS}/{P}/ft-run-7", method="PATCH",
                                         data=b'[{"op": "add", "path": "/x", "value": 1}]',
                                         headers={"Authorization": f"Bearer {TOKEN}",
                                                  "Content-Type": "application/json-patch+json"})
        with pytest.raises(urllib.error.HTTPError) as http:
            urllib.request.urlopen(request, timeout=10)
        assert http.value.code == 415 and json.loads(http.value.read())["reason"] == "UnsupportedMediaType"
