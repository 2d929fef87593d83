"""The cluster session: one run of a ``compare --cluster`` submitted, watched and handed to be measured.

:class:`Session` holds what every run of a comparison shares (parameters, each path's options,
Kubernetes access, MLflow, prices); :meth:`Session.run` takes one :class:`Plan` from submission
to its record: a pod watcher started before (or, for a path whose pods carry only the
orchestrator's run id, right after) the submission, live progress from the pods, then
:func:`~llmpack.cluster.compare.measure.measure`. :func:`preflight` checks every path and the pod
watcher's access before anything is submitted.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from components.errors import InputError
from components.record import cost, telemetry
from llmpack.backends import cluster_path, cluster_submitter
from llmpack.cluster.compare.measure import MODE, measure
from llmpack.cluster.compare.pods import Plan, describe, fused_tasks, mine, pod_step_aliases
from llmpack.cluster.k8s.billing import pod_gpus_by_step

# (label, message, elapsed seconds since this run started)
Progress = Callable[[str, str, float], None]


@dataclass
class Session:
    """What every run of one comparison shares; :meth:`run` runs one :class:`Plan`."""

    run_group: str
    values: dict[str, Any]
    conf: dict[str, dict[str, Any]]
    k8s: dict[str, Any]
    uri: str
    price_flag: Any
    price_file: str | None
    timeout_s: float
    poll_s: float
    progress: Progress | None
    pipe: Any  # the pipeline as authored (sized by --gpus/--nodes), unfused
    scale_down_delay_s: float = cost.DEFAULT_SCALE_DOWN_DELAY_S
    gang: tuple[int, int] | None = None  # finetune as a TrainJob: (nodes, GPUs per node)
    pipes: dict[str, Any] = field(default_factory=dict)  # fuse mode -> that variant's compiled pipeline
    artifacts: dict[str, dict[str, str]] = field(default_factory=dict)  # fuse mode -> orchestrator -> compiled file
    submit_lock: threading.Lock = field(default_factory=threading.Lock)
    opencost: str | None = None  # --opencost: OpenCost's API, read once all runs ended (llmpack.cluster.k8s.reconcile)
    # --preempt: a llmpack.cluster.k8s.preemption.PreemptSpec, evicted by llmpack.cluster.k8s.preempt_inject
    preempt: Any = None

    def pipe_of(self, fuse: str) -> Any:
        return self.pipes.get(fuse, self.pipe)

    def pod_uses(self, fuse: str = "none") -> list[cost.GpuUse]:
        """What each authored step's pod holds (a gang's launcher: no GPU; a fused pod's members: its GPUs)."""
        from components.record.close import gpu_uses

        return gpu_uses(self.pipe_of(fuse))

    def step_uses(self, fuse: str = "none") -> list[cost.GpuUse]:
        """What each step holds: finetune as a gang holds nodes x GPUs per node."""
        from dataclasses import replace

        if self.gang is None:
            return self.pod_uses(fuse)
        total = self.gang[0] * self.gang[1]
        return [replace(u, gpus=total) if u.step == telemetry.TRAIN_STEP else u for u in self.pod_uses(fuse)]

    def pod_gpus(self, fuse: str) -> dict[str, int]:
        """GPUs by a pod's ``llmpack.io/step`` in this variant (:func:`pod_gpus_by_step`)."""
        return pod_gpus_by_step(self.pod_uses(fuse), fused_tasks(self.pipe_of(fuse)))

    # ------------------------------------------------------------------ helpers

    def notify(self, label: str, message: str, t0: float) -> None:
        if self.progress is not None:
            with contextlib.suppress(Exception):  # a display error must not lose a run
                self.progress(label, message, time.monotonic() - t0)

    def pod_namespace(self, orch: str) -> str:
        return cluster_path(orch).pod_namespace(self.conf[orch])

    def api_client(self) -> Any:
        from llmpack.cluster.k8s.api import build_api_client

        return build_api_client(**self.k8s)

    def start_watcher(self, namespace: str, run_ids: Mapping[str, str] | None = None) -> Any:
        from llmpack.cluster.k8s.watcher import PodWatcher

        api_client = self.api_client()
        try:
            watcher = PodWatcher(api_client, namespace, self.run_group, run_ids=dict(run_ids or {}),
                                 window_s=max(1, int(min(60.0, self.timeout_s))))
            return watcher.start(timeout_s=self.timeout_s + 120.0)
        except BaseException:
            api_client.close()
            raise

    # ------------------------------------------------------------------ one run

    def secrets(self) -> tuple[str, ...]:
        values = [c.get("token") for c in self.conf.values()] + [self.k8s.get("token")]
        return tuple(str(v) for v in values if v)

    def run(self, plan: Plan) -> dict[str, Any]:
        """One run, start to end; whatever goes wrong, a record (failed, with one line) comes back."""
        from components.servers.remote import one_line

        t0 = time.monotonic()
        try:
            return self._run(plan, t0)
        except Exception as exc:  # noqa: BLE001 - one path's surprise must not lose the others
            error = one_line(f"{type(exc).__name__}: {exc}", self.secrets())
            self.notify(plan.label, f"failed: {error}", t0)
            return {**self._blank(plan), "error": error,
                    "tags": {**self._blank(plan)["tags"], "llmpack.status": "failed", "llmpack.error": error}}

    def _blank(self, plan: Plan) -> dict[str, Any]:
        from components.fusion import FUSE_TAG

        return {
            "run_group": self.run_group,
            "pipeline_run": plan.pipeline_run,
            "orchestrator": plan.orchestrator,
            "fuse": plan.fuse,
            "mode": MODE,
            "status": "failed",
            "error": None,
            "failed_step": None,
            "submitted_at": None,
            "finished_at": None,
            "state": None,
            "metrics": {},
            "tags": {"llmpack.run_group": self.run_group, "llmpack.pipeline_run": plan.pipeline_run,
                     "llmpack.orchestrator": plan.orchestrator, "llmpack.mode": MODE, FUSE_TAG: plan.fuse},
            "events": {},
            "artifacts": {},
            "pods": [],
            "warnings": [],
        }

    def _run(self, plan: Plan, t0: float) -> dict[str, Any]:
        live: list[Any] = []  # watchers started and not finished yet: finished whatever happens
        try:
            return self._run_watched(plan, t0, live)
        finally:
            for watcher in live:
                with contextlib.suppress(Exception):
                    watcher.finish(5.0)
                with contextlib.suppress(Exception):
                    watcher.api_client.close()

    def _run_watched(self, plan: Plan, t0: float, live: list[Any]) -> dict[str, Any]:
        from llmpack.cluster import submit

        orch = plan.orchestrator
        path = cluster_path(orch)
        conf = self.conf[orch]
        record = self._blank(plan)
        watcher = None
        self.notify(plan.label, "submitting", t0)
        if path.watch_before_submit:  # its pods carry the run group: watch before they exist
            watcher = self._safe_start(self.pod_namespace(orch), None, record, live)
        try:
            kwargs = {k: v for k, v in conf.items() if k not in path.own_options}
            if orch in self.artifacts.get(plan.fuse, {}):  # this variant's compiled file
                kwargs[path.artifact_option] = self.artifacts[plan.fuse][orch]
            with self.submit_lock:  # client libraries swap sys.stdout while they construct
                summary = submit.submit(orch, params=self.values, run_group=self.run_group,
                                        pipeline_run=plan.pipeline_run, tracking_uri=self.uri,
                                        price_per_gpu_hour=self.price_flag, price_file=self.price_file, **kwargs)
        except InputError as exc:
            record["error"] = str(exc)
            record["tags"].update({"llmpack.status": "failed", "llmpack.error": str(exc)})
            self._stop(watcher, record, live)
            self.notify(plan.label, f"failed: {exc}", t0)
            return record

        record["submitted_at"] = summary["submitted_at"]
        record["warnings"] += list(summary.get("warnings") or ())
        record["artifacts"] = {k: summary[k] for k in ("server_id", "url", "namespace", "mlflow_run_id", "tracking_uri")
                               if summary.get(k) is not None}
        if not path.watch_before_submit:  # its pods carry only its run id, known now (the first list finds what exists)
            watcher = self._safe_start(self.pod_namespace(orch), {summary["run_id"]: plan.pipeline_run}, record, live)
        elif summary.get("namespace") and watcher is not None and summary["namespace"] != watcher.namespace:
            self._stop(watcher, record, live)
            watcher = self._safe_start(summary["namespace"], None, record, live)
        self.notify(plan.label, "submitted", t0)

        stop_progress = threading.Event()
        ticker = None
        if self.progress is not None and watcher is not None:
            ticker = threading.Thread(target=self._tick, args=(plan, watcher, t0, stop_progress), daemon=True)
            ticker.start()
        wait_kwargs = {k: conf[k] for k in path.wait_options if conf.get(k) is not None}
        injector = self._start_injector(plan, watcher)
        try:
            result = submit.wait_for_completion(summary, timeout_s=self.timeout_s, poll_s=self.poll_s, **wait_kwargs)
        except InputError as exc:
            result = {"status": "error", "state": "unknown", "error": str(exc)}
        finally:
            stop_progress.set()
            if ticker is not None:
                ticker.join(5.0)
            if injector is not None:
                record["evictions"] = injector.stop()
                record["warnings"] += injector.warnings
        rows = self._stop(watcher, record, live)
        measure(self, plan, summary, result, rows, record)
        mark = "succeeded" if record["status"] == "succeeded" else f"failed: {record['error']}"
        self.notify(plan.label, mark, t0)
        return record

    def _start_injector(self, plan: Plan, watcher: Any) -> Any:
        """``--preempt``: evict this run's pod of the step when due (:mod:`llmpack.cluster.k8s.preempt_inject`)."""
        if self.preempt is None or watcher is None:
            return None
        from llmpack.cluster.k8s.preempt_inject import PreemptInjector

        aliases = pod_step_aliases(fused_tasks(self.pipe_of(plan.fuse)))
        steps = {self.preempt.step, *(pod for pod, step in aliases.items() if step == self.preempt.step)}
        # a TrainJob's node pod, not its launcher
        gang = self.gang is not None and self.preempt.step == telemetry.TRAIN_STEP
        return PreemptInjector(watcher.api_client, self.preempt, lambda: mine(watcher.rows(), plan.pipeline_run),
                               pod_steps=steps, gang=gang).start()

    def _safe_start(self, namespace: str, run_ids: Mapping[str, str] | None, record: dict[str, Any],
                    live: list[Any]) -> Any:
        """A started watcher, or None with a warning (the run is still measured from its own events)."""
        try:
            watcher = self.start_watcher(namespace, run_ids)
        except InputError as exc:
            record["warnings"].append(f"pod watcher: {exc}")
            return None
        live.append(watcher)
        return watcher

    def _stop(self, watcher: Any, record: dict[str, Any], live: list[Any]) -> list[dict[str, Any]]:
        if watcher is None:
            return []
        with contextlib.suppress(ValueError):
            live.remove(watcher)
        try:
            rows = watcher.finish()
        except Exception as exc:  # noqa: BLE001 - the run's own events still count
            record["warnings"].append(f"pod watcher: {exc}")
            return []
        finally:
            with contextlib.suppress(Exception):
                watcher.api_client.close()
        record["warnings"] += [f"pod watcher: {w}" for w in watcher.warnings]
        record.setdefault("nodes", []).extend(watcher.nodes())
        return rows

    def _tick(self, plan: Plan, watcher: Any, t0: float, stop: threading.Event) -> None:
        while not stop.wait(min(1.0, max(0.2, self.poll_s))):
            try:
                text = describe(mine(watcher.rows(), plan.pipeline_run))
            except Exception:  # noqa: BLE001 - progress is best effort
                continue
            self.notify(plan.label, text, t0)


