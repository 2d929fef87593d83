"""A kubelet for pods that must run code: each pod bound to a "process" node runs as local processes.

kwok plays the kubelets of the simulated GPU nodes, and their pods run nothing. :class:`ProcessKubelet`
registers nodes of its own on the real API server (without kwok's annotation, so kwok leaves them
alone), keeps their ``Ready`` condition and Lease fresh, runs the containers of the pods the real
scheduler binds to them as processes on this machine, and reports through ``pods/status`` as a
kubelet does, so the real controllers act on it. An image is a local folder (``images``: repository
-> folder), what it has installed ``base_env`` (``python`` is this ``sys.executable``); volumes are
local folders, paths under a ``mountPath`` rewritten to them. A pod it cannot run is ``Failed`` with
the reason, never left Pending. Everything is bounded: a container runs at most ``deadline_s``;
:meth:`ProcessKubelet.close` ends the process groups it started (by pid) and deletes its nodes.

With ``containers=True`` each container sees its volumes at their mount paths (``containers.py``).

What it maps and what it does not play: docs/internals/real-cluster.md, "Pods that run code: the process kubelet".
"""

from __future__ import annotations

import base64
import os
import random
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")  # a DNS-1123 name: safe as one path part
KEY = re.compile(r"^[-._a-zA-Z0-9]{1,253}$")  # a Secret/ConfigMap key
PROCESS_LABEL = "llmpack.io/process-node"
LEASE_NS = "kube-node-lease"



@dataclass(frozen=True, kw_only=True)
class ProcessNode:
    """One node this kubelet registers: its allocatable resources, labels and taints."""

    name: str
    cpu: str = "16"
    memory: str = "128Gi"
    gpus: int = 0
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Mapping[str, str], ...] = ()

    def obj(self) -> dict[str, Any]:
        labels = {"kubernetes.io/hostname": self.name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                  PROCESS_LABEL: "true", **self.labels}
        return {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": self.name, "labels": labels,
                             "annotations": {"llmpack.io/process-kubelet": "true"}},
                "spec": {"taints": [dict(t) for t in self.taints]}}

    def resources(self) -> dict[str, str]:
        return {"cpu": self.cpu, "memory": self.memory, "pods": "110", "ephemeral-storage": "100Gi",
                **({"nvidia.com/gpu": str(self.gpus)} if self.gpus else {})}


class CannotRun(Exception):
    """A pod this kubelet cannot run: ``reason`` (one CamelCase word) and a message for its status."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _micro_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _safe(name: str, what: str) -> str:
    if not NAME.match(name) or ".." in name:
        raise CannotRun("InvalidName", f"{what} {name!r} is not a DNS-1123 name")
    return name


def rewrite(value: str, mounts: Mapping[str, Path]) -> str:
    """``value`` (or the part after a ``--flag=``) under a mount path, moved to the mount's folder (deepest mount
    first)."""
    head, sep, tail = value.partition("=") if value.startswith("-") else ("", "", value)
    for mount, local in sorted(mounts.items(), key=lambda m: -len(m[0])):
        root = mount.rstrip("/") or "/"
        if tail == root or tail.startswith(root.rstrip("/") + "/"):
            return head + sep + str(local) + tail[len(root.rstrip("/")):]
    return value


def expand(value: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion of a command, argument or env value (``$$(`` escapes; unknown names stay)."""
    return re.sub(r"\$(\$)?\(([A-Za-z_][A-Za-z0-9_]*)\)",
                  lambda m: f"$({m.group(2)})" if m.group(1) else env.get(m.group(2), m.group(0)), value)


