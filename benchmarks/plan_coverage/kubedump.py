"""Histories as the files ``kubectl get pods|nodes|events -o json`` prints, the input ``llmpack plan
--pods pods.json --nodes-dump nodes.json --events events.json`` reads.

Per run (an Argo pipeline run): the ``finetune`` step's launcher pod (created at the run's submit),
then the TrainJob's N node pods, all created ``overhead`` seconds later, each on its own fresh GPU
node (created 5 s after the pods, Ready at ``provision``), image Pulling at node Ready and Pulled
``pull`` seconds later, container started ``start`` seconds after that, and every node's container
finished together (the gang trains from its straggler's start). GPU type per node: the node labels
``nvidia.com/gpu.product`` (GPU feature discovery) and ``node.kubernetes.io/instance-type``, plus the
pod label ``llmpack.io/gpu-type``; capacity ``karpenter.sh/capacity-type: on-demand``. Runs follow one
another in time; with several GPU types they alternate (H100, H200, H100, ...) in one dump.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from generators import H100, H200

EPOCH = 1_799_056_800            # 2027-01-04T08:00:00Z: the first run's submit
NAMESPACE = "llmpack"
IMAGE = "ghcr.io/llmpack/llmpack-train:0.1.0"
GPUS_PER_NODE = 8
NODE_CREATE_DELAY_S = 5          # the autoscaler's node object appears this long after the pods
GAP_S = 90                       # between one run's end and the next run's submit
NODE_LABELS = {
    H100: {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "node.kubernetes.io/instance-type": "p5.48xlarge"},
    H200: {"nvidia.com/gpu.product": "NVIDIA-H200", "node.kubernetes.io/instance-type": "p5en.48xlarge"},
}
SHORT = {H100: "h100", H200: "h200"}
GPU_TYPE_OCTET = {H100: 1, H200: 2}


def stamp(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(t)))


def _hex(*parts: object, n: int = 10) -> str:
    return hashlib.sha256("/".join(map(str, parts)).encode()).hexdigest()[:n]


def _cond(kind: str, t: float | None, status: str = "True") -> dict[str, Any]:
    return {"type": kind, "status": status, "lastTransitionTime": None if t is None else stamp(t)}


def _launcher(run: str, wf: str, gpu: str, group: str, t0: float, t_end: float) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"{wf}-finetune-{int(_hex(run, 'l', n=8), 16)}", "namespace": NAMESPACE,
                     "uid": _hex(run, "launcher", n=32), "creationTimestamp": stamp(t0),
                     "labels": {"llmpack.io/orchestrator": "argo", "llmpack.io/pipeline-run": run,
                                "llmpack.io/run-group": group, "llmpack.io/step": "finetune",
                                "llmpack.io/mode": "cluster", "llmpack.io/gpu-count": "0",
                                "llmpack.io/gpu-type": "none", "workflows.argoproj.io/workflow": wf},
                     "annotations": {"workflows.argoproj.io/node-name": f"{wf}.finetune"}},
        "spec": {"nodeName": "ip-10-0-1-10.ec2.internal",
                 "containers": [{"name": "wait"}, {"name": "main", "image": IMAGE, "command": ["python"]}]},
        "status": {"phase": "Succeeded",
                   "conditions": [_cond("PodScheduled", t0 + 1), _cond("Initialized", t0 + 2),
                                  _cond("PodReadyToStartContainers", t_end, "False")],
                   "containerStatuses": [
                       {"name": c, "state": {"terminated": {"startedAt": stamp(t0 + 3), "finishedAt": stamp(t_end),
                                                            "exitCode": 0, "reason": "Completed"}}}
                       for c in ("wait", "main")]},
    }


def run_objects(gpu: str, index: int, t0: float, g: dict[str, np.ndarray], r: int, group: str,
                tag: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]], float]:
    """Pods, nodes and events of run ``r`` of history ``g`` submitted at ``t0``; and when it ended."""
    run = f"argo-20270104-{index:04d}-{_hex(tag, gpu, r, n=6)}"
    wf = f"llm-finetune-{_hex(run, 'wf', n=5)}"
    jobset = f"llmpack-finetune-{_hex(run, 'js')}"
    created = t0 + float(g["overhead"][r])
    ready = g["provision"][r] + g["pull"][r] + g["start"][r]
    finished = created + float(np.max(ready)) + float(g["train"][r])
    pods: list[dict[str, Any]] = [_launcher(run, wf, gpu, group, t0, finished + 2)]
    nodes, events = [], []
    for k in range(len(ready)):
        name = f"{jobset}-node-0-{k}-{_hex(run, k, n=5)}"
        node = f"ip-10-{GPU_TYPE_OCTET[gpu]}-{index}-{k + 1}.ec2.internal"
        uid = _hex(run, "pod", k, n=32)
        t_ready = created + float(g["provision"][r, k])
        t_pulled = t_ready + float(g["pull"][r, k])
        t_started = t_pulled + float(g["start"][r, k])
        pods.append({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NAMESPACE, "uid": uid, "creationTimestamp": stamp(created),
                         "labels": {"jobset.sigs.k8s.io/jobset-name": jobset,
                                    "jobset.sigs.k8s.io/replicatedjob-name": "node",
                                    "batch.kubernetes.io/job-completion-index": str(k),
                                    "batch.kubernetes.io/job-name": f"{jobset}-node-0", "job-name": f"{jobset}-node-0",
                                    "llmpack.io/gpu-count": str(GPUS_PER_NODE), "llmpack.io/gpu-type": gpu,
                                    "llmpack.io/orchestrator": "argo", "llmpack.io/pipeline-run": run,
                                    "llmpack.io/run-group": group, "llmpack.io/step": "finetune"},
                         "annotations": {"batch.kubernetes.io/job-completion-index": str(k)}},
            "spec": {"nodeName": node, "containers": [{"name": "node", "image": IMAGE}]},
            "status": {"phase": "Succeeded",
                       "conditions": [_cond("PodScheduled", t_ready), _cond("Initialized", t_ready),
                                      _cond("PodReadyToStartContainers", finished, "False")],
                       "containerStatuses": [{"name": "node", "state": {"terminated": {
                           "startedAt": stamp(t_started), "finishedAt": stamp(finished),
                           "exitCode": 0, "reason": "Completed"}}}]},
        })
        nodes.append({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": node, "creationTimestamp": stamp(created + NODE_CREATE_DELAY_S),
                         "labels": {**NODE_LABELS[gpu], "karpenter.sh/capacity-type": "on-demand",
                                    "nvidia.com/gpu.count": str(GPUS_PER_NODE),
                                    "kubernetes.io/hostname": node.split(".")[0]}},
            "status": {"capacity": {"nvidia.com/gpu": str(GPUS_PER_NODE)},
                       "conditions": [_cond("Ready", t_ready)]},
        })
        ref = {"kind": "Pod", "namespace": NAMESPACE, "name": name, "uid": uid, "fieldPath": "spec.containers{node}"}
        pull_s = float(g["pull"][r, k])
        pulled = (f'Successfully pulled image "{IMAGE}" in {pull_s:.0f}s ({pull_s:.0f}s including waiting). '
                  "Image size: 9876543210 bytes.")
        for reason, t, msg in (("Pulling", t_ready, f'Pulling image "{IMAGE}"'), ("Pulled", t_pulled, pulled)):
            events.append({"apiVersion": "v1", "kind": "Event",
                           "metadata": {"name": f"{name}.{_hex(name, reason, n=16)}", "namespace": NAMESPACE},
                           "involvedObject": ref, "reason": reason, "message": msg, "type": "Normal",
                           "eventTime": None, "firstTimestamp": stamp(t), "lastTimestamp": stamp(t)})
    return pods, nodes, events, finished + 2



def dumps(histories: Sequence[tuple[str, dict[str, np.ndarray]]], tag: str) -> dict[str, dict[str, Any]]:
    """The three dumps of ``histories`` ((GPU type, gangs) each), runs alternating between them in time."""
    pods: list[dict[str, Any]] = [{
        "apiVersion": "v1", "kind": "Pod",   # an unrelated system pod, as a real dump has
        "metadata": {"name": "coredns-5d78c9869d-abcde", "namespace": "kube-system", "uid": _hex(tag, "dns", n=32),
                     "creationTimestamp": stamp(EPOCH - 86400), "labels": {"k8s-app": "kube-dns"}},
        "spec": {"nodeName": "ip-10-0-1-10.ec2.internal", "containers": [{"name": "coredns"}]},
        "status": {"phase": "Running"}}]
    nodes: list[dict[str, Any]] = [{
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "ip-10-0-1-10.ec2.internal", "creationTimestamp": stamp(EPOCH - 86400),
                     "labels": {"node.kubernetes.io/instance-type": "m6i.4xlarge",
                                "karpenter.sh/capacity-type": "on-demand"}},
        "status": {"capacity": {"nvidia.com/gpu": "0"}, "conditions": [_cond("Ready", EPOCH - 86300)]}}]
    events: list[dict[str, Any]] = []
    t, index = float(EPOCH), 0
    longest = max(len(g["overhead"]) for _, g in histories)
    for r in range(longest):
        for gpu, g in histories:
            if r >= len(g["overhead"]):
                continue
            group = f"rg-20270104-{SHORT[gpu]}-{_hex(tag, gpu, n=6)}"
            p, n, e, end = run_objects(gpu, index, t, g, r, group, tag)
            pods += p
            nodes += n
            events += e
            t, index = end + GAP_S, index + 1
    return {kind: {"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""}, "items": items}
            for kind, items in (("pods", pods), ("nodes", nodes), ("events", events))}


def write(histories: Sequence[tuple[str, dict[str, np.ndarray]]], tag: str, out: Path) -> dict[str, Path]:
    """pods.json, nodes.json, events.json under ``out``; their paths by kind."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for kind, doc in dumps(histories, tag).items():
        paths[kind] = out / f"{kind}.json"
        paths[kind].write_text(json.dumps(doc, separators=(",", ":")) + "\n", encoding="utf-8")
    return paths
