"""Security of every manifest the pack compiles or submits.

Scanned: the committed compiled artifacts and what ``llmpack submit`` actually sent, as captured by
the stand-in servers. Every pod spec must run as non-root, without privilege escalation, with all
capabilities dropped and unprivileged; no hostPath volume and no host namespaces; secrets only by
reference; and no literal token, password, bearer string, key or credential anywhere. What a
format cannot express is asserted below, so a change in the format shows up here; each format's
limits: docs/internals/pod-security.md.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from standins.argo_server import ArgoServerStandIn
from standins.k8s_api import KubeAPIStandIn
from standins.kfp_api import KFPAPIStandIn

from argo_workflows import submit as argo_submit
from kfp_pipelines import submit as kfp_submit
from mlflow_projects import submit as mlflow_submit

REPO = Path(__file__).resolve().parents[2]
KFP_YAML = REPO / "kfp_pipelines" / "finetune.yaml"
ARGO_YAML = REPO / "argo_workflows" / "finetune.yaml"
JOB_TEMPLATE = REPO / "mlflow_projects" / "finetune-k8s" / "kubernetes_job_template.yaml"
TOKENS = {"kfp": "kfp-Sec-Token-4711", "argo": "argo-Sec-Token-4712", "k8s": "k8s-Sec-Token-4713"}

# --------------------------------------------------------------------------- credential scan

SECRET_WORDS = {"token", "password", "passwd", "pwd", "secret", "apikey", "credential", "credentials", "auth"}
SECRET_PAIRS = {("api", "key"), ("access", "key"), ("secret", "key"), ("private", "key"), ("client", "secret")}
# Keys that name a secret or a key inside one (references), never hold one.
REFERENCE_KEYS = {"secretKey", "secretName", "secretKeyRef", "secretRef", "secretAsEnv", "secretAsVolume",
                  "secretNameParameter", "automountServiceAccountToken", "serviceAccountTokenProjection"}
KEY_VALUE = re.compile(r"(?P<key>[A-Za-z0-9_.-]+)[\"']?[ \t]*[:=][ \t]*[\"']?(?P<value>[^\s\"',{}\[\]]{6,})")


def secretish_key(key: str) -> bool:
    """``HF_TOKEN``, ``apiKey``, ``--password``, ``client_secret``: yes; ``tokenize``, ``tokens``: no."""
    parts = [p.lower() for p in re.split(r"[_.\-]+|(?<=[a-z0-9])(?=[A-Z])", key) if p]
    return (bool(SECRET_WORDS.intersection(parts))
            or any(pair in SECRET_PAIRS for pair in zip(parts, parts[1:], strict=False)))


CREDENTIAL_PATTERNS: dict[str, re.Pattern[str]] = {
    "bearer string": re.compile(r"(?i)\bbearer\s+[a-z0-9\-._~+/]{8,}=*"),
    "AWS access key id": re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"),
    "AWS secret access key": re.compile(r"(?i)aws_secret_access_key\s*[:=]"),
    "JWT": re.compile(r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\."),
    "private key": re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
    "GitHub token": re.compile(r"\bgh[pousr]_[A-Za-z0-9]{30,}"),
    "password in a URL": re.compile(r"[a-z][a-z0-9+.-]*://[^/\s:@\"']+:[^/\s@\"']+@"),
}
SECRET_ENV_NAME = re.compile(r"(?i)(token|password|passwd|secret|api_?key|access_?key|credential)")


def credential_findings(text: str) -> list[str]:
    found = [f"{name}: {m.group(0)[:40]!r}" for name, rx in CREDENTIAL_PATTERNS.items() for m in rx.finditer(text)]
    for m in KEY_VALUE.finditer(text):
        key, value = m.group("key"), m.group("value")
        if secretish_key(key) and key.lstrip("-") not in REFERENCE_KEYS and not value.startswith("{{"):
            found.append(f"secret-looking key with a literal value: {m.group(0)[:40]!r}")
    return found


def as_text(obj: Any) -> str:
    """Scan both renderings: YAML (as committed) and JSON (as sent on the wire)."""
    return yaml.safe_dump(obj, sort_keys=False, width=10_000) + "\n" + json.dumps(obj)


# --------------------------------------------------------------------------- Kubernetes pod specs


def walk(obj: Any, path: str = "") -> Iterator[tuple[str, Any, Any]]:
    """(path, key, value) for every mapping entry, recursively."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield f"{path}.{key}", key, value
            yield from walk(value, f"{path}.{key}")
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            yield from walk(value, f"{path}[{i}]")