class ProcessKubelet:
    """The kubelet of ``nodes`` on the real API server ``api`` (a ``kubernetes.client.ApiClient``), its volumes
    under ``root``."""

    def __init__(self, api: Any, nodes: list[ProcessNode], *, root: Path, images: Mapping[str, Path],
                 base_env: Mapping[str, str], python: str = sys.executable, deadline_s: float = 900.0,
                 containers: bool = False, pod_delay_ms: int = 0, pod_jitter_ms: int = 0, seed: int = 0) -> None:
        self.api, self.nodes, self.root, self.containers = api, {n.name: n for n in nodes}, root, containers
        # kwok's pod stage delay, played on these nodes: each pod waits delay + uniform(0, jitter) after it is bound
        # before its containers start (the node's provisioning and image pull, as up.sh's LLMPACK_KWOK_POD_*_MS)
        self.pod_delay_ms, self.pod_jitter_ms, self._random = pod_delay_ms, pod_jitter_ms, random.Random(seed)
        self.delays: dict[str, float] = {}  # pod name -> the delay it was given (s)
        self.images, self.base_env, self.python, self.deadline_s = dict(images), dict(base_env), python, deadline_s
        self._stop = threading.Event()
        self._seen: set[str] = set()
        self._deleted: set[str] = set()  # pods being deleted: nothing more is started for them
        self._procs: dict[str, list[subprocess.Popen[bytes]]] = {}
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self.errors: list[str] = []  # what went wrong in the threads (asserted empty by the tests)

    @property
    def core(self) -> Any:
        from kubernetes import client

        return client.CoreV1Api(self.api)

    # ------------------------------------------------------------------ nodes

    def start(self) -> ProcessKubelet:
        for node in self.nodes.values():
            self.core.create_node(node.obj())
            self._report_node(node)
            self._renew_lease(node)
        for target in (self._heartbeat, self._watch):
            t = threading.Thread(target=self._guard, args=(target,), name=f"process-kubelet-{target.__name__}",
                                 daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def _guard(self, target: Any) -> None:
        try:
            target()
        except Exception as err:  # a thread's failure is the tests' to see, not a silent stop
            if not self._stop.is_set():
                self.errors.append(f"{target.__name__}: {type(err).__name__}: {err}")

    def _report_node(self, node: ProcessNode) -> None:
        """The node's status as its kubelet posts it: resources, addresses, conditions (Ready), node info."""
        stamp = now()
        conds = [{"type": t, "status": "False", "reason": f"KubeletHas{r}", "message": m,
                  "lastHeartbeatTime": stamp, "lastTransitionTime": stamp}
                 for t, r, m in (("MemoryPressure", "SufficientMemory", "kubelet has sufficient memory available"),
                                 ("DiskPressure", "NoDiskPressure", "kubelet has no disk pressure"),
                                 ("PIDPressure", "SufficientPID", "kubelet has sufficient PID available"))]
        conds.append({"type": "Ready", "status": "True", "reason": "KubeletReady",
                      "message": "process kubelet is posting ready status",
                      "lastHeartbeatTime": stamp, "lastTransitionTime": stamp})
        status = {"capacity": node.resources(), "allocatable": node.resources(), "conditions": conds,
                      "addresses": [{"type": "InternalIP", "address": "127.0.0.1"},
                                    {"type": "Hostname", "address": node.name}],
                      "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
                      "nodeInfo": {"machineID": "", "systemUUID": "", "bootID": "", "kernelVersion": os.uname().release,
                                   "osImage": "llmpack process kubelet", "containerRuntimeVersion": "process://local",
                                   "kubeletVersion": "v1.36.1", "kubeProxyVersion": "", "operatingSystem": "linux",
                                   "architecture": "amd64"}}
        self.core.patch_node_status(node.name, {"status": status})  # strategic merge: conditions by type

    def _renew_lease(self, node: ProcessNode) -> None:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        coord = client.CoordinationV1Api(self.api)
        body = {"metadata": {"name": node.name}, "spec": {"holderIdentity": node.name, "leaseDurationSeconds": 40,
                                                          "renewTime": _micro_now()}}
        try:
            coord.patch_namespaced_lease(node.name, LEASE_NS, {"spec": body["spec"]})
        except ApiException as err:
            if err.status != 404:
                raise
            coord.create_namespaced_lease(LEASE_NS, body)

    def _heartbeat(self) -> None:
        """Lease every 5 s, the Ready condition every 20 s: the node-lifecycle controller keeps the nodes Ready."""
        beats = 0
        while not self._stop.wait(5.0):
            beats += 1
            for node in self.nodes.values():
                self._renew_lease(node)
                if beats % 4 == 0:
                    self._report_node(node)

    # ------------------------------------------------------------------ pods

    def _watch(self) -> None:
        """Every pod event, across namespaces; those bound to our nodes are handled, each once."""
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException

        version = ""
        while not self._stop.is_set():
            w = watch.Watch()
            try:
                for event in w.stream(self.core.list_pod_for_all_namespaces, resource_version=version or None,
                                      timeout_seconds=5, _request_timeout=15):
                    if self._stop.is_set():
                        w.stop()
                        break
                    pod = event["object"]
                    version = pod.metadata.resource_version
                    if pod.spec.node_name in self.nodes:
                        self._on_pod(event["type"], pod)
            except ApiException as err:
                if err.status != 410:
                    raise
                version = ""  # compacted: list again (pods already seen are not run twice)

    def _on_pod(self, kind: str, pod: Any) -> None:
        uid = pod.metadata.uid
        if kind == "DELETED" or pod.metadata.deletion_timestamp:
            with self._lock:
                self._deleted.add(uid)
            self._end(uid, pod.spec.termination_grace_period_seconds or 0)
            if kind != "DELETED":
                self._force_delete(pod)
            return
        if uid in self._seen or pod.status.phase in ("Succeeded", "Failed"):
            return
        self._seen.add(uid)
        t = threading.Thread(target=self._guard, args=(lambda: self._run(pod),), name=f"pod-{pod.metadata.name}",
                             daemon=True)
        t.start()
        self._threads.append(t)

    def _run(self, pod: Any) -> None:
        ns, name, uid = pod.metadata.namespace, pod.metadata.name, pod.metadata.uid
        raw = self.api.sanitize_for_serialization(pod)
        spec = raw["spec"]
        if self.pod_delay_ms or self.pod_jitter_ms:
            with self._lock:
                delay = (self.pod_delay_ms + self._random.uniform(0, self.pod_jitter_ms)) / 1000
            self.delays[name] = delay
            if self._stop.wait(delay):
                return
            with self._lock:
                if uid in self._deleted:
                    return
        started = now()
        try:
            mounts_by_volume = self._volumes(raw, ns, uid)
            inits = [self._prepare(raw, c, mounts_by_volume) for c in spec.get("initContainers") or []]
            mains = [self._prepare(raw, c, mounts_by_volume) for c in spec["containers"]]
        except CannotRun as err:
            self._status(ns, name, phase="Failed", reason=err.reason, message=str(err), started=started)
            return
        logs = self.root / "logs" / _safe(ns, "namespace") / _safe(name, "pod")
        logs.mkdir(parents=True, exist_ok=True)
        for c, argv, cwd, env in inits:  # one at a time, each to exit 0, before the containers
            started_one = self._spawn(uid, [(c, argv, cwd, env)], logs)
            if not started_one:
                return
            (proc,) = started_one
            if self._wait(proc) != 0:
                self._status(ns, name, phase="Failed", reason="InitContainerFailed", started=started,
                             message=f"init container {c['name']} exited {proc.returncode}")
                return
        procs = self._spawn(uid, mains, logs)
        if not procs:
            return
        begun = now()
        self._status(ns, name, phase="Running", started=started,
                     containers=[self._state(c, p, {"running": {"startedAt": begun}})
                                 for (c, *_), p in zip(mains, procs, strict=True)])
        codes = [self._wait(p) for p in procs]
        done = now()
        states = [self._state(c, p, {"terminated": {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                                                     "startedAt": begun, "finishedAt": done, "containerID": f"process://{p.pid}"}})
                  for (c, *_), p, code in zip(mains, procs, codes, strict=True)]
        self._status(ns, name, phase="Succeeded" if not any(codes) else "Failed", started=started, containers=states)
        with self._lock:
            self._procs.pop(uid, None)

    def _volumes(self, pod: dict[str, Any], ns: str, uid: str) -> dict[str, Path]:
        """Each volume's local folder: emptyDir per pod, a claim per namespace and claim, Secret/ConfigMap written
        out."""
        out = {}
        for vol in pod["spec"].get("volumes") or []:
            vname = _safe(vol["name"], "volume")
            if "emptyDir" in vol:
                path = self.root / "pods" / _safe(uid, "pod uid") / vname
            elif "persistentVolumeClaim" in vol:
                path = (self.root / "claims" / _safe(ns, "namespace")
                        / _safe(vol["persistentVolumeClaim"]["claimName"], "claim"))
            elif "secret" in vol or "configMap" in vol:
                path = self.root / "pods" / _safe(uid, "pod uid") / vname
                self._write_keys(path, ns, vol)
            elif "projected" in vol:  # the ServiceAccount admission's kube-api-access volume among them
                path = self.root / "pods" / _safe(uid, "pod uid") / vname
                for source in vol["projected"].get("sources") or []:
                    self._project(path, pod, source)
            else:
                kind = next((k for k in vol if k != "name"), "?")
                raise CannotRun("UnsupportedVolume",
                                f"volume {vname}: kind {kind} is not mapped by the process kubelet")
            path.mkdir(parents=True, exist_ok=True)
            out[vname] = path
        return out

    def _write_keys(self, path: Path, ns: str, vol: dict[str, Any]) -> None:
        secret = "secret" in vol
        ref = vol["secret"] if secret else vol["configMap"]
        data = self._source(ns, ref.get("secretName") or ref.get("name") or "", secret=secret,
                            optional=bool(ref.get("optional")))
        path.mkdir(parents=True, exist_ok=True)
        for key, value in (data or {}).items():
            if not KEY.match(key) or key in (".", ".."):
                raise CannotRun("InvalidKey", f"key {key!r} is not a Secret/ConfigMap key")
            target = path / key
            target.write_text(value)
            target.chmod(0o600)

    def _project(self, path: Path, pod: dict[str, Any], source: dict[str, Any]) -> None:
        """One source of a projected volume: a token from the real TokenRequest API, ConfigMap/Secret keys, pod
        fields."""
        ns = pod["metadata"]["namespace"]
        path.mkdir(parents=True, exist_ok=True)
        files: dict[str, str] = {}
        if "serviceAccountToken" in source:
            req = source["serviceAccountToken"]
            sa = _safe(pod["spec"].get("serviceAccountName") or "default", "service account")
            token = self.core.create_namespaced_service_account_token(sa, ns, {"spec": {
                "audiences": [req["audience"]] if req.get("audience") else [],
                "expirationSeconds": req.get("expirationSeconds", 3607),
                "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": pod["metadata"]["name"],
                                   "uid": pod["metadata"]["uid"]}}})
            files[req["path"]] = token.status.token
        elif "configMap" in source or "secret" in source:
            secret = "secret" in source
            ref = source["secret" if secret else "configMap"]
            data = self._source(ns, ref.get("name", ""), secret=secret, optional=bool(ref.get("optional"))) or {}
            items = ref.get("items") or [{"key": k, "path": k} for k in data]
            files.update({i["path"]: data[i["key"]] for i in items if i["key"] in data})
        elif "downwardAPI" in source:
            files.update({i["path"]: self._field(pod, i["fieldRef"]["fieldPath"])
                          for i in source["downwardAPI"].get("items") or [] if "fieldRef" in i})
        else:
            raise CannotRun("UnsupportedVolume", f"projected source {next(iter(source), '?')} is not mapped")
        for rel, value in files.items():
            parts = Path(rel).parts
            if Path(rel).is_absolute() or not parts or any(not KEY.match(x) or x in (".", "..") for x in parts):
                raise CannotRun("InvalidKey", f"projected path {rel!r} is not a relative path of keys")
            target = path.joinpath(*parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(value)
            target.chmod(0o600)

    def _source(self, ns: str, name: str, *, secret: bool, optional: bool) -> dict[str, str] | None:
        """A Secret's (decoded) or ConfigMap's data, None when an optional one is absent."""
        from kubernetes.client.exceptions import ApiException

        what = "secret" if secret else "configmap"
        try:
            obj = (self.core.read_namespaced_secret if secret
                   else self.core.read_namespaced_config_map)(_safe(name, what), ns)
        except ApiException as err:
            if err.status == 404 and optional:
                return None
            if err.status == 404:
                raise CannotRun("CreateContainerConfigError", f'{what} "{name}" not found') from None
            raise
        if secret:
            return {k: base64.b64decode(v).decode() for k, v in (obj.data or {}).items()}
        return dict(obj.data or {})

    def _env(self, pod: dict[str, Any], c: dict[str, Any]) -> dict[str, str]:
        """The container's environment as the kubelet makes it: envFrom first, then env in order (the last name
        wins)."""
        ns = pod["metadata"]["namespace"]
        env: dict[str, str] = {}
        for src in c.get("envFrom") or []:
            ref, secret = (src["secretRef"], True) if "secretRef" in src else (src.get("configMapRef") or {}, False)
            data = self._source(ns, ref.get("name", ""), secret=secret, optional=bool(ref.get("optional")))
            env.update({src.get("prefix", "") + k: v for k, v in (data or {}).items()})
        for item in c.get("env") or []:
            if "valueFrom" not in item:
                env[item["name"]] = expand(item.get("value", ""), env)
                continue
            src = item["valueFrom"]
            if "secretKeyRef" in src or "configMapKeyRef" in src:
                secret = "secretKeyRef" in src
                ref = src["secretKeyRef" if secret else "configMapKeyRef"]
                data = self._source(ns, ref["name"], secret=secret, optional=bool(ref.get("optional")))
                if data is not None and ref["key"] in data:
                    env[item["name"]] = data[ref["key"]]
                elif not ref.get("optional"):
                    raise CannotRun("CreateContainerConfigError", f'couldn\'t find key {ref["key"]} in {ref["name"]}')
            elif "fieldRef" in src:
                env[item["name"]] = self._field(pod, src["fieldRef"]["fieldPath"])
            else:
                raise CannotRun("CreateContainerConfigError", f"env {item['name']}: {next(iter(src))} is not played")
        return env

    @staticmethod
    def _field(pod: dict[str, Any], path: str) -> str:
        meta = pod["metadata"]
        m = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
        if m:
            return (meta.get(m.group(1)) or {}).get(m.group(2), "")
        known = {"metadata.name": meta["name"], "metadata.namespace": meta["namespace"], "metadata.uid": meta["uid"],
                 "spec.nodeName": pod["spec"]["nodeName"],
                 "spec.serviceAccountName": pod["spec"].get("serviceAccountName", ""),
                 "status.podIP": "127.0.0.1", "status.hostIP": "127.0.0.1"}
        if path not in known:
            raise CannotRun("CreateContainerConfigError", f"fieldRef {path} is not played")
        return known[path]

    def _prepare(self, pod: dict[str, Any], c: dict[str, Any],
                 volumes: Mapping[str, Path]) -> tuple[dict[str, Any], list[str], Path, dict[str, str]]:
        """(container, argv, working dir, env) of one container, its paths moved onto the volumes' folders (container
        mode: its argv wrapped to see them at their mount paths)."""
        image = c.get("image", "")
        repo = image.split("@", 1)[0]
        repo = repo.rsplit(":", 1)[0] if ":" in repo.rsplit("/", 1)[-1] else repo
        if repo not in self.images:
            raise CannotRun("ErrImagePull", f"image {repo} is not one the process kubelet has a folder for")
        mounts = {}
        for m in c.get("volumeMounts") or []:
            if m["name"] not in volumes:
                raise CannotRun("CreateContainerConfigError", f"volumeMount {m['name']}: no such volume")
            mounts[m["mountPath"]] = volumes[m["name"]] / m["subPath"] if m.get("subPath") else volumes[m["name"]]
        if self.containers:
            from tests.realcluster.containers import container_argv, container_env

            env = container_env(self.api, self._env(pod, c), self.images[repo], self.base_env)
            return c, container_argv(self, pod, c, mounts, self.images[repo], env), self.images[repo], env
        env = {k: rewrite(v, mounts) for k, v in self._env(pod, c).items()}
        argv = [expand(a, env) for a in (c.get("command") or []) + (c.get("args") or [])]
        if not argv:
            raise CannotRun("CreateContainerConfigError",
                            f"container {c['name']}: no command (an image's entrypoint is not known)")
        argv = [rewrite(a, mounts) for a in argv]
        if argv[0] in ("python", "python3"):
            argv[0] = self.python
        cwd = self.images[repo]
        if c.get("workingDir"):
            moved = rewrite(c["workingDir"], mounts)
            if moved == c["workingDir"]:
                raise CannotRun("CreateContainerConfigError", f"workingDir {moved} is on no volume")
            cwd = Path(moved)
        return c, argv, cwd, env

    def _spawn(self, uid: str, prepared: list[tuple[dict[str, Any], list[str], Path, dict[str, str]]],
               logs: Path) -> list[subprocess.Popen[bytes]]:
        procs: list[subprocess.Popen[bytes]] = []
        with self._lock:  # one step with the deletion check: a pod deleted meanwhile finds its processes to end
            if uid in self._deleted:  # deleted before its containers started: none is
                return []
            for c, argv, cwd, env in prepared:
                with open(logs / f"{_safe(c['name'], 'container')}.log", "ab") as log:
                    procs.append(subprocess.Popen(argv, cwd=cwd, env={**self.base_env, **env}, stdout=log,
                                                  stderr=subprocess.STDOUT, start_new_session=True))
            self._procs.setdefault(uid, []).extend(procs)
        return procs

    def _wait(self, proc: subprocess.Popen[bytes]) -> int:
        """The exit code as a container runtime reports it: 128 + N for a process ended by signal N (137: SIGKILL)."""
        try:
            code = proc.wait(timeout=self.deadline_s)
        except subprocess.TimeoutExpired:
            _kill(proc, 0)
            code = proc.wait()
        return 128 - code if code < 0 else code

    @staticmethod
    def _state(c: dict[str, Any], proc: subprocess.Popen[bytes], state: dict[str, Any]) -> dict[str, Any]:
        running = "running" in state
        return {"name": c["name"], "image": c["image"], "imageID": c["image"], "containerID": f"process://{proc.pid}",
                "ready": running, "started": running, "restartCount": 0, "state": state}

    def _status(self, ns: str, name: str, *, phase: str, started: str, containers: list[dict[str, Any]] | None = None,
                reason: str = "", message: str = "") -> None:
        """Read-modify-write of ``pods/status``, the scheduler's PodScheduled condition kept (retried on a conflict)."""
        from kubernetes.client.exceptions import ApiException

        for _ in range(10):
            try:
                pod = self.core.read_namespaced_pod_status(name, ns)
            except ApiException as err:
                if err.status == 404:  # deleted meanwhile: nothing left to report on
                    return
                raise
            raw = self.api.sanitize_for_serialization(pod)
            status = raw.get("status") or {}
            stamp, up = now(), phase == "Running"
            done = "PodCompleted" if phase in ("Succeeded", "Failed") else ""
            conds = [c for c in status.get("conditions") or [] if c["type"] == "PodScheduled"]
            conds += [{"type": t,
                       "status": "True" if (up or t in ("Initialized", "PodReadyToStartContainers")) else "False",
                       **({"reason": done} if done and t in ("Ready", "ContainersReady") else {}),
                       "lastTransitionTime": stamp}
                      for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady")]
            status.update({"phase": phase, "conditions": conds, "hostIP": "127.0.0.1", "hostIPs": [{"ip": "127.0.0.1"}],
                           "podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}], "startTime": started})
            if containers is not None:
                status["containerStatuses"] = containers
            if reason:
                status.update(reason=reason, message=message)
            raw["status"] = status
            try:
                self.core.replace_namespaced_pod_status(name, ns, raw)
                return
            except ApiException as err:
                if err.status == 404:
                    return
                if err.status != 409:
                    raise
        raise RuntimeError(f"pod {ns}/{name}: status kept conflicting")

    def _end(self, uid: str, grace_s: int) -> None:
        with self._lock:
            procs = list(self._procs.get(uid, []))
        for p in procs:
            _kill(p, min(grace_s, 30))

    def _force_delete(self, pod: Any) -> None:
        """The kubelet's last word on a pod being deleted whose processes are gone: delete it with grace 0."""
        from kubernetes.client.exceptions import ApiException

        try:
            self.core.delete_namespaced_pod(pod.metadata.name, pod.metadata.namespace, grace_period_seconds=0)
        except ApiException as err:
            if err.status != 404:
                raise

    def close(self) -> None:
        """Stop the threads, end every process group started, delete the nodes and their Leases."""
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        self._stop.set()
        with self._lock:
            procs = [p for ps in self._procs.values() for p in ps]
        for p in procs:
            _kill(p, 5)
        for t in self._threads:
            t.join(timeout=30)
        for node in self.nodes:
            for delete in (lambda n: self.core.delete_node(n),
                           lambda n: client.CoordinationV1Api(self.api).delete_namespaced_lease(n, LEASE_NS)):
                try:
                    delete(node)
                except ApiException as err:
                    if err.status != 404:
                        raise

    def __enter__(self) -> ProcessKubelet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _kill(proc: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGTERM to the process group this kubelet started (by its pid), SIGKILL after ``grace_s``."""
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue
