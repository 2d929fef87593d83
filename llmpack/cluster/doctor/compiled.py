"""What ``llmpack cluster doctor --compiled DIR`` reads from the artifacts themselves, so no flag need repeat it:
the gang (its TrainJob's nodes, GPUs per node, Kueue queue, runtime, priority), the claims every pod mounts and
the access mode each needs, and the accounts and PriorityClasses the pods name.

A flag that says otherwise than the artifacts is refused in one line (exit 2): doctor would check a cluster for a
run that ``kubectl apply`` will not make (:func:`contradictions`).
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from components.errors import InputError

# The access modes a claim needs, by how the compiled pods mount it at once: pods on several nodes need a *Many
# mode (ReadOnlyMany will do for read-only mounts), one pod at a time any mode.
MANY_READ = ("ReadWriteMany", "ReadOnlyMany")
MANY_WRITE = ("ReadWriteMany",)


@dataclass(frozen=True)
class Gang:
    """The TrainJob ``llmpack compile --nodes N`` wrote (``trainjob/finetune-trainjob.yaml``)."""

    nodes: int
    gpus: int  # per node
    queue: str | None
    runtime: str
    runtime_kind: str  # ClusterTrainingRuntime, or a namespaced TrainingRuntime
    priority_class: str | None = None
    # the claims its node pods mount, each True when every mount of it is read-only
    claims: Mapping[str, bool] = field(default_factory=dict)

    @property
    def total_gpus(self) -> int:
        return self.nodes * self.gpus


@dataclass(frozen=True)
class Facts:
    """What the artifacts under one folder ask: the gang (None: finetune on one node), the accounts and
    PriorityClasses their pods name."""

    gang: Gang | None = None
    accounts: frozenset[str] = frozenset()
    priority_classes: frozenset[str] = frozenset()

    def claim_modes(self, name: str) -> tuple[str, ...]:
        """The access modes claim ``name`` may have (empty: any): a gang's claim is mounted on several nodes."""
        if self.gang is None or name not in self.gang.claims:
            return ()
        return MANY_READ if self.gang.claims[name] else MANY_WRITE


def _walk(doc: Any) -> Iterator[Mapping[str, Any]]:
    if isinstance(doc, Mapping):
        yield doc
        for value in doc.values():
            yield from _walk(value)
    elif isinstance(doc, list):
        for item in doc:
            yield from _walk(item)


def _claims_of(pod: Mapping[str, Any]) -> dict[str, bool]:
    """``claimName -> every mount read-only`` of the pod specs in ``pod`` (a volume's or its mounts' readOnly)."""
    volumes: dict[str, tuple[str, bool]] = {}
    mounts: dict[str, list[bool]] = {}
    for node in _walk(pod):
        for volume in node.get("volumes") or [] if isinstance(node.get("volumes"), list) else []:
            claim = (volume or {}).get("persistentVolumeClaim") or {}
            if isinstance(claim, Mapping) and isinstance(claim.get("claimName"), str):
                volumes[str(volume.get("name"))] = (claim["claimName"], bool(claim.get("readOnly")))
        for mount in node.get("volumeMounts") or [] if isinstance(node.get("volumeMounts"), list) else []:
            mounts.setdefault(str((mount or {}).get("name")), []).append(bool((mount or {}).get("readOnly")))
    out: dict[str, bool] = {}
    for volume, (claim, read_only) in volumes.items():
        ro = read_only or bool(mounts.get(volume)) and all(mounts[volume])
        out[claim] = out.get(claim, True) and ro
    return out


def read_gang(job: Mapping[str, Any]) -> Gang:
    """The gang of one compiled TrainJob."""
    from components.trainjob.spec import QUEUE_LABEL

    spec = job.get("spec") or {}
    trainer = spec.get("trainer") or {}
    res = trainer.get("resourcesPerNode") or {}
    gpus = (res.get("limits") or {}).get("nvidia.com/gpu") or (res.get("requests") or {}).get("nvidia.com/gpu") or 0
    ref = spec.get("runtimeRef") or {}
    labels = (job.get("metadata") or {}).get("labels") or {}
    priority = {str(n["priorityClassName"]) for n in _walk(spec.get("runtimePatches") or [])
                if isinstance(n.get("priorityClassName"), str)}
    return Gang(nodes=int(trainer.get("numNodes") or 1), gpus=int(str(gpus)), queue=labels.get(QUEUE_LABEL),
                runtime=str(ref.get("name") or "torch-distributed"),
                runtime_kind=str(ref.get("kind") or "ClusterTrainingRuntime"),
                priority_class=labels.get("kueue.x-k8s.io/priority-class") or next(iter(sorted(priority)), None),
                claims=_claims_of(spec.get("runtimePatches") or []))


def read_facts(root: Path, files: tuple[str, ...]) -> Facts:
    """The facts of the artifacts under ``root``: the TrainJob when one was compiled, and ``files`` (each path's
    artifact) for the accounts and PriorityClasses."""
    from llmpack.cluster.doctor.pods import TRAINJOB_ARTIFACT, load_compiled

    trainjob = root / TRAINJOB_ARTIFACT
    gang = None
    docs: list[Any] = []
    if trainjob.is_file():
        jobs = [d for d in load_compiled(trainjob) if isinstance(d, Mapping) and d.get("kind") == "TrainJob"]
        gang = read_gang(jobs[0]) if jobs else None
        docs += jobs
    for file in files:
        if (root / file).is_file():
            docs += load_compiled(root / file)
    nodes = list(_walk(docs))
    accounts = {str(n["serviceAccountName"]) for n in nodes if isinstance(n.get("serviceAccountName"), str)}
    accounts |= {str(n["serviceAccount"]) for n in nodes if isinstance(n.get("serviceAccount"), str)}
    priorities = {str(n["priorityClassName"]) for n in nodes if isinstance(n.get("priorityClassName"), str)}
    return Facts(gang, frozenset(a for a in accounts if "{{" not in a),
                 frozenset(p for p in priorities if "{{" not in p))


def contradictions(facts: Facts, source: str, *, nodes: int | None, gpus: int | None, queue: str | None) -> None:
    """Refuse (one line, exit 2) a flag that says otherwise than the compiled artifacts."""
    gang = facts.gang
    redo = f"llmpack compile ... --out DIR again, or drop the flag ({source} say it)"
    if gang is None:
        if nodes is not None and nodes > 1:
            raise InputError(f"--nodes {nodes}: {source} compile finetune on 1 node (no trainjob/"
                             f"finetune-trainjob.yaml); {redo}")
        if queue is not None:
            raise InputError(f"--queue {queue}: {source} have no TrainJob to queue")
        return
    if nodes is not None and nodes != gang.nodes:
        raise InputError(f"--nodes {nodes}: {source} compile a {gang.nodes}-node gang; {redo}")
    if gpus is not None and gpus != gang.gpus:
        raise InputError(f"--gpus {gpus}: {source} give each gang node {gang.gpus} GPUs; {redo}")
    if queue is not None and queue != gang.queue:
        said = f"queue {gang.queue}" if gang.queue else "no Kueue queue"
        raise InputError(f"--queue {queue}: {source} label the TrainJob with {said}; "
                         f"llmpack compile --queue {shlex.quote(queue)} to queue it there")
