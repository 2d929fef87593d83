"""The real control plane (``tools/cluster/up.sh``) as a session fixture, and the client calls its tests share.

Every test here is marked ``cluster`` (``make test-cluster``; ``make test`` leaves them out: they
need the Go-built binaries). A session without the binaries skips them, naming ``make
cluster-build``; ``LLMPACK_CLUSTER_BUILD=1`` builds them first instead (tens of minutes cold).
The fixture starts the control plane with the same script a user runs, in a state directory of
its own (so a cluster the user keeps up is not touched), and stops it at the end of the session.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO

TOOLS = REPO / "tools" / "cluster"


@dataclass(frozen=True, kw_only=True)
class RealCluster:
    """A started control plane: its kubeconfig (admin, system:masters), a client on it, its bin folder."""

    kubeconfig: Path
    state_dir: Path
    bin_dir: Path
    api: Any  # kubernetes.client.ApiClient

    def kubectl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """The kubectl built from the pinned kubernetes module, on this cluster."""
        return subprocess.run([str(self.bin_dir / "kubectl"), "--kubeconfig", str(self.kubeconfig), *args],
                              capture_output=True, text=True, timeout=120, check=check)


def _go() -> str | None:
    return shutil.which("go") or ("/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").is_file() else None)


def _bin_dir() -> Path:
    """The built binaries' folder, or a skip naming how to build them."""
    go = _go()
    if go is None:
        pytest.skip("real control plane: no Go toolchain (needs go 1.26 to build it: make cluster-build)")
    env = {**os.environ, "GO": go}
    mode = [] if os.environ.get("LLMPACK_CLUSTER_BUILD") == "1" else ["--cached"]
    done = subprocess.run([str(TOOLS / "build.sh"), *mode], capture_output=True, text=True, env=env, timeout=7200)
    if done.returncode != 0:
        pytest.skip(f"real control plane not built: {done.stderr.strip().splitlines()[-1]}")
    return Path(done.stdout.strip())


@contextmanager
def started_cluster(state: Path, *, settings: dict[str, str] | None = None,
                    unset: tuple[str, ...] = ()) -> Iterator[RealCluster]:
    """A control plane started by up.sh in ``state`` with ``settings`` (LLMPACK_CLUSTER_*) and ``unset``
    left out of the environment (besides LLMPACK_CLUSTER_NODES: always the default node set), torn down after."""
    import kubernetes

    bin_dir = _bin_dir()
    env = {**os.environ, "LLMPACK_CLUSTER_DIR": str(state), "GO": _go() or "go", **(settings or {})}
    for name in ("LLMPACK_CLUSTER_NODES", *unset):
        env.pop(name, None)
    up = subprocess.run([str(TOOLS / "up.sh")], capture_output=True, text=True, env=env, timeout=300)
    try:
        assert up.returncode == 0, f"up.sh failed ({up.returncode}): {up.stderr[-3000:]}"
        kubeconfig = state / "kubeconfig"
        api = kubernetes.config.new_client_from_config(config_file=str(kubeconfig))
        yield RealCluster(kubeconfig=kubeconfig, state_dir=state, bin_dir=bin_dir, api=api)
    finally:
        subprocess.run([str(TOOLS / "down.sh")], capture_output=True, text=True, env=env, timeout=120)


@pytest.fixture(scope="session")
def real_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealCluster]:
    """etcd, kube-apiserver, controller-manager, scheduler and kwok with tools/cluster/nodes.json's GPU nodes."""
    with started_cluster(tmp_path_factory.mktemp("realcluster") / "state") as cluster:
        yield cluster
