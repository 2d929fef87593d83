"""tools/cluster/nodes.py (no Go needed): the node groups become kwok-managed GPU nodes, and a bad file is one
line, exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

NODES_PY = REPO / "tools" / "cluster" / "nodes.py"


def _print(groups: object, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "nodes.json"
    path.write_text(json.dumps(groups))
    return subprocess.run([sys.executable, str(NODES_PY), "--print", str(path)], capture_output=True, text=True,
                          timeout=60)


def test_the_default_groups_are_gpu_nodes_kwok_manages(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(NODES_PY), "--print", str(NODES_PY.with_name("nodes.json"))],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    nodes = {n["metadata"]["name"]: n for n in json.loads(done.stdout)}
    assert sorted(nodes) == ["cpu-0", "cpu-1", "h100-0", "h100-1"]
    h100 = nodes["h100-0"]
    assert h100["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"  # up.sh starts kwok with this selector
    assert h100["status"]["allocatable"]["nvidia.com/gpu"] == "8" and h100["status"]["capacity"]["cpu"] == "192"
    assert h100["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert h100["spec"]["taints"] == [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]
    assert "nvidia.com/gpu" not in nodes["cpu-0"]["status"]["allocatable"] and "taints" not in nodes["cpu-0"]["spec"]


@pytest.mark.parametrize(("groups", "line"), [
    ({"groups": []}, 'expected {"groups": [...]} with at least one group'),
    ({"groups": [{"name": "Big", "count": 1}]}, "group name 'Big': not a DNS label"),
    ({"groups": [{"name": "g", "count": -1}]}, "group 'g': count -1 is not an integer"),
    ({"groups": [{"name": "g", "count": 1, "cpu": "lots"}]}, "group 'g': cpu 'lots' is not a Kubernetes quantity"),
    ({"groups": [{"name": "g", "count": 1, "gpu": 8}]}, "group 'g': unknown key(s) ['gpu']"),
    ({"groups": [{"name": "g", "count": 1, "taints": [{"key": "k", "effect": "Never"}]}]}, "group 'g': taint"),
    ({"groups": [{"name": "g", "count": 1, "labels": {"a b": "c"}}]}, "group 'g': label key 'a b'"),
])
def test_a_bad_group_file_is_one_line_and_exit_2(tmp_path: Path, groups: object, line: str) -> None:
    done = _print(groups, tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    (only,) = done.stderr.strip().splitlines()
    assert only.startswith("cluster-up: ") and line in only, only


def test_controllers_run_under_their_own_role_and_serve_webhooks_by_url() -> None:
    """controllers.py: the release's ClusterRole renamed and bound to the controller's certificate user; each
    webhook's in-cluster Service replaced by a loopback URL with the cluster CA, its rules kept."""
    sys.path.insert(0, str(REPO / "tools" / "cluster"))
    try:
        from controllers import rewrite  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "manager-role"},
            "rules": [{"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create"]}]}
    hooks = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
             "metadata": {"name": "validating-webhook-configuration"},
             "webhooks": [{"name": "vjobset.kb.io", "failurePolicy": "Fail", "rules": [{"resources": ["jobsets"]}],
                           "clientConfig": {"service": {"name": "webhook-service", "namespace": "system",
                                                        "path": "/validate-jobset"}}}]}
    out = rewrite([role, hooks], "jobset", 9443, b"PEM")
    assert [(o["kind"], o["metadata"]["name"]) for o in out] == [
        ("ClusterRole", "llmpack-jobset-controller"), ("ClusterRoleBinding", "llmpack-jobset-controller"),
        ("ValidatingWebhookConfiguration", "llmpack-jobset-validating-webhook-configuration")]
    assert out[0]["rules"] == role["rules"]
    assert out[1]["subjects"] == [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                                   "name": "llmpack-jobset-controller"}]
    (hook,) = out[2]["webhooks"]
    assert hook["clientConfig"] == {"url": "https://127.0.0.1:9443/validate-jobset", "caBundle": "UEVN"}
    assert hook["rules"] == [{"resources": ["jobsets"]}] and hook["failurePolicy"] == "Fail"


@pytest.mark.parametrize("controllers", ["trainer", "kueue", "jobset;rm"])
def test_up_refuses_an_unknown_controller_set_before_starting_anything(tmp_path: Path, controllers: str) -> None:
    """LLMPACK_CLUSTER_CONTROLLERS outside none/jobset/jobset,trainer: one line, exit 2, no state directory."""
    state = tmp_path / "state"
    done = subprocess.run([str(REPO / "tools" / "cluster" / "up.sh")], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "LLMPACK_CLUSTER_DIR": str(state),
                               "LLMPACK_CLUSTER_CONTROLLERS": controllers})
    assert done.returncode == 2 and done.stdout == ""
    (only,) = done.stderr.strip().splitlines()
    assert only.startswith(f"cluster-up: LLMPACK_CLUSTER_CONTROLLERS '{controllers}'"), only
    assert not state.exists()
