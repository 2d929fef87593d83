"""Every pod we compile passes Pod Security ``restricted``: KFP, Argo, the MLflow Job, the TrainJob, the
prepull DaemonSet.

:func:`restricted_violations` checks one pod spec against the rules of the Kubernetes Pod Security
Standards ("Restricted", which includes "Baseline") that a spec can break. The pods are read from
the committed compiled artifacts (every golden variant, the TrainJob's), as the cluster would make
them; what the orchestrators add themselves (Argo's executor containers, the KFP backend's own
security fields) is asserted where the installed libraries say it. The rules and each format:
docs/internals/pod-security.md.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from components.errors import InputError
from tests.backends.test_golden import VARIANTS
from tests.conftest import REPO

ALLOWED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected",
                   "secret"}
SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
                "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
                "net.ipv4.tcp_keepalive_probes"}
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
GOOD_SECCOMP = {"RuntimeDefault", "Localhost"}


def restricted_violations(pod: dict[str, Any]) -> list[str]:
    """What in pod spec ``pod`` Pod Security ``restricted`` rejects, one line each ([] when it passes)."""
    out: list[str] = []
    psc = pod.get("securityContext") or {}
    containers = [*(pod.get("initContainers") or []), *(pod.get("containers") or []),
                  *(pod.get("ephemeralContainers") or [])]
    if not pod.get("containers"):
        out.append("no containers")
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(key):
            out.append(f"{key}: true")
    for volume in pod.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if kinds - ALLOWED_VOLUMES:
            out.append(f"volume {volume.get('name')!r}: type {sorted(kinds - ALLOWED_VOLUMES)} not allowed")
    for sysctl in psc.get("sysctls") or []:
        if sysctl.get("name") not in SAFE_SYSCTLS:
            out.append(f"sysctl {sysctl.get('name')}: not a safe sysctl")
    pod_seccomp = (psc.get("seccompProfile") or {}).get("type")
    for where, sc in [("pod", psc), *((f"container {c.get('name')!r}", c.get("securityContext") or {})
                                      for c in containers)]:
        if (sc.get("windowsOptions") or {}).get("hostProcess"):
            out.append(f"{where}: hostProcess")
        if "runAsUser" in sc and int(sc["runAsUser"]) == 0:
            out.append(f"{where}: runAsUser 0")
        if sc.get("runAsNonRoot") is False:
            out.append(f"{where}: runAsNonRoot false")
        seccomp = (sc.get("seccompProfile") or {}).get("type")
        if seccomp is not None and seccomp not in GOOD_SECCOMP:
            out.append(f"{where}: seccompProfile {seccomp}")
        apparmor = (sc.get("appArmorProfile") or {}).get("type")
        if apparmor is not None and apparmor not in GOOD_SECCOMP:
            out.append(f"{where}: appArmorProfile {apparmor}")
        selinux = sc.get("seLinuxOptions") or {}
        if selinux.get("type", "") not in SELINUX_TYPES or selinux.get("user") or selinux.get("role"):
            out.append(f"{where}: seLinuxOptions {selinux}")
    for c in containers:
        where, sc = f"container {c.get('name')!r}", c.get("securityContext") or {}
        if sc.get("privileged"):
            out.append(f"{where}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{where}: allowPrivilegeEscalation is not false")
        if sc.get("runAsNonRoot") is not True and psc.get("runAsNonRoot") is not True:
            out.append(f"{where}: runAsNonRoot is not true (on it or the pod)")
        if (sc.get("seccompProfile") or {}).get("type") is None and pod_seccomp not in GOOD_SECCOMP:
            out.append(f"{where}: no seccompProfile RuntimeDefault/Localhost (on it or the pod)")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            out.append(f"{where}: capabilities.drop lacks ALL")
        if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
            out.append(f"{where}: capabilities.add {caps['add']}")
        if sc.get("procMount", "Default") != "Default":
            out.append(f"{where}: procMount {sc['procMount']}")
        if any(p.get("hostPort") for p in c.get("ports") or []):
            out.append(f"{where}: hostPort")
    return out


# --------------------------------------------------------------------------- the pods of each compiled artifact


def job_pods(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    doc = yaml.safe_load(path.read_text())
    yield f"{doc['kind']} {doc['metadata']['name']}", doc["spec"]["template"]["spec"]


def argo_pods(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    wf = yaml.safe_load(path.read_text())
    spec = wf["spec"]
    for tmpl in spec["templates"]:
        if "container" in tmpl:
            token = tmpl.get("automountServiceAccountToken", spec.get("automountServiceAccountToken"))
            account = tmpl.get("serviceAccountName", spec.get("serviceAccountName"))
            yield f"template {tmpl['name']}", {
                **({"automountServiceAccountToken": token} if token is not None else {}),
                **({"serviceAccountName": account} if account else {}),
                "securityContext": spec.get("securityContext"),
                "containers": [tmpl["container"], *(tmpl.get("sidecars") or [])],
                "initContainers": tmpl.get("initContainers") or [],
                "volumes": [*(tmpl.get("volumes") or []), *(spec.get("volumes") or [])],
            }
        assert not {"script", "resource", "containerSet"} & set(tmpl), f"{tmpl['name']}: a kind this test does not read"


KFP_BACKEND_CONTAINER_DEFAULTS = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                                  "seccompProfile": {"type": "RuntimeDefault"}}


def kfp_pods(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    spec, platform = yaml.safe_load_all(path.read_text())
    configs = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    for name in spec["deploymentSpec"]["executors"]:
        cfg = configs.get(name) or {}
        sc = {k: v for k, v in (cfg.get("securityContext") or {}).items()}
        volumes = [{"name": f"pvc-{i}", "persistentVolumeClaim": {"claimName": m.get("constant") or m.get("pvcName")}}
                   for i, m in enumerate(cfg.get("pvcMount") or [])]
        volumes += [{"name": m["volumeName"], "emptyDir": {k: v for k, v in m.items() if k in ("medium", "sizeLimit")}}
                    for m in cfg.get("emptyDirMounts") or []]
        volumes += [{"name": f"secret-{i}", "secret": {}} for i, _ in enumerate(cfg.get("secretAsVolume") or [])]
        ir = spec["deploymentSpec"]["executors"][name]["container"]
        res = ir.get("resources") or {}
        resources = {"requests": {k: v for k, v in (("cpu", res.get("resourceCpuRequest")),
                                                     ("memory", res.get("resourceMemoryRequest"))) if v},
                     "limits": {k: v for k, v in (("cpu", res.get("resourceCpuLimit")),
                                                   ("memory", res.get("resourceMemoryLimit"))) if v}}
        yield f"executor {name}", {"containers": [{"name": "main", "image": ir["image"], "resources": resources,
                                                   "securityContext": {**sc, **KFP_BACKEND_CONTAINER_DEFAULTS}}],
                                   "volumes": volumes}


def trainjob_pod(obj: dict[str, Any]) -> dict[str, Any]:
    """The torch-distributed runtime's node pod as the TrainJob's ``runtimePatches`` leave it."""
    trainer = obj["spec"]["trainer"]
    pod: dict[str, Any] = {"containers": [{"name": "node", "image": trainer["image"], "command": trainer["command"],
                                           "resources": copy.deepcopy(trainer.get("resourcesPerNode") or {})}]}
    for patch in obj["spec"].get("runtimePatches") or []:
        for job in patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]:
            patched = copy.deepcopy(job["template"]["spec"]["template"].get("spec") or {})
            for container in patched.pop("containers", []):
                (target,) = [c for c in pod["containers"] if c["name"] == container["name"]]
                target.update(container)
            pod.update(patched)
    return pod


def trainjob_pods(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    obj = yaml.safe_load(path.read_text())
    yield f"TrainJob {obj['metadata']['name']} node pod", trainjob_pod(obj)


READERS = {"kfp_pipelines/finetune.yaml": kfp_pods, "argo_workflows/finetune.yaml": argo_pods,
           "mlflow_projects/finetune-k8s/kubernetes_job_template.yaml": job_pods,
           "trainjob/finetune-trainjob.yaml": trainjob_pods}


def golden_pods() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for variant in VARIANTS.values():
        for rel, read in READERS.items():
            path = REPO / variant.out / rel
            if path.is_file():
                found += [(f"{variant.name} {rel}: {where}", pod) for where, pod in read(path)]
    found += [(f"trainjob fixture: {where}", pod)
              for where, pod in trainjob_pods(REPO / "tests" / "fixtures" / "trainer" / "trainjob-2x4.yaml")]
    return found


GOLDEN_PODS = golden_pods()


def test_every_variant_and_path_has_pods_here() -> None:
    """The reading covers what the goldens hold: every path in every variant, the gang's TrainJob too."""
    names = " ".join(name for name, _ in GOLDEN_PODS)
    for variant in VARIANTS:
        for rel in ("kfp_pipelines", "argo_workflows", "mlflow_projects"):
            assert f"{variant} {rel}/" in names, (variant, rel)
    assert "multinode trainjob/finetune-trainjob.yaml" in names
    from components.finetune_pipeline import build
    from components.fusion import fuse

    # a pod per task and the summarizing task's on KFP and on Argo, the MLflow Job, the TrainJob's node pod
    tasks = {name: len(fuse(build(), v.options.get("fuse", "none")).tasks) for name, v in VARIANTS.items()}
    expected = sum(2 * (n + 1) + 1 for n in tasks.values()) + 1 + 1  # + multinode's TrainJob, + the fixture's
    assert len(GOLDEN_PODS) == expected


