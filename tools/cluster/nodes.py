"""Create the simulated GPU nodes of a node-group file on the real API server, for kwok to run.

Standard library only, so that ``make cluster-up`` needs neither the pack's virtual environment
nor kubectl. Each group of the JSON file (``nodes.json`` beside this file by default) becomes
``count`` Node objects named ``<group>-<i>``, annotated ``kwok.x-k8s.io/node: fake`` (the
selector kwok is started with, so it manages these nodes and no other), with the labels a GPU
node of a cloud carries (``nvidia.com/gpu.product``, ``node.kubernetes.io/instance-type``, ...),
the taints given and ``capacity``/``allocatable`` from the group. kwok's ``node-initialize`` stage
keeps a status the node was created with, so the real scheduler sees exactly these resources.

A group: ``{"name": "h100", "count": 2, "gpus": 8, "cpu": "192", "memory": "2048Gi",
"gpuProduct": "NVIDIA-H100-80GB-HBM3", "instanceType": "p5.48xlarge", "labels": {...},
"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]}``; only ``name`` and ``count``
are required. A bad file is one line on stderr and exit code 2, before any node is created.
"""

from __future__ import annotations

import argparse
import json
import re
import ssl
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,40}[a-z0-9])?$")
QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|Ki|Mi|Gi|Ti|Pi|M|G|T|P)?$")
LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
EFFECTS = {"NoSchedule", "PreferNoSchedule", "NoExecute"}
GROUP_KEYS = {"name", "count", "gpus", "cpu", "memory", "pods", "ephemeralStorage", "gpuProduct", "instanceType",
              "labels", "taints"}
MAX_NODES = 20000


class BadInput(Exception):
    """A node-group file that cannot be created as given: one line naming the field."""


def _quantity(group: str, key: str, value: object) -> str:
    text = str(value)
    if not QUANTITY.match(text):
        raise BadInput(f"group {group!r}: {key} {text!r} is not a Kubernetes quantity")
    return text


def _label(group: str, key: object, value: object) -> tuple[str, str]:
    if not isinstance(key, str) or not LABEL_KEY.match(key):
        raise BadInput(f"group {group!r}: label key {key!r} is not a Kubernetes label key")
    if not isinstance(value, str) or not LABEL_VALUE.match(value):
        raise BadInput(f"group {group!r}: label {key} value {value!r} is not a Kubernetes label value")
    return key, value


def build_nodes(doc: Any) -> list[dict[str, Any]]:
    """The Node objects of a parsed node-group document; :class:`BadInput` on the first bad field."""
    groups = doc.get("groups") if isinstance(doc, dict) else None
    if not isinstance(groups, list) or not groups:
        raise BadInput('expected {"groups": [...]} with at least one group')
    nodes: list[dict[str, Any]] = []
    for g in groups:
        if not isinstance(g, dict):
            raise BadInput(f"group {g!r}: not an object")
        name = g.get("name")
        if not isinstance(name, str) or not DNS_LABEL.match(name):
            raise BadInput(f"group name {name!r}: not a DNS label of at most 42 characters")
        if set(g) - GROUP_KEYS:
            raise BadInput(f"group {name!r}: unknown key(s) {sorted(set(g) - GROUP_KEYS)}; known: {sorted(GROUP_KEYS)}")
        count = g.get("count")
        if not isinstance(count, int) or isinstance(count, bool) or not 0 <= count <= MAX_NODES:
            raise BadInput(f"group {name!r}: count {count!r} is not an integer in 0..{MAX_NODES}")
        resources = {"cpu": _quantity(name, "cpu", g.get("cpu", "32")),
                     "memory": _quantity(name, "memory", g.get("memory", "256Gi")),
                     "pods": _quantity(name, "pods", g.get("pods", "110")),
                     "ephemeral-storage": _quantity(name, "ephemeralStorage", g.get("ephemeralStorage", "1Ti"))}
        labels = dict(_label(name, k, v) for k, v in (g.get("labels") or {}).items())
        gpus = g.get("gpus", 0)
        if not isinstance(gpus, int) or isinstance(gpus, bool) or not 0 <= gpus <= 64:
            raise BadInput(f"group {name!r}: gpus {gpus!r} is not an integer in 0..64")
        if gpus:
            resources["nvidia.com/gpu"] = str(gpus)
            labels["nvidia.com/gpu.count"] = str(gpus)
            labels["nvidia.com/gpu.present"] = "true"
        for key, label in (("gpuProduct", "nvidia.com/gpu.product"),
                           ("instanceType", "node.kubernetes.io/instance-type")):
            if key in g:
                labels.update([_label(name, label, g[key])])
        taints = []
        for t in g.get("taints") or []:
            if not isinstance(t, dict) or t.get("effect") not in EFFECTS:
                raise BadInput(f"group {name!r}: taint {t!r} needs an effect among {sorted(EFFECTS)}")
            key, value = _label(name, t.get("key"), t.get("value", ""))
            taints.append({"key": key, **({"value": value} if value else {}), "effect": t["effect"]})
        for i in range(count):
            node_name = f"{name}-{i}"
            nodes.append({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {
                    "name": node_name,
                    "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
                    "labels": {"type": "kwok", "kubernetes.io/hostname": node_name, "kubernetes.io/os": "linux",
                               "kubernetes.io/arch": "amd64", "llmpack.io/node-group": name, **labels},
                },
                "spec": {"taints": taints} if taints else {},
                "status": {"capacity": dict(resources), "allocatable": dict(resources)},
            })
    return nodes


def create_nodes(nodes: list[dict[str, Any]], *, server: str, ca: Path, cert: Path, key: Path) -> None:
    """POST each node; one that exists already is left as it is (a re-run of up adds only the missing)."""
    context = ssl.create_default_context(cafile=str(ca))
    context.load_cert_chain(str(cert), str(key))
    for node in nodes:
        body = json.dumps(node).encode()
        request = urllib.request.Request(f"{server}/api/v1/nodes", data=body, method="POST",
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, context=context, timeout=30):
                pass
        except urllib.error.HTTPError as err:
            if err.code != 409:
                detail = json.loads(err.read() or b"{}").get("message", "")
                raise BadInput(f"node {node['metadata']['name']}: "
                               f"the API server answered {err.code}: {detail}") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("groups", type=Path)
    parser.add_argument("--server")
    parser.add_argument("--ca", type=Path)
    parser.add_argument("--cert", type=Path)
    parser.add_argument("--key", type=Path)
    parser.add_argument("--print", action="store_true", help="print the nodes as JSON, create nothing")
    args = parser.parse_args(argv)
    try:
        try:
            doc = json.loads(args.groups.read_text())
        except (OSError, ValueError) as err:
            raise BadInput(f"{args.groups}: not a readable JSON file ({type(err).__name__})") from None
        nodes = build_nodes(doc)
        if args.print:
            print(json.dumps(nodes, indent=1))
            return 0
        if not (args.server and args.ca and args.cert and args.key):
            parser.error("--server, --ca, --cert and --key are needed to create the nodes")
        create_nodes(nodes, server=args.server, ca=args.ca, cert=args.cert, key=args.key)
    except BadInput as err:
        print(f"cluster-up: {args.groups}: {err}", file=sys.stderr)
        return 2
    print(f"cluster-up: {len(nodes)} simulated node(s) from {args.groups}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