def host_access_problems(where: str, obj: Any) -> list[str]:
    problems = []
    for path, key, value in walk(obj):
        if key == "hostPath":
            problems.append(f"{where}{path}: hostPath volume")
        if key in ("hostNetwork", "hostPID", "hostIPC") and value is True:
            problems.append(f"{where}{path}: host namespace")
        if key == "privileged" and value is True:
            problems.append(f"{where}{path}: privileged")
    return problems


def env_problems(where: str, env: list[dict[str, Any]] | None) -> list[str]:
    problems = []
    for entry in env or []:
        source = entry.get("valueFrom") or {}
        if "value" in entry and SECRET_ENV_NAME.search(entry["name"]):
            problems.append(f"{where}: env {entry['name']} is a literal value; use valueFrom.secretKeyRef")
        if SECRET_ENV_NAME.search(entry["name"]) and source and "secretKeyRef" not in source:
            problems.append(f"{where}: env {entry['name']} comes from {sorted(source)}, not a secretKeyRef")
    return problems


def container_problems(where: str, container: dict[str, Any], pod_sc: dict[str, Any]) -> list[str]:
    sc = container.get("securityContext") or {}
    problems = []
    non_root = sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot"))
    user = sc.get("runAsUser", pod_sc.get("runAsUser"))
    if non_root is not True:
        problems.append(f"{where}: runAsNonRoot is not true")
    if user is None or int(user) == 0:
        problems.append(f"{where}: runAsUser is {user!r}")
    if sc.get("allowPrivilegeEscalation") is not False:
        problems.append(f"{where}: allowPrivilegeEscalation is not false")
    if "ALL" not in ((sc.get("capabilities") or {}).get("drop") or []):
        problems.append(f"{where}: capabilities.drop lacks ALL")
    if (sc.get("capabilities") or {}).get("add"):
        problems.append(f"{where}: capabilities.add {sc['capabilities']['add']}")
    if sc.get("privileged") is True:
        problems.append(f"{where}: privileged")
    return problems + env_problems(where, container.get("env"))


def pod_spec_problems(where: str, pod: dict[str, Any]) -> list[str]:
    pod_sc = pod.get("securityContext") or {}
    problems = []
    if pod_sc.get("runAsNonRoot") is not True:
        problems.append(f"{where}: pod securityContext.runAsNonRoot is not true")
    containers = [*(pod.get("initContainers") or []), *(pod.get("containers") or [])]
    if not containers:
        problems.append(f"{where}: no containers")
    for c in containers:
        problems += container_problems(f"{where} container {c.get('name')!r}", c, pod_sc)
    return problems + host_access_problems(where, pod)


def job_problems(job: dict[str, Any]) -> list[str]:
    pod = job["spec"]["template"]["spec"]
    problems = pod_spec_problems("Job", pod)
    if pod.get("automountServiceAccountToken") is not False:
        problems.append("Job: automountServiceAccountToken is not false (the step needs no API access)")
    return problems


def argo_problems(wf: dict[str, Any]) -> list[str]:
    spec = wf["spec"]
    pod_sc = spec.get("securityContext") or {}
    problems = []
    if pod_sc.get("runAsNonRoot") is not True or not pod_sc.get("runAsUser"):
        problems.append("Workflow: spec.securityContext must set runAsNonRoot and a non-zero runAsUser")
    if "podSpecPatch" in json.dumps(wf):
        problems.append("Workflow: podSpecPatch can override every check here")
    containers = 0
    for tmpl in spec["templates"]:
        for kind in ("container", "script"):
            if kind in tmpl:
                containers += 1
                problems += container_problems(f"template {tmpl['name']!r}", tmpl[kind], pod_sc)
        for c in [*(tmpl.get("initContainers") or []), *(tmpl.get("sidecars") or [])]:
            problems += container_problems(f"template {tmpl['name']!r} {c.get('name')!r}", c, pod_sc)
        if "containerSet" in tmpl or "resource" in tmpl:
            problems.append(f"template {tmpl['name']!r}: unchecked kind")
    if containers == 0:
        problems.append("Workflow: no container templates")
    return problems + host_access_problems("Workflow", wf)


KFP_EXPRESSIBLE_SC = {"runAsUser", "runAsGroup", "runAsNonRoot"}


def kfp_problems(spec: dict[str, Any], platform: dict[str, Any]) -> list[str]:
    problems = []
    executors = spec["deploymentSpec"]["executors"]
    configs = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    for name in executors:
        cfg = configs.get(name)
        if cfg is None:
            problems.append(f"KFP {name}: no kfp-kubernetes config (no security context)")
            continue
        sc = cfg.get("securityContext") or {}
        if set(sc) - KFP_EXPRESSIBLE_SC:
            problems.append(f"KFP {name}: unexpected securityContext keys {sorted(set(sc) - KFP_EXPRESSIBLE_SC)}")
        if sc.get("runAsNonRoot") is not True:
            problems.append(f"KFP {name}: runAsNonRoot is not true")
        if sc.get("runAsUser") is None or int(sc["runAsUser"]) == 0:
            problems.append(f"KFP {name}: runAsUser is {sc.get('runAsUser')!r}")
        for entry in cfg.get("secretAsEnv") or []:
            if not entry.get("secretName") or not entry.get("keyToEnv"):
                problems.append(f"KFP {name}: secretAsEnv without a secret name and key")
        problems += env_problems(f"KFP {name}", executors[name].get("container", {}).get("env"))
    return problems + host_access_problems("KFP", spec) + host_access_problems("KFP platform", platform)


# --------------------------------------------------------------------------- the committed artifacts


def committed() -> dict[str, Any]:
    kfp_spec, kfp_platform = yaml.safe_load_all(KFP_YAML.read_text())
    return {
        "kfp": (kfp_spec, kfp_platform),
        "argo": yaml.safe_load(ARGO_YAML.read_text()),
        "job": yaml.safe_load(JOB_TEMPLATE.read_text()),
    }


def test_committed_kfp_pipeline_is_non_root_and_uses_secret_references() -> None:
    spec, platform = committed()["kfp"]
    assert kfp_problems(spec, platform) == []
    configs = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    assert all(cfg["secretAsEnv"][0]["secretName"] == "llmpack-mlflow" for cfg in configs.values())


def test_kfp_format_expresses_only_the_identity_part_of_a_security_context() -> None:
    """The documented gap: if kfp-kubernetes grows these fields, the compiler should set them."""
    from kfp.kubernetes import kubernetes_executor_config_pb2 as pb

    assert {f.name for f in pb.SecurityContext.DESCRIPTOR.fields} == {"run_as_user", "run_as_group", "run_as_non_root"}
    fields = {f.name for f in pb.KubernetesExecutorConfig.DESCRIPTOR.fields}
    assert not fields & {"privileged", "host_path", "capabilities", "allow_privilege_escalation", "host_network"}


def test_committed_argo_workflow_is_non_root_unprivileged_and_drops_capabilities() -> None:
    assert argo_problems(committed()["argo"]) == []


def test_committed_mlflow_job_template_is_non_root_unprivileged_and_drops_capabilities() -> None:
    job = committed()["job"]
    assert job_problems(job) == []
    env = job["spec"]["template"]["spec"]["containers"][0]["env"]
    refs = [e for e in env if "valueFrom" in e]
    assert refs and all(set(e["valueFrom"]) == {"secretKeyRef"} for e in refs)


@pytest.mark.parametrize("name", ["kfp", "argo", "job"])
def test_committed_artifacts_hold_no_literal_credentials(name: str) -> None:
    path = {"kfp": KFP_YAML, "argo": ARGO_YAML, "job": JOB_TEMPLATE}[name]
    assert credential_findings(path.read_text()) == []
    assert credential_findings(as_text(committed()[name])) == []


def test_the_checks_catch_what_they_look_for() -> None:
    """The scanners are not vacuous: planted problems are found, secret references are not."""
    planted = {
        "env": [{"name": "HF_TOKEN", "value": "hf_abcdefghijklmnopqrstuvwxyz"}],
        "password": "hunter2hunter2",
        "auth": "Authorization: Bearer abcdefgh12345678",
        "aws": "AKIAIOSFODNN7EXAMPLE",
        "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.abc",
        "uri": "https://alice:s3cr3t@mlflow.example.com",
    }
    planted["cmd"] = "python main.py --api-key=0123456789abcdef --param=model=tiny"
    found = " ".join(credential_findings(as_text(planted)))
    assert "--api-key=0123456789" in found
    assert credential_findings("components.steps.tokenize:tokenize\ntokens:\n  artifactType: x\nsecretKey: token") == []
    for name in ("secret-looking key", "bearer", "AWS access key", "JWT", "password in a URL"):
        assert name in found, name
    clean = {"env": [{"name": "MLFLOW_TRACKING_TOKEN",
                      "valueFrom": {"secretKeyRef": {"name": "llmpack-mlflow", "key": "token", "optional": True}}}]}
    assert credential_findings(as_text(clean)) == []
    assert env_problems("x", clean["env"]) == []
    assert env_problems("x", planted["env"])

    bad_job = committed()["job"]
    pod = bad_job["spec"]["template"]["spec"]
    pod["containers"][0]["securityContext"] = {"runAsUser": 0, "privileged": True,
                                               "capabilities": {"add": ["SYS_ADMIN"]}}
    pod["volumes"].append({"name": "docker", "hostPath": {"path": "/var/run/docker.sock"}})
    pod["hostNetwork"] = True
    problems = " | ".join(job_problems(bad_job))
    for needle in ("runAsUser is 0", "allowPrivilegeEscalation", "capabilities.drop lacks ALL", "capabilities.add",
                   "privileged", "hostPath", "host namespace"):
        assert needle in problems, needle