@pytest.mark.parametrize(("where", "pod"), GOLDEN_PODS, ids=[w for w, _ in GOLDEN_PODS])
def test_compiled_pod_passes_pod_security_restricted(where: str, pod: dict[str, Any]) -> None:
    assert restricted_violations(pod) == []


def hardening_gaps(where: str, pod: dict[str, Any]) -> list[str]:
    """What in pod spec ``pod`` misses llmpack's one hardening beyond Pod Security ``restricted`` ([] when none).

    Every container: CPU and memory requests and limits, a read-only root (not KFP: its IR cannot say it,
    kfp_pipelines/compiler.py); a memory-backed ``/dev/shm`` with a ``sizeLimit``; no service-account token
    but the gang launcher's (``llmpack-launcher``), the TrainJob's node pods by their account (which mounts
    none), KFP's by the run's (its IR cannot say it either).
    """
    out = []
    kfp = where.split(": ")[0].endswith("kfp_pipelines/finetune.yaml") or where.startswith("kfp ")
    for c in [*(pod.get("initContainers") or []), *pod["containers"]]:
        res = c.get("resources") or {}
        for kind in ("requests", "limits"):
            missing = {"cpu", "memory"} - set(res.get(kind) or {})
            if missing:
                out.append(f"container {c.get('name')!r}: no {kind} of {sorted(missing)}")
        if not kfp and (c.get("securityContext") or {}).get("readOnlyRootFilesystem") is not True:
            out.append(f"container {c.get('name')!r}: root filesystem writable")
    for v in pod.get("volumes") or []:
        if (v.get("emptyDir") or {}).get("medium") == "Memory" and not v["emptyDir"].get("sizeLimit"):
            out.append(f"volume {v['name']!r}: memory-backed with no sizeLimit")
    account = pod.get("serviceAccountName")
    if not kfp and account != "llmpack-trainer":
        token = pod.get("automountServiceAccountToken")
        if account == "llmpack-launcher":
            if token is not True:
                out.append("the launcher's pod mounts no token")
        elif token is not False:
            out.append(f"a token mounted (automountServiceAccountToken {token}, account {account or 'default'})")
    return out


