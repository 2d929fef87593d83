"""tools/cluster/nodes.py (no Go needed): the node groups become kwok-managed GPU nodes, and a bad file is one line, exit 2."""

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
    return subprocess.run([sys.executable, str(NODES_PY), "--print", str(path)], capture_output=True, text=True, timeout=60)


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
