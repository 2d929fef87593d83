"""Rewrite a controller's own RBAC and webhook manifests for a controller run as a process on loopback.

Reads the JSON ``kubectl create --dry-run=client -o json`` prints for the pinned module's
``role.yaml`` and webhook ``manifests.yaml`` on stdin and writes, on stdout, a List to apply:

- its ClusterRole, renamed ``llmpack-<name>-controller`` (so two controllers' generic
  ``manager-role`` names cannot clash), and a ClusterRoleBinding of it to the user of the
  controller's client certificate (``CN=llmpack-<name>-controller``): the controller acts under
  the permissions its own release grants, nothing more;
- its Mutating/ValidatingWebhookConfigurations, renamed the same way, each webhook's
  ``clientConfig.service`` (a Service in the controller's namespace, which no process here
  backs) replaced by ``url: https://127.0.0.1:<port><path>`` and the cluster CA's bundle: the API
  server calls the webhooks the controller serves on loopback with the certificate up.sh made.

Standard library only, as up.sh needs no more than python3.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
from typing import Any


def _objects(text: str) -> list[dict[str, Any]]:
    """Every object of the input: a List's items, or one or more objects one after another."""
    decoder, pos, out = json.JSONDecoder(), 0, []
    while pos < len(text):
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos >= len(text):
            break
        obj, pos = decoder.raw_decode(text, pos)
        out.extend(obj.get("items") or [] if obj.get("kind") == "List" else [obj])
    return out


def rewrite(objects: list[dict[str, Any]], name: str, port: int, ca_pem: bytes) -> list[dict[str, Any]]:
    """The objects to apply for controller ``name`` serving its webhooks on 127.0.0.1:``port``."""
    user = f"llmpack-{name}-controller"
    bundle = base64.b64encode(ca_pem).decode()
    out: list[dict[str, Any]] = []
    for obj in objects:
        kind = obj.get("kind")
        meta = {"name": f"llmpack-{name}-" + obj["metadata"]["name"]}
        if kind == "ClusterRole":
            meta["name"] = user
            out.append({**obj, "metadata": meta})
            out.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                        "metadata": {"name": user},
                        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": user},
                        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]})
        elif kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            hooks = []
            for hook in obj.get("webhooks") or []:
                path = ((hook.get("clientConfig") or {}).get("service") or {}).get("path") or "/"
                hooks.append({**hook, "clientConfig": {"url": f"https://127.0.0.1:{port}{path}", "caBundle": bundle}})
            out.append({**obj, "metadata": meta, "webhooks": hooks})
        else:
            raise SystemExit(f"controllers.py: unexpected kind {kind!r} in {name}'s manifests")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", required=True, choices=["jobset", "trainer"])
    parser.add_argument("--port", required=True, type=int)
    parser.add_argument("--ca", required=True, help="the cluster CA's PEM file")
    args = parser.parse_args()
    with open(args.ca, "rb") as f:
        ca = f.read()
    items = rewrite(_objects(sys.stdin.read()), args.name, args.port, ca)
    json.dump({"apiVersion": "v1", "kind": "List", "items": items}, sys.stdout)


if __name__ == "__main__":
    main()
