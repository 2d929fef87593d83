"""A stand-in OpenCost server on 127.0.0.1 (its allocation API), and spot GPU nodes for the fake cluster.

OpenCost prices what pods held from its own view of the cluster; ``llmpack compare --cluster
--opencost URL`` shows its figures beside ours. This stand-in speaks the allocation API as
OpenCost serves it on port 9003.

In full: docs/internals/stand-ins.md, "The OpenCost stand-in".
"""

from __future__ import annotations

import copy
import math
import re
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler
from typing import Any

from standins.argo_server import quantity
from standins.base import StandInHandler, StandInServer

# OpenCost's default custom pricing (CPU per core-hour, RAM per GiB-hour).
DEFAULT_CPU_HOURLY, DEFAULT_RAM_GIB_HOURLY = 0.031611, 0.004237
SPOT_LABELS = {  # provider -> the labels its provisioner puts on a spot node
    "aws": {"karpenter.sh/capacity-type": "spot"},
    "eks": {"eks.amazonaws.com/capacityType": "SPOT"},
    "gcp": {"cloud.google.com/gke-spot": "true"},
    "azure": {"kubernetes.azure.com/scalesetpriority": "spot"},
}
_DURATION = re.compile(r"^(\d+)([mhd])$")


def spot_nodes(provider: str = "aws") -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A ``FakeCluster(gpu_node_hook=...)``: each GPU node labelled spot as ``provider`` labels it."""
    labels = SPOT_LABELS[provider]

    def hook(node: dict[str, Any]) -> dict[str, Any]:
        out = copy.deepcopy(node)
        out["metadata"].setdefault("labels", {}).update(labels)
        return out

    return hook


def sanitize(name: str) -> str:
    """A label name as Prometheus (and so OpenCost) carries it."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def _epoch(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _rfc3339(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_window(text: str, now: float) -> tuple[float, float]:
    """OpenCost's ``window``: a duration back from now, an RFC 3339 pair, or a unix pair."""
    match = _DURATION.match(text.strip())
    if match:
        return now - int(match.group(1)) * {"m": 60, "h": 3600, "d": 86400}[match.group(2)], now
    parts = text.split(",")
    if len(parts) != 2:
        raise ValueError(f"invalid window: {text}")
    try:
        start, end = (float(p) if p.strip().isdigit() else _epoch(p.strip()) for p in parts)
    except ValueError:
        raise ValueError(f"invalid window: {text}") from None
    if end <= start:
        raise ValueError(f"invalid window: {text}")
    return start, end


class OpenCostStandIn(StandInServer):
    """The stand-in OpenCost API over a :class:`~standins.k8s_api.KubeAPIStandIn`'s pods and nodes."""

    thread_name = "opencost-standin"

    def __init__(self, kube: Any, *, gpu_hourly: float, spot_gpu_hourly: float | None = None, discount: float = 0.0,
                 cpu_hourly: float = DEFAULT_CPU_HOURLY, ram_gib_hourly: float = DEFAULT_RAM_GIB_HOURLY,
                 cluster: str = "cluster-one") -> None:
        super().__init__(token=None)
        self.kube = kube
        self.gpu_hourly, self.spot_gpu_hourly, self.discount = gpu_hourly, spot_gpu_hourly, discount
        self.cpu_hourly, self.ram_gib_hourly, self.cluster = cpu_hourly, ram_gib_hourly, cluster

    def handler(self) -> type[BaseHTTPRequestHandler]:
        return _make_handler(self)

    def gpu_price(self, node: Mapping[str, Any] | None) -> float:
        """The node's GPU-hour price as this OpenCost prices it (spot column on a spot node, less the discount)."""
        from llmpack.cluster.k8s.objects import capacity_type

        spot = node is not None and capacity_type((node.get("metadata") or {}).get("labels") or {}) == "spot"
        base = self.spot_gpu_hourly if spot and self.spot_gpu_hourly is not None else self.gpu_hourly
        return base * (1.0 - self.discount)

    def allocations(self, start: float, end: float, aggregate: list[str], resolution_s: float) -> dict[str, Any]:
        with self.kube._cond:
            pods = [copy.deepcopy(p) for p in self.kube._pods.values()]
            nodes = {k: copy.deepcopy(n) for k, n in self.kube._nodes.items()}
        out: dict[str, dict[str, Any]] = {}
        for pod in pods:
            one = self._pod(pod, nodes, start, end, resolution_s)
            if one is None:
                continue
            key = "/".join(_key(pod, one["properties"], a) for a in aggregate) if aggregate else one["name"]
            have = out.get(key)
            out[key] = _add(have, one, key) if have else {**one, "name": key}
        return out

    def _pod(self, pod: Mapping[str, Any], nodes: Mapping[str, Any], start: float, end: float,
             resolution_s: float) -> dict[str, Any] | None:
        meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
        states = [c.get("state") or {} for c in status.get("containerStatuses") or []]
        began = [_epoch(s[k]["startedAt"]) for s in states for k in ("running", "terminated")
                 if (s.get(k) or {}).get("startedAt")]
        if not began:
            return None
        ended = [_epoch(s["terminated"]["finishedAt"]) for s in states if (s.get("terminated") or {}).get("finishedAt")]
        first = math.floor(min(began) / resolution_s) * resolution_s
        last = math.ceil((max(ended) if len(ended) == len(states) else time.time()) / resolution_s) * resolution_s
        s, e = max(start, first), min(end, last)
        if e <= s:
            return None
        hours = (e - s) / 3600.0
        gpus = cpu = ram = 0.0
        for c in spec.get("containers") or []:
            res = c.get("resources") or {}
            asked = {**(res.get("limits") or {}), **(res.get("requests") or {})}
            gpus += quantity(asked.get("nvidia.com/gpu", 0))
            cpu += quantity(asked.get("cpu", 0))
            ram += quantity(asked.get("memory", 0))
        node = nodes.get(spec.get("nodeName") or "")
        gpu_cost = gpus * hours * self.gpu_price(node)
        cpu_cost, ram_cost = cpu * hours * self.cpu_hourly, ram / 2**30 * hours * self.ram_gib_hourly
        props = {"cluster": self.cluster, "node": spec.get("nodeName") or "", "namespace": meta.get("namespace") or "",
                 "pod": meta["name"], "container": (spec.get("containers") or [{}])[-1].get("name", ""),
                 "providerID": ((node or {}).get("spec") or {}).get("providerID", ""),
                 "labels": {sanitize(k): v for k, v in (meta.get("labels") or {}).items()}}
        name = "/".join(props[k] for k in ("cluster", "node", "namespace", "pod", "container"))
        return {"name": name, "properties": props, "window": {"start": _rfc3339(start), "end": _rfc3339(end)},
                "start": _rfc3339(s), "end": _rfc3339(e), "minutes": (e - s) / 60.0,
                "cpuCores": cpu, "cpuCoreRequestAverage": cpu, "cpuCoreUsageAverage": cpu * 0.8,
                "cpuCoreHours": cpu * hours,
                "cpuCost": cpu_cost, "cpuCostAdjustment": 0.0, "cpuEfficiency": 0.8,
                "gpuCount": gpus, "gpuHours": gpus * hours, "gpuCost": gpu_cost, "gpuCostAdjustment": 0.0,
                "networkCost": 0.0, "loadBalancerCost": 0.0, "pvCost": 0.0,
                "ramBytes": ram, "ramByteRequestAverage": ram, "ramByteUsageAverage": ram * 0.5,
                "ramByteHours": ram * hours,
                "ramCost": ram_cost, "ramCostAdjustment": 0.0, "ramEfficiency": 0.5,
                "sharedCost": 0.0, "externalCost": 0.0, "totalCost": gpu_cost + cpu_cost + ram_cost,
                "totalEfficiency": 0.65}


