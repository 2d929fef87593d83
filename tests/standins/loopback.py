"""The loopback cluster: the three stand-ins (Kubernetes API, KFP API, Argo Server) on 127.0.0.1 made
one cluster by :class:`standins.fake_cluster.FakeCluster`, with a kubeconfig naming it.

One copy for every test that submits to it (tests/llmpack/cluster/compare/test_compare_cluster.py,
test_fusion_cluster.py, test_gang_cluster.py), so the servers, tokens and connection options are set up the same way
everywhere; :func:`isolate` is the environment those tests run in (no developer's endpoint,
token or kubeconfig reaches the real clients).
"""

from __future__ import annotations

import os
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest
import yaml

from standins.argo_server import ArgoServerStandIn
from standins.fake_cluster import FakeCluster
from standins.k8s_api import KubeAPIStandIn
from standins.kfp_api import KFPAPIStandIn

# What the real clients read beside the LLMPACK_* settings (cleared by tests/conftest.py): endpoints,
# tokens, kubeconfig and tracking store of the developer's shell, and an in-cluster host.
CLIENT_ENV = ("KFP_HOST", "KFP_TOKEN", "KF_PIPELINES_ENDPOINT", "KF_PIPELINES_SA_TOKEN_PATH", "ARGO_SERVER",
              "ARGO_TOKEN", "ARGO_NAMESPACE", "ARGO_SECURE", "ARGO_BASE_HREF", "KUBECONFIG", "KUBE_MLFLOW_TRACKING_URI",
              "MLFLOW_TRACKING_URI", "KUBERNETES_SERVICE_HOST")
NAMESPACES = ("default", "llmpack", "kubeflow")
K8S_TOKEN = "k8s-standin-token-l1"
KFP_TOKEN = "kfp-standin-token-l1"
ARGO_TOKEN = "argo-standin-token-l1"
PARAMS = {"max_steps": 7, "seed": 3}  # the run's pipeline parameters: short, and not the defaults


def isolate(mp: pytest.MonkeyPatch, root: Path, names: tuple[str, ...] = CLIENT_ENV) -> None:
    """No client variable of the shell, ``HOME`` (``~/.kube``, ``~/.config``) and KFP's context file under ``root``."""
    import kfp

    from tests.conftest import SESSION_SIGNING_KEY_FILE, clear_settings

    clear_settings(mp)  # again: a module-scoped fixture runs before conftest's function-scoped one
    # the one key of the session, as conftest sets it: the pods a stand-in plays verify what the test's own steps
    # sealed (a cluster's pods share one key through the tracking Secret), never a key made under the new HOME
    mp.setenv("LLMPACK_SIGNING_KEY_FILE", str(SESSION_SIGNING_KEY_FILE))
    for name in names:
        mp.delenv(name, raising=False)
    mp.setenv("HOME", str(root / "home"))
    mp.setattr(kfp.Client, "_LOCAL_KFP_CONTEXT", str(root / "kfp-context.json"))


def client_env(names: tuple[str, ...] = CLIENT_ENV) -> dict[str, str]:
    """This process's environment without the client variables: for a CLI started in a subprocess."""
    return {k: v for k, v in os.environ.items() if k not in names}


def write_kubeconfig(path: Path, server: str, token: str, namespace: str = "llmpack") -> Path:
    """A kubeconfig whose one context is ``server`` with a bearer ``token``."""
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "standin", "cluster": {"server": server}}],
        "users": [{"name": "runner", "user": {"token": token}}],
        "contexts": [{"name": "standin", "context": {"cluster": "standin", "user": "runner", "namespace": namespace}}],
        "current-context": "standin",
    }))
    return path


