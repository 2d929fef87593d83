"""CRDs from the pinned modules' own source (tools/cluster/crds.json), read from Go's module cache, installed for real.

``make cluster-build`` downloads the modules; here the cache is read with ``GOPROXY=off``, so
the tests reach no network. Two versions of one CRD cannot be served at once (same name):
:func:`install` replaces one version by another and waits until the API server serves the new
schema.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REPO

PINS = {k: v for k, v in json.loads((REPO / "tools" / "cluster" / "crds.json").read_text()).items()
        if not k.startswith("_")}


def module_dir(name: str) -> Path:
    """The source folder of pin ``name`` in Go's module cache; a skip when it was never downloaded."""
    pin = PINS[name]
    go = shutil.which("go") or "/usr/local/go/bin/go"
    env = {**os.environ, "GOPROXY": "off", "GOFLAGS": ""}
    done = subprocess.run([go, "mod", "download", "-json", f"{pin['module']}@{pin['version']}"], capture_output=True,
                          text=True, env=env, cwd=REPO / "tools" / "cluster", timeout=60)
    info = json.loads(done.stdout or "{}")
    if done.returncode != 0 or not info.get("Dir"):
        pytest.skip(f"{pin['module']}@{pin['version']} not in Go's module cache (make cluster-build downloads it)")
    return Path(info["Dir"])


def crds(name: str) -> list[dict[str, Any]]:
    """The CustomResourceDefinitions of pin ``name``, parsed (safe_load: no tags, no aliases expanded into code)."""
    root = module_dir(name)
    return [yaml.safe_load((root / rel).read_text()) for rel in PINS[name]["files"]]


def install(api: Any, name: str) -> list[str]:
    """Create (or replace) pin ``name``'s CRDs and wait until each is Established and served; their names."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    ext = client.ApiextensionsV1Api(api)
    names = []
    for crd in crds(name):
        crd_name = crd["metadata"]["name"]
        try:
            ext.delete_custom_resource_definition(crd_name)
        except ApiException as err:
            if err.status != 404:
                raise
        deadline = time.monotonic() + 60
        while True:  # a replaced CRD must be gone before its new version is created
            try:
                ext.read_custom_resource_definition(crd_name)
            except ApiException as err:
                if err.status == 404:
                    break
                raise
            if time.monotonic() > deadline:
                raise AssertionError(f"CRD {crd_name} not deleted within 60 s")
            time.sleep(0.2)
        crd.setdefault("metadata", {}).setdefault("annotations", {})["llmpack.io/pin"] = (
            f"{PINS[name]['module']}@{PINS[name]['version']}")
        api.call_api("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", "POST", {}, [],
                     {"Content-Type": "application/json", "Accept": "application/json"}, body=crd,
                     auth_settings=["BearerToken"], _preload_content=False)
        names.append(crd_name)
    for crd_name in names:
        deadline = time.monotonic() + 60
        while True:
            status = ext.read_custom_resource_definition(crd_name).status
            if any(c.type == "Established" and c.status == "True" for c in status.conditions or []):
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"CRD {crd_name} not Established within 60 s")
            time.sleep(0.2)
    _wait_served(api, [crd for crd in crds(name) if crd["metadata"]["name"] in names])
    return names


def _wait_served(api: Any, installed: list[dict[str, Any]]) -> None:
    """Until discovery lists each CRD's kind at its served versions: Established comes first, discovery after
    (a loaded machine showed a Workflow 'not served' right after its CRD was Established)."""
    from kubernetes.dynamic import DynamicClient
    from kubernetes.dynamic.exceptions import ResourceNotFoundError

    client = DynamicClient(api)
    for crd in installed:
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in [v["name"] for v in crd["spec"]["versions"] if v.get("served")]:
            deadline = time.monotonic() + 60
            while True:
                client.resources.invalidate_cache()
                try:
                    client.resources.get(api_version=f"{group}/{version}", kind=kind)
                    break
                except ResourceNotFoundError:
                    if time.monotonic() > deadline:
                        raise AssertionError(f"{group}/{version} {kind} not served within 60 s") from None
                    time.sleep(0.2)