@pytest.mark.parametrize(("where", "pod"), GOLDEN_PODS, ids=[w for w, _ in GOLDEN_PODS])
def test_compiled_pod_is_hardened_alike_on_every_path(where: str, pod: dict[str, Any]) -> None:
    """Limits, read-only root, a bounded /dev/shm and no token but the launcher's: on every pod of every path."""
    assert hardening_gaps(where, pod) == []


@pytest.mark.parametrize(("mutate", "needle"), [
    (lambda p: p["containers"][0]["resources"].pop("limits"), "no limits"),
    (lambda p: p["containers"][0]["securityContext"].pop("readOnlyRootFilesystem"), "root filesystem writable"),
    (lambda p: p["volumes"].append({"name": "dshm", "emptyDir": {"medium": "Memory"}}), "no sizeLimit"),
    (lambda p: p.pop("automountServiceAccountToken"), "a token mounted"),
    (lambda p: p.update(serviceAccountName="llmpack-launcher"), "mounts no token"),
])
def test_the_hardening_check_finds_each_gap(mutate: Any, needle: str) -> None:
    pod = _good_pod()
    pod.update(automountServiceAccountToken=False)
    pod["containers"][0]["resources"] = {"requests": {"cpu": "1", "memory": "1Gi"},
                                         "limits": {"cpu": "1", "memory": "1Gi"}}
    pod["containers"][0]["securityContext"]["readOnlyRootFilesystem"] = True
    assert hardening_gaps("argo", pod) == []
    mutate(pod)
    assert needle in " | ".join(hardening_gaps("argo", pod))


