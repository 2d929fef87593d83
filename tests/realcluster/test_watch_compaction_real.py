"""The pod watcher through the real API server's watch bookmarks and a real etcd compaction (410 Gone).

- **Bookmarks** (the session's control plane, watch cache on): while nothing of its run group
  changes, the server's BOOKMARK carries other pods' newer resourceVersion to the watcher, seen in
  the ``resourceVersion`` of each watch request the real client makes.
- **410 after a compaction** (a control plane of this module's own with
  ``LLMPACK_CLUSTER_WATCH_CACHE=0``, so that every watch is etcd's, as in a cluster whose cache
  window a slow client has fallen behind): one watch over two Jobs of a run group; between them the
  test compacts etcd (its own ``/v3/kv/compaction``) again and again, the watcher's resumed windows
  get 410 Gone, it re-lists and goes on. Asserted: each 410 followed by a re-list, every pod once
  in the rows, Succeeded on the node the API says, none taken for deleted.

Why each setting: docs/internals/real-cluster.md, "Which tests use it" (``test_watch_compaction_real.py``).
"""

from __future__ import annotations

import json
import ssl
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.realcluster.apiserver import make_namespace, wait_until
from tests.realcluster.conftest import RealCluster, started_cluster

pytestmark = pytest.mark.cluster

PODS = 8  # two Jobs of 4


def _job(name: str, run_group: str, completions: int, parallelism: int) -> dict[str, Any]:
    container = {"name": "main", "image": "registry.example/x@sha256:" + "0" * 64, "command": ["true"],
                 "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}
    labels = {"llmpack.io/run-group": run_group, "llmpack.io/step": "prepare_data",
              "llmpack.io/pipeline-run": run_group}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "labels": labels},
            "spec": {"completions": completions, "parallelism": parallelism, "backoffLimit": 0,
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"restartPolicy": "Never", "containers": [container]}}}}


@pytest.fixture(scope="module")
def etcd_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealCluster]:
    """A control plane whose API server serves watches from etcd (no watch cache)."""
    with started_cluster(tmp_path_factory.mktemp("etcdwatch") / "state", settings={"LLMPACK_CLUSTER_WATCH_CACHE": "0"},
                         unset=("LLMPACK_CLUSTER_CONTROLLERS",)) as cluster:
        yield cluster


def _etcd(url: str, path: str, body: dict[str, Any], pki: Path) -> dict[str, Any]:
    """One call on etcd's JSON gateway (loopback, the URL up.sh wrote; TLS with the etcd CA's client pair)."""
    tls = ssl.create_default_context(cafile=str(pki / "etcd-ca.crt"))
    tls.load_cert_chain(pki / "apiserver-etcd-client.crt", pki / "apiserver-etcd-client.key")
    request = urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10, context=tls) as response:
        return json.loads(response.read())


