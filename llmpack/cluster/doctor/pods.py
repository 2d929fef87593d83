"""What the compiled artifacts ask of a cluster, read from the files ``llmpack compile`` wrote: the pods'
security settings, for ``llmpack cluster doctor``'s Pod Security check.

Each path's pod specs come from its own artifact (the files a user submits), read by its backend
(:attr:`components.doctor_facts.DoctorFacts.compiled_pods`: KFP's platform spec, the Argo Workflow, the
MLflow Kubernetes Job template), and with a gang the TrainJob (every pod spec its
``runtimePatches`` carry). Containers the orchestrators add themselves are not in the artifacts
and are not judged here.

:func:`violations` judges a container against a Pod Security Standards level as the API server's
admission does for the fields the artifacts can carry: ``restricted`` needs ``runAsNonRoot``,
``allowPrivilegeEscalation: false``, ``capabilities.drop: [ALL]`` and a ``RuntimeDefault`` or
``Localhost`` seccomp profile (each from the container, or the pod where the pod may say it);
``baseline`` forbids privileged containers and ``hostPath`` volumes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from components import yamltext
from components.compiled_pods import PodSpec, pod_specs_in, pods_of
from components.errors import InputError

LEVELS = ("privileged", "baseline", "restricted")  # weakest first
ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"
TRAINJOB_ARTIFACT = "trainjob/finetune-trainjob.yaml"
_SECCOMP_OK = ("RuntimeDefault", "Localhost")


def committed_root() -> Path:
    """Where the committed artifacts are: the directory holding the packages (``llmpack``, ``kfp_pipelines``...)."""
    return Path(__file__).resolve().parents[3]


def artifact_of(path: str) -> str:
    """The compiled file whose pods are checked for ``path`` (the backend's ``doctor.pod_artifact``)."""
    from llmpack.backends import doctor_facts

    artifact = doctor_facts(path).pod_artifact
    if artifact is None:
        raise InputError(f"--path {path}: its backend declares no compiled pods to check")
    return artifact


def pod_specs(root: Path, path: str, *, gang: bool) -> list[PodSpec]:
    """The pod specs of ``path``'s artifact under ``root`` (``llmpack compile --out root``), and the TrainJob's
    with ``gang``. A missing or unreadable artifact is an :class:`InputError` naming it."""
    from llmpack.backends import doctor_facts

    read = doctor_facts(path).compiled_pods or pods_of
    specs = list(read(load_compiled(root / artifact_of(path))))
    if gang:
        specs += [PodSpec(f"TrainJob {s.where}", s.pod, s.containers, s.host_path)
                  for s in pod_specs_in((load_compiled(root / TRAINJOB_ARTIFACT) or [{}])[0])]
        if not any(s.where.startswith("TrainJob") for s in specs):
            # no pod spec patched in: the runtime's pods, no context of ours
            specs.append(PodSpec("TrainJob node pods"))
    return specs


def claimed_pvcs(root: Path, path: str, *, gang: bool) -> set[str]:
    """The PersistentVolumeClaims ``path``'s artifact (and with ``gang`` the TrainJob) mounts by name."""
    docs = load_compiled(root / artifact_of(path)) + (load_compiled(root / TRAINJOB_ARTIFACT) if gang else [])
    return {name for name in _claim_names(docs) if "{{" not in name}  # a claim named by a run parameter: unknown here


def _claim_names(doc: Any) -> Iterator[str]:
    if isinstance(doc, Mapping):
        if isinstance(doc.get("claimName"), str):
            yield doc["claimName"]
        if "pvcNameParameter" in doc and isinstance(doc.get("constant"), str):  # a KFP pvcMount
            yield doc["constant"]
        for value in doc.values():
            yield from _claim_names(value)
    elif isinstance(doc, list):
        for item in doc:
            yield from _claim_names(item)


def referenced_secrets(root: Path, path: str, *, gang: bool) -> tuple[set[tuple[str, str, str]], set[str]]:
    """What ``path``'s artifact (and with ``gang`` the TrainJob) reads from Secrets: required ``(name, key, env)``
    env refs (Argo, the MLflow Job, the TrainJob: ``secretKeyRef``; KFP: ``secretAsEnv``), and image pull Secrets."""
    docs = load_compiled(root / artifact_of(path)) + (load_compiled(root / TRAINJOB_ARTIFACT) if gang else [])
    refs: set[tuple[str, str, str]] = set()
    pulls: set[str] = set()

    def walk(doc: Any, env: str = "") -> None:
        if isinstance(doc, Mapping):
            ref = doc.get("secretKeyRef")
            if isinstance(ref, Mapping) and not ref.get("optional") and "{{" not in str(ref.get("name")):
                refs.add((str(ref.get("name")), str(ref.get("key")), env))
            if (isinstance(doc.get("secretName"), str) and isinstance(doc.get("keyToEnv"), list)
                    and not doc.get("optional")):
                refs.update((doc["secretName"], str(k.get("secretKey")), str(k.get("envVar"))) for k in doc["keyToEnv"])
            for item in doc.get("imagePullSecrets") or []:  # a pod spec's
                pulls.add(str(item.get("name")))
            for item in doc.get("imagePullSecret") or []:  # kfp-kubernetes'
                pulls.add(str(item.get("secretName")))
            for key, value in doc.items():
                walk(value, str(doc.get("name", "")) if key == "valueFrom" else "")
        elif isinstance(doc, list):
            for item in doc:
                walk(item)

    walk(docs)
    return refs, pulls


def load_compiled(file: Path) -> list[Any]:
    try:
        return [doc for doc in yamltext.load_file(file, str(file), documents=True) if doc is not None]
    except OSError as exc:
        raise InputError(f"{file}: {exc.strerror or exc} "
                         "(point --compiled at what llmpack compile --out wrote)") from None


def violations(spec: PodSpec, level: str) -> list[str]:
    """What keeps ``spec`` from admission at Pod Security ``level`` (empty: admitted), each once."""
    found: list[str] = []
    rank = LEVELS.index(level)
    if rank >= 1 and spec.host_path:
        found.append("hostPath volume")
    for _name, context in spec.containers or (("", {}),):
        caps = context.get("capabilities") or {}
        if rank >= 1 and context.get("privileged") is True:
            found.append("privileged container")
        if rank < 2:
            continue
        if context.get("allowPrivilegeEscalation") is not False:
            found.append("allowPrivilegeEscalation=false")
        if "ALL" not in (caps.get("drop") or []) or set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
            found.append("capabilities.drop=[ALL]")
        if context.get("runAsNonRoot", spec.pod.get("runAsNonRoot")) is not True:
            found.append("runAsNonRoot=true")
        seccomp = context.get("seccompProfile") or spec.pod.get("seccompProfile") or {}
        if seccomp.get("type") not in _SECCOMP_OK:
            found.append("seccompProfile=RuntimeDefault")
    return list(dict.fromkeys(found))


def enforced_level(namespace: Mapping[str, Any]) -> str:
    """The namespace's enforced Pod Security level (``privileged`` when it has no label)."""
    value = str(((namespace.get("metadata") or {}).get("labels") or {}).get(ENFORCE_LABEL) or "privileged")
    return value if value in LEVELS else "restricted"  # an unknown value: judge by the strictest