def test_the_prepull_daemonset_passes_pod_security_restricted(tmp_path: Path) -> None:
    from components.finetune_pipeline import build
    from llmpack.compile.prepull import daemonset

    pod = daemonset(build())["spec"]["template"]["spec"]
    assert restricted_violations(pod) == []
    assert hardening_gaps("prepull", pod) == []


def test_kfp_backend_still_says_it_enforces_the_rest_of_restricted() -> None:
    """The KFP pods above add what kfp-kubernetes says the KFP backend sets; if it stops saying so, look again."""
    from kfp import kubernetes

    doc = " ".join((kubernetes.set_security_context.__doc__ or "").split())
    for needle in ("allowPrivilegeEscalation=false", "drop ALL capabilities", "seccompProfile=RuntimeDefault"):
        assert needle in doc, needle


def test_gang_pods_carry_the_restricted_context_whatever_the_run_parameter_says() -> None:
    """The ``trainjob`` parameter a submitter may override holds no security field: the builder writes it."""
    from components.trainjob.gang import GangSpec, build_trainjob

    spec = GangSpec(image="evil:latest", gpus_per_node=8, cpu=1, memory="1Gi", claim="c")
    obj = build_trainjob(spec, name="llmpack-finetune-x", namespace="ns", nodes=2, command=["torchrun", "-m", "m"],
                         labels={}, env={})
    assert restricted_violations(trainjob_pod(obj)) == []
    with pytest.raises(InputError, match="not a gang spec"):
        GangSpec.from_json('{"image": "x", "gpus_per_node": 1, "cpu": 1, "memory": "1Gi", "claim": "c", '
                           '"security_context": {"privileged": true}}', "trainjob")


# --------------------------------------------------------------------------- the checker is not vacuous


def _good_pod() -> dict[str, Any]:
    return {"securityContext": {"runAsNonRoot": True, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{"name": "c", "securityContext": {"allowPrivilegeEscalation": False,
                                                             "capabilities": {"drop": ["ALL"]}}}],
            "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "x"}}, {"name": "s", "emptyDir": {}}]}


@pytest.mark.parametrize(("mutate", "needle"), [
    (lambda p: p["containers"][0]["securityContext"].pop("allowPrivilegeEscalation"), "allowPrivilegeEscalation"),
    (lambda p: p["securityContext"].pop("runAsNonRoot"), "runAsNonRoot is not true"),
    (lambda p: p["containers"][0]["securityContext"].update(runAsNonRoot=False), "runAsNonRoot false"),
    (lambda p: p["securityContext"].update(runAsUser=0), "runAsUser 0"),
    (lambda p: p["securityContext"].pop("seccompProfile"), "no seccompProfile"),
    (lambda p: p["containers"][0]["securityContext"].update(seccompProfile={"type": "Unconfined"}), "Unconfined"),
    (lambda p: p["containers"][0]["securityContext"].pop("capabilities"), "drop lacks ALL"),
    (lambda p: p["containers"][0]["securityContext"]["capabilities"].update(add=["SYS_ADMIN"]), "capabilities.add"),
    (lambda p: p["containers"][0]["securityContext"].update(privileged=True), "privileged"),
    (lambda p: p["volumes"].append({"name": "h", "hostPath": {"path": "/"}}), "hostPath"),
    (lambda p: p["volumes"].append({"name": "n", "nfs": {"server": "x", "path": "/"}}), "nfs"),
    (lambda p: p.update(hostNetwork=True), "hostNetwork"),
    (lambda p: p["containers"][0].update(ports=[{"containerPort": 80, "hostPort": 80}]), "hostPort"),
    (lambda p: p["securityContext"].update(sysctls=[{"name": "kernel.msgmax", "value": "1"}]), "kernel.msgmax"),
    (lambda p: p["containers"][0]["securityContext"].update(procMount="Unmasked"), "procMount"),
    (lambda p: p.update(initContainers=[{"name": "i"}]), "container 'i'"),
])
def test_the_checker_finds_each_rule_broken(mutate: Any, needle: str) -> None:
    assert restricted_violations(_good_pod()) == []
    pod = _good_pod()
    mutate(pod)
    found = " | ".join(restricted_violations(pod))
    assert needle in found, found