def _record_watch_versions(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """(selector, resourceVersion) of every pod watch request the real client makes, in order."""
    from kubernetes.client import CoreV1Api

    seen: list[tuple[str, int]] = []
    real = CoreV1Api.list_namespaced_pod

    def recording(self: Any, namespace: str, **kwargs: Any) -> Any:
        if kwargs.get("watch") and kwargs.get("resource_version"):
            seen.append((kwargs.get("label_selector") or "", int(kwargs["resource_version"])))
        return real(self, namespace, **kwargs)

    monkeypatch.setattr(CoreV1Api, "list_namespaced_pod", recording)
    return seen


def _settled_version(core: Any, ns: str, name: str, quiet_s: float = 2.0, timeout_s: float = 60.0) -> int:
    """The pod's resourceVersion once it has not changed for ``quiet_s`` (kwok writes status in steps)."""
    deadline = time.monotonic() + timeout_s
    version, since = None, time.monotonic()
    while time.monotonic() < deadline:
        now = int(core.read_namespaced_pod(name, ns).metadata.resource_version)
        if now != version:
            version, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return now
        time.sleep(0.2)
    raise AssertionError(f"pod {name}: its resourceVersion kept changing for {timeout_s:.0f} s")


def test_a_bookmark_moves_the_watch_past_other_pods_writes(real_cluster: RealCluster,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """One pod of the run group, Running and unchanged; 20 pods elsewhere created meanwhile: a later watch
    request of the watcher resumes from a version newer than its pod's, which only a BOOKMARK can have given."""
    from kubernetes import client

    from llmpack.cluster.k8s.watcher import PodWatcher

    core = client.CoreV1Api(real_cluster.api)
    ns, other = make_namespace(real_cluster.api, "llmpack-bookmark"), make_namespace(real_cluster.api, "llmpack-noise")
    labels = {"llmpack.io/run-group": "rg-bookmark", "llmpack.io/step": "train"}
    pod = {"metadata": {"name": "steady", "labels": labels},
           "spec": {"containers": [{"name": "main", "image": "registry.example/x@sha256:" + "0" * 64}]}}
    core.create_namespaced_pod(ns, pod)
    wait_until(lambda: core.read_namespaced_pod("steady", ns).status.phase == "Running", timeout_s=60,
               what="kwok runs the run group's pod")
    pod_rv = _settled_version(core, ns, "steady")  # kwok's last status write lands before the watch starts
    seen = _record_watch_versions(monkeypatch)
    watcher = PodWatcher(real_cluster.api, ns, "rg-bookmark", window_s=5)
    watcher.start(timeout_s=60)
    for i in range(20):
        core.create_namespaced_pod(other, {"metadata": {"name": f"noise-{i}"}, "spec": pod["spec"]})
    time.sleep(14)  # two or three 5-second windows
    rows = watcher.finish()
    assert [r["pod"] for r in rows] == ["steady"] and rows[0]["phase"] == "Running", rows
    assert watcher.stats["events"] == 0, watcher.stats  # nothing of the run group changed
    versions = [rv for selector, rv in seen if selector == "llmpack.io/run-group=rg-bookmark"]
    assert len(versions) >= 2, seen
    assert versions[-1] > pod_rv, (versions, pod_rv)


def test_the_watcher_relists_after_etcd_compaction_and_keeps_every_pod_once(etcd_cluster: RealCluster) -> None:
    """Compactions mid-watch: 410 Gone on the watcher's resumed watches, a re-list each, every pod once, Succeeded."""
    from kubernetes import client

    from llmpack.cluster.k8s.podphases import all_terminated
    from llmpack.cluster.k8s.watcher import PodWatcher

    etcd = (etcd_cluster.state_dir / "etcd-url").read_text().strip()
    assert etcd.startswith("https://127.0.0.1:"), etcd
    pki = etcd_cluster.state_dir / "pki"
    core, batch = client.CoreV1Api(etcd_cluster.api), client.BatchV1Api(etcd_cluster.api)
    ns = make_namespace(etcd_cluster.api, "llmpack-compact")
    watcher = PodWatcher(etcd_cluster.api, ns, "rg-compact", window_s=1)
    result: dict[str, Any] = {}

    def watch() -> None:
        try:
            result["rows"] = watcher.run(until=all_terminated(min_pods=PODS), timeout_s=150)
        except BaseException as err:  # re-raised below
            result["error"] = err

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    half = PODS // 2
    batch.create_namespaced_job(ns, _job("first", "rg-compact", half, parallelism=half))
    wait_until(lambda: (batch.read_namespaced_job("first", ns).status.succeeded or 0) == half, timeout_s=90,
               what="the first Job's pods Succeeded")
    compactions = []
    for i in range(25):  # ~3 s of the run group's quiet: the watcher resumes from a version compacted meanwhile
        core.create_namespaced_config_map(ns, {"metadata": {"name": f"churn-{i}"}})  # a newer revision
        revision = int(_etcd(etcd, "/v3/kv/range", {"key": "AA=="}, pki)["header"]["revision"])
        _etcd(etcd, "/v3/kv/compaction", {"revision": str(revision), "physical": True}, pki)
        compactions.append(revision)
        time.sleep(0.1)
    expired_before_second = watcher.stats["expired"]
    batch.create_namespaced_job(ns, _job("second", "rg-compact", half, parallelism=half))
    thread.join(160)
    if "error" in result:
        raise result["error"]
    rows = result["rows"]
    assert watcher.stopped_by == "condition", (watcher.stopped_by, watcher.warnings, watcher.stats)
    assert expired_before_second >= 1, (compactions, watcher.stats)  # a resumed watch met a compacted revision: 410
    assert watcher.stats["relists"] >= watcher.stats["expired"] >= 1, watcher.stats  # each 410 answered by a re-list
    real = {p.metadata.name: p
            for p in core.list_namespaced_pod(ns, label_selector="llmpack.io/run-group=rg-compact").items}
    assert len(real) == PODS
    assert sorted(r["pod"] for r in rows) == sorted(real), rows  # every pod of both Jobs, once
    for row in rows:
        assert row["phase"] == real[row["pod"]].status.phase == "Succeeded", row
        assert row["node"] == real[row["pod"]].spec.node_name, row
        assert not row.get("deleted"), row
