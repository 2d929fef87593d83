"""Rewrite a controller's own RBAC and webhook manifests for a controller run as a process on loopback.

Reads the JSON ``kubectl create --dry-run=client -o json`` prints for the pinned module's manifests
on stdin and writes, on stdout, a List to apply:

- its ClusterRole, renamed ``llmpack-<name>-controller``, and a ClusterRoleBinding of it to the
  user of the controller's client certificate (``CN=llmpack-<name>-controller``); a release that
  binds its roles itself (Argo's; Kueue's Secrets Role) keeps roles and bindings, each binding's
  subjects replaced by that user, a Role and RoleBinding put in ``--namespace``;
- its Mutating/ValidatingWebhookConfigurations, renamed the same way, and a CRD's conversion
  webhook (Kueue's): each ``clientConfig.service`` (which no process here backs) replaced by
  ``url: https://127.0.0.1:<port><path>`` and the cluster CA's bundle; a Service is dropped.

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


def rewrite(objects: list[dict[str, Any]], name: str, port: int, ca_pem: bytes,
            namespace: str | None = None) -> list[dict[str, Any]]:
    """The objects to apply for controller ``name`` serving its webhooks on 127.0.0.1:``port``."""
    user = f"llmpack-{name}-controller"
    bundle = base64.b64encode(ca_pem).decode()
    out: list[dict[str, Any]] = []
    binds_itself = any(o.get("kind") in ("RoleBinding", "ClusterRoleBinding") for o in objects)
    for obj in objects:
        kind = obj.get("kind")
        meta = {"name": f"llmpack-{name}-" + obj["metadata"]["name"]}
        if binds_itself and kind in ("Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"):
            if kind in ("RoleBinding", "ClusterRoleBinding"):
                obj = {**obj, "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]}
            if kind in ("Role", "RoleBinding"):
                obj = {**obj, "metadata": {**obj["metadata"], "namespace": namespace or "default"}}
            out.append(obj)
        elif kind == "ClusterRole":
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
        elif kind == "CustomResourceDefinition":
            hook = ((obj.get("spec") or {}).get("conversion") or {}).get("webhook")
            if hook:
                path = ((hook.get("clientConfig") or {}).get("service") or {}).get("path") or "/"
                hook = {**hook, "clientConfig": {"url": f"https://127.0.0.1:{port}{path}", "caBundle": bundle}}
                obj = {**obj, "spec": {**obj["spec"], "conversion": {**obj["spec"]["conversion"], "webhook": hook}}}
            out.append(obj)
        elif kind == "Service":
            continue
        else:
            raise SystemExit(f"controllers.py: unexpected kind {kind!r} in {name}'s manifests")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", required=True, choices=["jobset", "trainer", "kueue", "argo", "argo-server"])
    parser.add_argument("--port", required=True, type=int)
    parser.add_argument("--ca", required=True, help="the cluster CA's PEM file")
    parser.add_argument("--namespace", help="the controller's namespace: where a release's own Roles go")
    args = parser.parse_args()
    with open(args.ca, "rb") as f:
        ca = f.read()
    items = rewrite(_objects(sys.stdin.read()), args.name, args.port, ca, args.namespace)
    json.dump({"apiVersion": "v1", "kind": "List", "items": items}, sys.stdout)


if __name__ == "__main__":
    main()