class LoopbackCluster:
    """The three stand-ins started, a kubeconfig for them under ``tmp_path``, and the fake cluster playing them.

    ``fake_options`` go to :class:`FakeCluster` (``fail``, ``prepulled``, ``scale_down_s``...).
    """

    k8s_token, kfp_token, argo_token = K8S_TOKEN, KFP_TOKEN, ARGO_TOKEN

    def __init__(self, tmp_path: Path, tracking_uri: str, **fake_options: Any) -> None:
        self.kube = KubeAPIStandIn(token=self.k8s_token, namespaces=NAMESPACES).start()
        self.kfp = KFPAPIStandIn(token=self.kfp_token).start()
        self.argo = ArgoServerStandIn(token=self.argo_token).start()
        self.kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", self.kube.url, self.k8s_token)
        self.tracking_uri = tracking_uri
        self.fake = FakeCluster(self.kube, kfp=self.kfp, argo=self.argo, tracking_uri=tracking_uri,
                                **fake_options).start()

    def connection(self, orchestrator: str) -> dict[str, Any]:
        """``submit.submit``'s connection keywords for one orchestrator."""
        return {"kfp": {"host": self.kfp.url, "token": self.kfp_token},
                "argo": {"host": self.argo.url, "token": self.argo_token, "namespace": "llmpack"},
                "mlflow": {"kubeconfig": str(self.kubeconfig)}}[orchestrator]

    def run(self, orchestrator: str, compiled: Path) -> dict[str, Any]:
        """Submit one compiled variant (``llmpack compile --out compiled``) through the real client, wait for
        its end; the summary."""
        from llmpack.cluster import submit

        artifact = {"kfp": {"package_path": str(compiled / "kfp_pipelines" / "finetune.yaml")},
                    "argo": {"workflow_path": str(compiled / "argo_workflows" / "finetune.yaml")},
                    "mlflow": {"project_dir": str(compiled / "mlflow_projects" / "finetune-k8s")}}[orchestrator]
        summary = submit.submit(orchestrator, params=PARAMS, tracking_uri=self.tracking_uri,
                                **self.connection(orchestrator), **artifact)
        done = submit.wait_for_completion(summary, **self.connection(orchestrator), poll_s=0.02, timeout_s=30)
        assert done["status"] == "succeeded", done
        self.fake.wait_idle()
        return summary

    def pods(self, orchestrator: str, summary: dict[str, Any]) -> list[dict[str, Any]]:
        """The run's pods as the Kubernetes API lists them (KFP: by the run id KFP puts on its pods)."""
        from kubernetes import client

        from llmpack.cluster.k8s.api import build_api_client

        core = client.CoreV1Api(build_api_client(host=self.kube.url, token=self.k8s_token))
        if orchestrator == "kfp":
            ns, selector = "kubeflow", f"pipeline/runid={summary['run_id']}"
        else:
            ns, selector = "llmpack", f"llmpack.io/pipeline-run={summary['pipeline_run']}"
        items = core.list_namespaced_pod(ns, label_selector=selector, _preload_content=False)
        return yaml.safe_load(items.data)["items"]

    def endpoints(self) -> dict[str, dict[str, str]]:
        """``compare_cluster``'s connection keywords: every orchestrator and the Kubernetes API."""
        return {"kfp": {"host": self.kfp.url, "token": self.kfp_token},
                "argo": {"host": self.argo.url, "token": self.argo_token},
                "mlflow": {"kubeconfig": str(self.kubeconfig)}, "k8s": {"host": self.kube.url, "token": self.k8s_token}}

    def options(self, **overrides: Any) -> dict[str, Any]:
        """``cluster.compare_cluster`` keywords for the three paths on this cluster, with ``overrides``."""
        opts: dict[str, Any] = dict(backends="kfp,argo,mlflow", params=PARAMS, **self.endpoints(),
                                    tracking_uri=self.tracking_uri, timeout_s=30, poll_s=0.05)
        opts.update(overrides)
        return opts

    def close(self) -> None:
        self.fake.close()
        for server in (self.kfp, self.argo, self.kube):
            server.close()

    def __enter__(self) -> LoopbackCluster:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
