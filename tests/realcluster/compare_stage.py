"""A started control plane made ready for ``llmpack cluster compare`` with pods that run code: by a test, or by hand.

:func:`stage` sets up namespace ``llmpack`` as docs/first-run-on-a-cluster.md does (the tracking
Secret, the artifacts claim bound, the emissary ``executor`` Role and its token Secret, a loopback
``artifactory`` repository, a ServiceAccount ``submitter`` bound to ``admin`` whose token the Argo
Server takes), cordons kwok's nodes (their pods run nothing) and starts the process kubelet in
container mode (root only): one H100 of a p5.48xlarge and an m6i.4xlarge, each pod started
``delay_ms`` + uniform(0, ``jitter_ms``) after it is bound (kwok's pod stage delay, played here).

By hand, on a control plane started with ``LLMPACK_CLUSTER_CONTROLLERS=argo,argo-server``:
``LLMPACK_CLUSTER_DIR=build/cluster python -m tests.realcluster.compare_stage`` prints the
``llmpack cluster compare`` line to run in another shell and keeps the process nodes up until
Ctrl-C. docs/internals/real-cluster.md, "compare on the real controllers".
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.conftest import REPO
from tests.realcluster.apiserver import make_namespace
from tests.realcluster.process_kubelet import ProcessKubelet, ProcessNode
from tests.realcluster.test_argo_pipeline_real import grant_executor
from tests.realcluster.test_argo_real import EXECUTOR_IMAGE, _argo_bin, use_repository

NS = "llmpack"  # the compiled artifacts' namespace
LLMPACK_IMAGE = "ghcr.io/llmpack/llmpack"  # every step's image: a folder whose opt/llmpack is this checkout
GPU_NODE, CPU_NODE = "proc-h100-0", "proc-cpu-0"


@contextmanager
def stage(api: Any, state_dir: Path, *, delay_ms: int, jitter_ms: int, seed: int = 51) -> Iterator[dict[str, Any]]:
    """The namespace staged and the process nodes up: ``kubelet``, ``uri`` (the sqlite tracking store every pod
    and the client share), ``root`` (the folders, under /var/tmp), ``repo``, ``token`` (the submitter's),
    ``env`` (the pods' and the client's), ``argo_host``. Removed at the end but the API objects."""
    from kubernetes import client

    core = client.CoreV1Api(api)
    for node in core.list_node().items:  # kwok's pods run nothing: none of the comparison's may land there
        core.patch_node(node.metadata.name, {"spec": {"unschedulable": True}})
    make_namespace(api, NS)
    grant_executor(api, NS)
    repo = use_repository(api, NS)
    root = Path(tempfile.mkdtemp(prefix="llmpack-compare-real-", dir="/var/tmp"))  # not /tmp: each pod has its own
    try:
        (root / "argoexec" / "bin").mkdir(parents=True)
        shutil.copy(_argo_bin() / "argoexec", root / "argoexec" / "bin" / "argoexec")
        (root / "llmpack" / "opt").mkdir(parents=True)
        # the Dockerfile's WORKDIR /opt/llmpack: the MLflow Job's workingDir /opt/llmpack/mlflow_projects/finetune-k8s
        (root / "llmpack" / "opt" / "llmpack").symlink_to(REPO)
        for folder in ("home", "store", "report"):
            (root / folder).mkdir()
        uri = f"sqlite:///{root / 'store' / 'mlflow.db'}"
        core.create_namespaced_secret(NS, {"metadata": {"name": "llmpack-mlflow"},
                                           "stringData": {"tracking-uri": uri}})
        core.create_persistent_volume({"metadata": {"name": "compare-artifacts"},
                                       "spec": {"capacity": {"storage": "50Gi"}, "accessModes": ["ReadWriteOnce"],
                                                "storageClassName": "", "nfs": {"server": "127.0.0.1", "path": "/a"}}})
        core.create_namespaced_persistent_volume_claim(NS, {"metadata": {"name": "llmpack-artifacts"}, "spec": {
            "accessModes": ["ReadWriteOnce"], "storageClassName": "",
            "resources": {"requests": {"storage": "1Gi"}}}})
        core.create_namespaced_service_account(NS, {"metadata": {"name": "submitter"}})
        client.RbacAuthorizationV1Api(api).create_namespaced_role_binding(NS, {
            "metadata": {"name": "submitter-admin"},  # admin aggregates Argo's argo-aggregate-to-admin
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "admin"},
            "subjects": [{"kind": "ServiceAccount", "name": "submitter", "namespace": NS}]})
        token = core.create_namespaced_service_account_token("submitter", NS, {"spec": {"expirationSeconds": 7200}})
        env = {"PATH": os.pathsep.join([str(Path(sys.executable).parent), "/usr/bin", "/bin"]), "LANG": "C.UTF-8",
               "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "HOME": str(root / "home"),
               "LLMPACK_SIGNING_KEY_FILE": str(root / "signing.key")}  # one key for the client and every pod
        gpu = ProcessNode(name=GPU_NODE, cpu="16", memory="128Gi", gpus=1,
                          labels={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "1",
                                  "node.kubernetes.io/instance-type": "p5.48xlarge"},
                          taints=({"key": "nvidia.com/gpu", "effect": "NoSchedule"},))
        cpu = ProcessNode(name=CPU_NODE, cpu="16", memory="64Gi",
                          labels={"node.kubernetes.io/instance-type": "m6i.4xlarge"})
        with ProcessKubelet(api, [gpu, cpu], root=root / "kubelet", containers=True, base_env=env, deadline_s=600,
                            pod_delay_ms=delay_ms, pod_jitter_ms=jitter_ms, seed=seed,
                            images={EXECUTOR_IMAGE: root / "argoexec", LLMPACK_IMAGE: root / "llmpack"}) as kubelet:
            yield {"kubelet": kubelet, "uri": uri, "root": root, "repo": repo, "token": token.status.token,
                   "env": env, "argo_host": (state_dir / "argo-server-url").read_text().strip()}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def command(staged: dict[str, Any], kubeconfig: Path, *, repeats: int, max_steps: int = 2) -> list[str]:
    """The ``llmpack cluster compare`` line for argo vs mlflow on the staged namespace (argo the baseline)."""
    root: Path = staged["root"]
    return [sys.executable, "-m", "llmpack", "cluster", "compare", "--backends", "argo,mlflow",
            "--repeats", str(repeats), "--max-steps", str(max_steps), "--baseline", "argo",
            "--argo-host", staged["argo_host"], "--namespace", NS, "--kubeconfig", str(kubeconfig),
            "--tracking-uri", staged["uri"], "--poll", "1", "--timeout", "900",
            "--output-dir", str(root / "runs"), "--report", str(root / "report" / "out")]


def main() -> None:
    import signal

    import kubernetes

    state = Path(os.environ.get("LLMPACK_CLUSTER_DIR") or REPO / "build" / "cluster")
    kubeconfig = state / "kubeconfig"
    if not (state / "argo-server-url").is_file():
        sys.exit(f"{state}: no argo-server-url: start the control plane with "
                 "LLMPACK_CLUSTER_CONTROLLERS=argo,argo-server (tools/cluster/up.sh)")
    api = kubernetes.config.new_client_from_config(config_file=str(kubeconfig))
    delay, jitter = int(os.environ.get("LLMPACK_KWOK_POD_DELAY_MS", "3000")), int(
        os.environ.get("LLMPACK_KWOK_POD_JITTER_MS", "2000"))
    with stage(api, state, delay_ms=delay, jitter_ms=jitter) as staged:
        env = {**staged["env"], "KUBECONFIG": str(kubeconfig)}
        token_file = staged["root"] / "argo-token"  # the submitter's token: a file, never printed
        token_file.write_text(staged["token"])
        token_file.chmod(0o600)
        print("# in another shell; Ctrl-C here stops the process nodes", flush=True)
        print(" ".join(f"{k}={shlex.quote(v)}" for k, v in env.items()),
              f"ARGO_TOKEN=$(cat {token_file})",
              shlex.join(command(staged, kubeconfig, repeats=int(os.environ.get("REPEATS", "2")))), flush=True)
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
