"""TLS and credentials against stand-ins that serve https with a self-signed certificate on 127.0.0.1.

Verification is on by default on every path (KFP's ``kfp.Client``, Hera's ``WorkflowsService``,
the ``kubernetes`` client): an untrusted certificate is one line naming ``--ca-cert`` and
``--insecure-skip-tls-verify``; ``--ca-cert`` trusts the server's CA; skipping the check is
possible only by name and says so. A kubeconfig whose user is an exec credential plugin (how EKS,
GKE, AKS and OIDC logins work) is followed as kubectl follows it, and its token is never printed.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import yaml
from standins.argo_server import ArgoServerStandIn
from standins.k8s_api import KubeAPIStandIn
from standins.kfp_api import KFPAPIStandIn
from standins.loopback import CLIENT_ENV, isolate
from standins.tls import self_signed, server_tls

from argo_workflows import submit as argo_submit
from components.errors import InputError
from components.servers.remote import tls_verify
from kfp_pipelines import submit as kfp_submit
from mlflow_projects import submit as mlflow_submit
from tests.conftest import llmpack

KFP_TOKEN = "kfp-tls-token-Zx81Qw"
ARGO_TOKEN = "argo-tls-token-Pq27Lm"
EXEC_TOKEN = "exec-plugin-token-Hh51Vr"
# The clients' variables, and the CA bundles a shell may point requests and ssl at.
ENV = (*CLIENT_ENV, "ARGO_INSECURE_SKIP_VERIFY", "KUBERNETES_SERVICE_PORT", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
       "SSL_CERT_FILE")


@pytest.fixture(autouse=True)
def isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    isolate(monkeypatch, tmp_path, ENV)


@pytest.fixture(scope="module")
def cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (its own CA), and its key."""
    return self_signed(tmp_path_factory.mktemp("tls"))


@pytest.fixture()
def kfp_api(cert: tuple[Path, Path]):
    api = KFPAPIStandIn(token=KFP_TOKEN)
    api.tls = server_tls(cert)
    with api:
        yield api


@pytest.fixture()
def argo_api(cert: tuple[Path, Path]):
    api = ArgoServerStandIn(token=ARGO_TOKEN)
    api.tls = server_tls(cert)
    with api:
        yield api


@pytest.fixture()
def kube(cert: tuple[Path, Path]):
    api = KubeAPIStandIn(token=EXEC_TOKEN, namespaces=("default", "llmpack"))
    api.tls = server_tls(cert)
    with api:
        yield api


def test_tls_verify_is_on_unless_skipped_by_name(cert: tuple[Path, Path]) -> None:
    assert tls_verify() is True
    assert tls_verify(str(cert[0])) == str(cert[0])
    assert tls_verify(insecure_skip_tls_verify=True) is False
    with pytest.raises(InputError, match="give one or the other"):
        tls_verify(str(cert[0]), True)
    with pytest.raises(InputError, match="--ca-cert /nonexistent/ca.pem: no such file"):
        tls_verify("/nonexistent/ca.pem")


def test_kfp_untrusted_certificate_is_one_line_and_ca_cert_trusts_it(kfp_api: KFPAPIStandIn,
                                                                     cert: tuple[Path, Path]) -> None:
    assert kfp_api.url.startswith("https://")
    with pytest.raises(InputError) as err:
        kfp_submit.submit(kfp_submit.Request(host=kfp_api.url, token=KFP_TOKEN, params={"max_steps": 2}))
    msg = str(err.value)
    assert "TLS certificate not trusted" in msg and "--ca-cert" in msg and "--insecure-skip-tls-verify" in msg, msg
    assert "\n" not in msg and KFP_TOKEN not in msg
    assert not kfp_api.recorded("POST")  # nothing was created
    summary = kfp_submit.submit(kfp_submit.Request(host=kfp_api.url, token=KFP_TOKEN, params={"max_steps": 2},
                                                   ca_cert=str(cert[0])))
    assert len(kfp_api.recorded("POST", "/apis/v2beta1/runs")) == 1
    done = kfp_submit.wait_for_completion(summary, token=KFP_TOKEN, ca_cert=str(cert[0]), poll_s=0.01, timeout_s=5)
    assert done["status"] == "succeeded"


def test_argo_untrusted_certificate_is_one_line_and_ca_cert_trusts_it(argo_api: ArgoServerStandIn,
                                                                      cert: tuple[Path, Path]) -> None:
    with pytest.raises(InputError) as err:
        argo_submit.submit(argo_submit.Request(host=argo_api.url, token=ARGO_TOKEN, params={"max_steps": 2}))
    msg = str(err.value)
    assert "TLS certificate not trusted" in msg and "--ca-cert" in msg and ARGO_TOKEN not in msg, msg
    assert not argo_api.recorded("POST")
    summary = argo_submit.submit(argo_submit.Request(host=argo_api.url, token=ARGO_TOKEN, params={"max_steps": 2},
                                                     ca_cert=str(cert[0])))
    assert summary["workflow_name"]
    skipped = argo_submit.submit(argo_submit.Request(host=argo_api.url, token=ARGO_TOKEN, params={"max_steps": 2},
                                 insecure_skip_tls_verify=True))
    assert skipped["workflow_name"] != summary["workflow_name"]


@pytest.mark.parametrize("flags, code, expect", [
    ((), 2, "TLS certificate not trusted"),
    (("--ca-cert", "{ca}"), 0, "kfp: submitted"),
    (("--insecure-skip-tls-verify",), 0, "certificate is not checked"),
    (("--ca-cert", "{ca}", "--insecure-skip-tls-verify"), 2, "give one or the other"),
], ids=["default-verifies", "ca-cert", "insecure", "both"])
def test_cli_submit_kfp_tls_flags(kfp_api: KFPAPIStandIn, cert: tuple[Path, Path], tmp_path: Path,
                                  flags: tuple[str, ...], code: int, expect: str) -> None:
    args = [f.format(ca=cert[0]) for f in flags]
    r = llmpack("cluster", "submit", "kfp", "--host", kfp_api.url, *args, cwd=tmp_path, env={**os.environ,
                "KFP_TOKEN": KFP_TOKEN})
    out = r.stdout + r.stderr
    assert r.returncode == code, out
    assert expect in out and "Traceback" not in out and KFP_TOKEN not in out
    assert "Warning" not in r.stderr, r.stderr  # the libraries' own TLS warnings stay off the terminal
    if code == 2:
        assert len([line for line in r.stderr.splitlines() if line.strip()]) == 1, r.stderr
        assert not kfp_api.recorded("POST", "/apis/v2beta1/runs")


def exec_kubeconfig(path: Path, server: str, ca: Path | None, plugin_log: Path) -> str:
    """A kubeconfig whose user is an exec credential plugin (client.authentication.k8s.io/v1)."""
    plugin = path.with_name("credential-plugin.py")
    plugin.write_text(
        "import json, pathlib, sys\n"
        f"pathlib.Path({str(plugin_log)!r}).open('a').write('called\\n')\n"
        "print(json.dumps({'apiVersion': 'client.authentication.k8s.io/v1', 'kind': 'ExecCredential',\n"
        f"                  'status': {{'token': {EXEC_TOKEN!r}}}}}))\n"
    )
    cluster = {"server": server, **({"certificate-authority": str(ca)} if ca else {})}
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "standin", "cluster": cluster}],
        "users": [{"name": "sso", "user": {"exec": {"apiVersion": "client.authentication.k8s.io/v1",
                                                     "command": sys.executable, "args": [str(plugin)],
                                                     "interactiveMode": "Never"}}}],
        "contexts": [{"name": "standin", "context": {"cluster": "standin", "user": "sso", "namespace": "llmpack"}}],
        "current-context": "standin",
    }))
    return str(path)


def test_exec_credential_plugin_and_kubeconfig_ca(kube: KubeAPIStandIn, cert: tuple[Path, Path],
                                                  fresh_tracking_uri: str, tmp_path: Path) -> None:
    tracking_uri = fresh_tracking_uri
    calls = tmp_path / "plugin-calls"
    trusted = exec_kubeconfig(tmp_path / "kubeconfig", kube.url, cert[0], calls)
    summary = mlflow_submit.submit(mlflow_submit.Request(kubeconfig=trusted, tracking_uri=tracking_uri))
    assert calls.read_text().count("called") >= 1  # the plugin gave the token
    job = kube.jobs[("llmpack", summary["job_name"])]
    assert EXEC_TOKEN not in json.dumps(summary, default=str) and EXEC_TOKEN not in json.dumps(job)
    # The same kubeconfig without its certificate-authority: one line, no token, nothing created.
    untrusted = exec_kubeconfig(tmp_path / "kubeconfig-no-ca", kube.url, None, calls)
    before = len(kube.jobs)
    with pytest.raises(InputError) as err:
        mlflow_submit.submit(mlflow_submit.Request(kubeconfig=untrusted, tracking_uri=tracking_uri))
    assert "TLS certificate not trusted" in str(err.value) and EXEC_TOKEN not in str(err.value), err.value
    assert len(kube.jobs) == before
    # --ca-cert supplies what the kubeconfig lacks, as kubectl's --certificate-authority does.
    again = mlflow_submit.submit(mlflow_submit.Request(kubeconfig=untrusted, tracking_uri=tracking_uri,
                                                       ca_cert=str(cert[0])))
    assert ("llmpack", again["job_name"]) in kube.jobs
