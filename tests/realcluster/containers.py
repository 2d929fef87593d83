"""The process kubelet's container mode: each container in a mount namespace of its own, as a container sees itself.

``ProcessKubelet(..., containers=True)`` (root only: mount namespaces) runs a container's command
under ``unshare --mount`` through :data:`MOUNT_AND_EXEC`: its volumes bound at their ``mountPath``s
(nothing rewritten), ``/tmp`` a folder of its own unless a volume is mounted there, the API
server's address in ``KUBERNETES_SERVICE_HOST``/``_PORT`` and the image folder's ``bin/`` first on
``PATH``. What Argo's executor needs: its paths under ``/var/run/argo`` are constants, and it
reaches the API server with the in-cluster config (the projected token at its usual path). An
image folder under a mount path (``/tmp``) would be hidden once mounted: refused. Mount points the
machine lacks are made (empty folders left behind). docs/internals/real-cluster.md, "Container mode".
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

# Run under `unshare --mount`, started in the image's folder: argv[1] the JSON {"mounts": [[source, target], ...]
# shallowest target first, "cwd": a workingDir or null}, the rest the command. Made at start where absent (an init
# container may have written a subPath's file by then), every source is opened first (a later mount, /tmp's, may
# hide it), then bound at its target through /proc/self/fd (a target made where absent), then the command executed
# (in workingDir, which may be on a volume).
MOUNT_AND_EXEC = """
import ctypes, json, os, stat, sys
spec, argv = json.loads(sys.argv[1]), sys.argv[2:]
libc = ctypes.CDLL(None, use_errno=True)
for src, _ in spec["mounts"]:  # a subPath absent when the container starts is made a folder, as the kubelet does
    if not os.path.exists(src):
        os.makedirs(src)
opened = [(os.open(src, os.O_PATH), src, target) for src, target in spec["mounts"]]
for fd, src, target in opened:
    if stat.S_ISDIR(os.fstat(fd).st_mode):
        os.makedirs(target, exist_ok=True)
    elif not os.path.exists(target):
        os.makedirs(os.path.dirname(target), exist_ok=True)
        open(target, "a").close()
    if libc.mount(f"/proc/self/fd/{fd}".encode(), target.encode(), None, 4096, None) != 0:  # MS_BIND
        sys.exit(f"process kubelet: bind {src} at {target}: {os.strerror(ctypes.get_errno())}")
    os.close(fd)
if spec["cwd"]:
    os.chdir(spec["cwd"])
os.execvp(argv[0], argv)
"""


def container_env(api: Any, env: dict[str, str], image: Path, base_env: Mapping[str, str]) -> dict[str, str]:
    """The container's environment: the API server as a kubelet announces it, the image's ``bin/`` first on PATH."""
    server = urlsplit(api.configuration.host)
    out = {"KUBERNETES_SERVICE_HOST": server.hostname or "127.0.0.1",
           "KUBERNETES_SERVICE_PORT": str(server.port or 443), **env}
    out["PATH"] = os.pathsep.join([str(image / "bin"), env.get("PATH") or base_env.get("PATH", "/usr/bin:/bin")])
    return out


def container_argv(kubelet: Any, pod: dict[str, Any], c: dict[str, Any], mounts: dict[str, Path], image: Path,
                   env: Mapping[str, str]) -> list[str]:
    """The argv that runs container ``c`` under ``unshare --mount``, its volumes (``mounts``: path -> folder) bound
    at their paths and a /tmp of its own."""
    from tests.realcluster.process_kubelet import CannotRun, _safe, expand

    argv = [expand(a, dict(env)) for a in (c.get("command") or []) + (c.get("args") or [])]
    if not argv:
        raise CannotRun("CreateContainerConfigError",
                        f"container {c['name']}: no command (an image's entrypoint is not known)")
    cwd = c.get("workingDir")
    if cwd and not any(Path(cwd).is_relative_to(target) for target in mounts):
        # a workingDir on no volume is in the image: the image folder's copy of that path (``<image>/opt/...``),
        # bound there, as MLflow's Job runs in the project folder its image holds
        held = image / cwd.lstrip("/")
        if not held.is_dir():
            raise CannotRun("CreateContainerConfigError", f"workingDir {cwd} is on no volume and not in image {image}")
        mounts[cwd] = held
    if "/tmp" not in mounts:
        pod_dir = kubelet.root / "pods" / _safe(pod["metadata"]["uid"], "pod uid")
        mounts["/tmp"] = pod_dir / f"tmp-{_safe(c['name'], 'container')}"
    for target in mounts:  # the image's files must stay in sight once the volumes are mounted
        if image.resolve().is_relative_to(Path(target)):
            raise CannotRun("ErrImagePull", f"image folder {image} is under mount path {target}")
    spec = json.dumps({"mounts": sorted([[str(local), target] for target, local in mounts.items()],
                                        key=lambda m: len(Path(m[1]).parts)),
                       "cwd": c.get("workingDir")})
    return ["unshare", "--mount", "--propagation", "private", kubelet.python, "-c", MOUNT_AND_EXEC, spec, *argv]