# --------------------------------------------------------------------------- what was submitted


@pytest.fixture(scope="module")
def submitted(tmp_path_factory: pytest.TempPathFactory, tracking_uri: str) -> dict[str, Any]:
    """Submit once on each path to its stand-in; return the manifests the servers received."""
    import kfp

    tmp = tmp_path_factory.mktemp("security")
    mp = pytest.MonkeyPatch()
    for name in ("KFP_HOST", "KFP_TOKEN", "KF_PIPELINES_SA_TOKEN_PATH", "ARGO_SERVER", "ARGO_TOKEN", "ARGO_NAMESPACE",
                 "KUBECONFIG", "KUBE_MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_URI"):
        mp.delenv(name, raising=False)
    mp.setattr(kfp.Client, "_LOCAL_KFP_CONTEXT", str(tmp / "kfp-context.json"))
    try:
        with KFPAPIStandIn(token=TOKENS["kfp"]) as kfp_api, ArgoServerStandIn(token=TOKENS["argo"]) as argo, \
                KubeAPIStandIn(token=TOKENS["k8s"]) as kube:
            params = {"max_steps": 5, "model": "tiny", "data": "builtin", "seed": 1}
            kfp_submit.submit(kfp_submit.Request(host=kfp_api.url, token=TOKENS["kfp"], params=params))
            argo_submit.submit(argo_submit.Request(host=argo.url, token=TOKENS["argo"], params=params))
            kubeconfig = tmp / "kubeconfig"
            kubeconfig.write_text(yaml.safe_dump({
                "apiVersion": "v1", "kind": "Config", "current-context": "c",
                "clusters": [{"name": "s", "cluster": {"server": kube.url}}],
                "users": [{"name": "u", "user": {"token": TOKENS["k8s"]}}],
                "contexts": [{"name": "c", "context": {"cluster": "s", "user": "u"}}],
            }))
            mlflow_submit.submit(mlflow_submit.Request(kubeconfig=str(kubeconfig), tracking_uri=tracking_uri,
                                                       params=params,
                                                       cluster_tracking_uri="http://mlflow.llmpack.svc:5000"))
            return {
                "kfp": kfp_api.recorded("POST", "/apis/v2beta1/runs")[0].body,
                "argo": argo.recorded("POST", "/api/v1/workflows/")[0].body,
                "job": kube.recorded("POST", "/jobs")[0].body,
                "all_bodies": [r.body for r in [*kfp_api.requests, *argo.requests, *kube.requests] if r.body],
                "all_headers": [r.headers for r in [*kfp_api.requests, *argo.requests, *kube.requests]],
            }
    finally:
        mp.undo()


def test_submitted_kfp_run_is_non_root(submitted: dict[str, Any]) -> None:
    body = submitted["kfp"]["pipeline_spec"]
    assert kfp_problems(body["pipeline_spec"], body["platform_spec"]) == []
    assert credential_findings(as_text(submitted["kfp"])) == []


def test_submitted_argo_workflow_is_non_root_unprivileged(submitted: dict[str, Any]) -> None:
    assert argo_problems(submitted["argo"]["workflow"]) == []
    assert credential_findings(as_text(submitted["argo"])) == []


def test_submitted_mlflow_job_is_non_root_unprivileged(submitted: dict[str, Any]) -> None:
    job = submitted["job"]
    assert job_problems(job) == []
    assert credential_findings(as_text(job)) == []
    literal = {e["name"] for e in job["spec"]["template"]["spec"]["containers"][0]["env"] if "value" in e}
    assert {"MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_ID"} <= literal
    assert "MLFLOW_TRACKING_URI" not in literal  # by reference to the Secret, never a literal value


def test_no_client_token_leaks_into_any_submitted_body(submitted: dict[str, Any]) -> None:
    text = json.dumps(submitted["all_bodies"]) + json.dumps(submitted["all_headers"])
    for token in TOKENS.values():
        assert token not in text