def _check_pod_access(api_client: Any, namespace: str) -> None:
    """The watcher's access, before anything is submitted: the namespace exists, pods can be listed."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from llmpack.cluster.k8s.api import api_error

    core = client.CoreV1Api(api_client)
    try:
        core.read_namespace(namespace, _request_timeout=15)
    except ApiException as exc:
        if exc.status == 404:
            raise InputError(f"namespace {namespace!r} not found on the Kubernetes API at "
                             f"{api_client.configuration.host}") from None
        if exc.status != 403:  # namespaced credentials often cannot read Namespace objects
            raise api_error(exc, api_client, f"read namespace {namespace!r}") from None
    except Exception as exc:  # noqa: BLE001 - unreachable: one line
        raise api_error(exc, api_client, f"read namespace {namespace!r}") from None
    try:
        core.list_namespaced_pod(namespace, limit=1, _request_timeout=15)
    except Exception as exc:  # noqa: BLE001
        raise api_error(exc, api_client, f"list pods in namespace {namespace!r}") from None


def preflight(session: Session, backends: list[str]) -> None:
    for orch in backends:
        cluster_submitter(orch).check_connection(session.conf[orch])
    api_client = session.api_client()
    try:
        for namespace in dict.fromkeys(session.pod_namespace(o) for o in backends):
            _check_pod_access(api_client, namespace)
    finally:
        api_client.close()