_SUMMED = ("cpuCoreHours", "cpuCost", "gpuHours", "gpuCost", "ramByteHours", "ramCost", "totalCost")


def _key(pod: Mapping[str, Any], props: Mapping[str, Any], aggregate: str) -> str:
    if aggregate.startswith("label:"):
        return props["labels"].get(sanitize(aggregate[len("label:"):])) or "__unallocated__"
    return str(props.get(aggregate) or "__unallocated__")


def _add(a: dict[str, Any], b: Mapping[str, Any], key: str) -> dict[str, Any]:
    """Two allocations of one key summed (times: the earlier start, the later end)."""
    out = dict(a, name=key)
    for f in _SUMMED:
        out[f] = a[f] + b[f]
    out["start"], out["end"] = min(a["start"], b["start"]), max(a["end"], b["end"])
    out["minutes"] = (_epoch(out["end"]) - _epoch(out["start"])) / 60.0
    hours = out["minutes"] / 60.0 or 1.0
    out["gpuCount"], out["cpuCores"] = out["gpuHours"] / hours, out["cpuCoreHours"] / hours
    shared = {k: v for k, v in a["properties"].items() if k != "labels" and b["properties"].get(k) == v}
    labels = {k: v for k, v in a["properties"]["labels"].items() if b["properties"]["labels"].get(k) == v}
    out["properties"] = {**shared, "labels": labels}
    return out


def _make_handler(api: OpenCostStandIn) -> type[BaseHTTPRequestHandler]:
    class Handler(StandInHandler):
        server_version = "opencost-standin/1.113"

        def _handle(self, method: str) -> None:
            parts, query, _, _ = self._receive(api, method)
            path = parts.path.rstrip("/")
            if method != "GET" or path not in ("/allocation", "/allocation/compute"):
                return self._json(404, {"code": 404, "message": "Not Found"})
            window = query.get("window")
            if not window:
                return self._json(400, {"code": 400, "message": "Error: missing window argument"})
            try:
                start, end = parse_window(window, time.time())
                res = _DURATION.match(query.get("resolution") or "1m")
                if res is None:
                    raise ValueError(f"invalid resolution: {query.get('resolution')}")
                resolution_s = int(res.group(1)) * {"m": 60, "h": 3600, "d": 86400}[res.group(2)]
            except ValueError as exc:
                return self._json(400, {"code": 400, "message": f"Error parsing window ({window}): {exc}"})
            aggregate = [a for a in (query.get("aggregate") or "").split(",") if a]
            return self._json(200, {"code": 200, "data": [api.allocations(start, end, aggregate, resolution_s)]})

    return Handler
