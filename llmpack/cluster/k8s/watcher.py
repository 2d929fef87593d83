"""Watch the pods of one run group with the real ``kubernetes`` client; return their phases.

One watch per label selector: ``llmpack.io/run-group=<id>``, plus, for a backend whose pods cannot
carry our labels, its own run-id selector (KFP's ``pipeline/runid``); a TrainJob gang's node pods
carry our labels. Memory is proportional to pods, not events (:func:`~llmpack.cluster.k8s.slim.slim_pod`);
watch expiry (410) is survived by re-listing (:class:`~llmpack.cluster.k8s.resumable.ResumableWatch`);
nodes and image-pull events are read beside the watch (:mod:`~llmpack.cluster.k8s.sidereads`). It stops
when ``until(rows)`` holds, at ``timeout_s``, or on :meth:`PodWatcher.stop`, and returns
:func:`~llmpack.cluster.k8s.podphases.analyze` rows.

Errors a user can act on are one :class:`components.errors.InputError` line, never with the token.
``kubernetes`` is imported inside the functions. Each choice and why: docs/internals/pod-watcher.md.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from components.errors import InputError
from llmpack.backends import run_id_selectors
from llmpack.cluster.k8s import RUN_GROUP_LABEL
from llmpack.cluster.k8s.api import api_error, is_network_error
from llmpack.cluster.k8s.objects import TERMINAL_PHASES
from llmpack.cluster.k8s.pod_reads import PodReads
from llmpack.cluster.k8s.podphases import all_terminated, analyze
from llmpack.cluster.k8s.preemption import attempt_outcome
from llmpack.cluster.k8s.resumable import ResumableWatch
from llmpack.cluster.k8s.sidereads import SideReads
from llmpack.cluster.k8s.slim import slim_pod

SANDBOX_CONDITIONS = ("PodReadyToStartContainers", "PodHasNetwork")
QUICK_EVERY_S = 0.02  # how often the O(pods) "is some pod still running?" check may run (microseconds each)

Rows = list[dict[str, Any]]


# --------------------------------------------------------------------------- the watcher


def _never(rows: Rows) -> bool:
    return False


def _rv_int(obj: Mapping[str, Any]) -> int | None:
    try:
        return int(obj["metadata"]["resourceVersion"])
    except (KeyError, TypeError, ValueError):
        return None


class PodWatcher(PodReads):
    """Watches the pods of run group ``run_group`` in ``namespace``; :meth:`run` returns their rows.

    ``api_client`` is a ``kubernetes.client.ApiClient`` (see :func:`~llmpack.cluster.k8s.api.build_api_client`).
    ``run_ids`` (an orchestrator's own run id -> pipeline_run, or just run ids) adds a watch for
    the pods of those runs, for each cluster backend whose pods cannot carry
    ``llmpack.io/run-group`` (labels fixed at compile time: KFP's drivers and executors): found by
    its ``PodMarks.unlabelled_selector`` and run-id label, the run id coming back at submit.
    ``window_s`` is the server-side ``timeoutSeconds`` of each watch request (the watch resumes
    from the last resourceVersion after each); ``request_timeout_s`` bounds connects and
    non-watch calls.
    """

    def __init__(
        self,
        api_client: Any,
        namespace: str,
        run_group: str,
        *,
        run_ids: Mapping[str, str | None] | Iterable[str] = (),
        window_s: int = 60,
        request_timeout_s: float = 15.0,
        events_every_s: float = 300.0,
        nodes_every_s: float = 60.0,
        max_failures: int = 5,
    ) -> None:
        if not run_group:
            raise InputError("the pod watcher needs a run group id (label llmpack.io/run-group)")
        self.api_client = api_client
        self.namespace = namespace
        self.run_group = run_group
        if isinstance(run_ids, Mapping):
            self.run_ids: dict[str, str | None] = dict(run_ids)
        else:
            self.run_ids = dict.fromkeys(run_ids)
        self.selectors = [f"{RUN_GROUP_LABEL}={run_group}"]
        if self.run_ids:
            ids = ",".join(sorted(self.run_ids))
            # pods that cannot carry our run-group label (KFP's drivers and executors): found by run id.
            self.selectors.extend(f"{sel},!{RUN_GROUP_LABEL},{label} in ({ids})" for sel, label in run_id_selectors())
        self.window_s = max(1, int(window_s))
        self.request_timeout_s = request_timeout_s
        self.events_every_s = events_every_s
        self.nodes_every_s = nodes_every_s
        self.max_failures = max_failures
        self.warnings: list[str] = []
        self.stats = {"events": 0, "lists": 0, "relists": 0, "watches": 0, "expired": 0}
        self.stopped_by: str | None = None
        self._lock = threading.Condition()
        self._pods: dict[str, dict[str, Any]] = {}
        self._members: list[set[str]] = [set() for _ in self.selectors]
        self._deleted: set[str] = set()
        self._names: set[tuple[str, str]] = set()  # (namespace, name) of every pod seen
        # A compaction expires both watches at once: their re-lists, each a transient copy of a whole
        # collection, take turns, so the peak holds one of them, not both (benchmarks/watcher_load.py).
        self._relisting = threading.Lock()
        self._side = SideReads(self._core, namespace, self._timeout, self.warnings, self._is_ours, self._relisting)
        self._version = 0
        # the last analysis, by (pod version, side reads version)
        self._rows: tuple[tuple[int, int], Rows] | None = None
        self._stop_requested = False
        self._stopping = False
        self._error: BaseException | None = None
        self._watches: list[ResumableWatch] = []
        self._bg: threading.Thread | None = None
        self._bg_error: BaseException | None = None
        self._result: Rows | None = None

    # ------------------------------------------------------------------ public

    def stop(self) -> None:
        """Ask :meth:`run` to return now (thread-safe)."""
        with self._lock:
            self._stop_requested = True
            self._lock.notify_all()

    def rows(self) -> Rows:
        """The current rows (analysis of the latest state of every pod seen so far).

        The analysis is O(pods): it is redone only when a pod, node or event changed since the
        last call (the stop condition and the final rows often see the same state); each call
        gets its own row dicts.
        """
        side_version = self._side.settle()  # held pull events of pods seen since: moves the version now, not later
        with self._lock:
            key = (self._version, side_version)
            cached = self._rows
            if cached is None or cached[0] != key:
                pods = list(self._pods.items())
                deleted = set(self._deleted)
        if cached is None or cached[0] != key:
            self._rows = None  # not kept alive while the next analysis builds its rows
            nodes, events = self._side.snapshot()
            rows = analyze([p for _, p in pods], nodes, events, run_group=self.run_group, runs=self.run_ids)
            deleted_names = {(p["metadata"].get("namespace") or "", p["metadata"]["name"])
                             for k, p in pods if k in deleted}
            for row in rows:
                row["deleted"] = (row["namespace"], row["pod"]) in deleted_names
                row["outcome"] = attempt_outcome(row)  # a pod deleted unfinished failed, unless disrupted
            cached = self._rows = (key, rows)
        return [dict(row) for row in cached[1]]

    def nodes(self) -> list[dict[str, Any]]:
        """Facts of every node our pods ran on (:func:`~llmpack.cluster.k8s.slim.node_facts`),
        ``removed`` filled in from a re-read that found the node gone."""
        return self._side.facts()

    def _some_pod_running(self) -> bool:
        """Cheap check on the stored pods (no analysis): one that is neither finished nor deleted."""
        with self._lock:
            return any(
                p["status"].get("phase") not in TERMINAL_PHASES and key not in self._deleted
                for key, p in self._pods.items()
            )

    @property
    def event_stats(self) -> dict[str, int]:
        """The pull-event watch's counts: ``watches`` (requests), ``expired`` (410s), ``events``
        (received), ``listings`` (whole listings: the first, re-lists, the last if any)."""
        return self._side.event_stats

    @property
    def pod_count(self) -> int:
        with self._lock:
            return len(self._pods)

    def run(
        self,
        *,
        until: Callable[[Rows], bool] | None = None,
        timeout_s: float | None = None,
        poll_s: float = 0.1,
        eval_every_s: float = 0.2,
    ) -> Rows:
        """Watch until ``until(rows)`` (default :func:`all_terminated`), ``timeout_s``, or :meth:`stop`.

        Returns the final rows; ``stopped_by`` says why ("condition", "deadline" or "stop").
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        self._prepare(deadline)
        return self._loop(until or all_terminated(), deadline, poll_s, eval_every_s)

    def start(self, *, until: Callable[[Rows], bool] | None = None, timeout_s: float | None = None) -> PodWatcher:
        """Check access and list now (errors raise here), then watch in a background thread.

        For a caller that learns from the orchestrator when the run is over: submit, ``start()``,
        wait for the run, then :meth:`finish`. ``until`` defaults to never (only :meth:`finish`,
        :meth:`stop` or ``timeout_s`` end it), since pods come and go between steps.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        self._prepare(deadline)

        def target() -> None:
            try:
                self._result = self._loop(until or _never, deadline, 0.1, 0.2)
            except BaseException as exc:  # re-raised by finish()
                self._bg_error = exc

        self._bg = threading.Thread(target=target, name="pod-watcher", daemon=True)
        self._bg.start()
        return self

    def finish(self, timeout_s: float = 30.0) -> Rows:
        """Stop a :meth:`start`-ed watch and return its rows (or raise its error)."""
        if self._bg is None:
            raise RuntimeError("finish() without start()")
        self.stop()
        self._bg.join(timeout_s)
        if self._bg_error is not None:
            raise self._bg_error
        if self._result is None:
            raise RuntimeError(f"the pod watcher did not stop within {timeout_s} s")
        return self._result

    def _prepare(self, deadline: float | None) -> None:
        self._prepare_by = deadline  # the first reads answer within the run's own deadline, however slow the server
        try:
            self._check_namespace()
            rvs = [self._initial_list(i, sel) for i, sel in enumerate(self.selectors)]
        finally:
            self._prepare_by = None
        for i, sel in enumerate(self.selectors):
            threading.Thread(target=self._watch_loop, args=(i, sel, rvs[i]), name=f"pod-watch-{i}", daemon=True).start()
        try:  # the pod watches already run: the node reads and the event listing beside them
            self._side.fetch_nodes()
            self._side.watch_events(window_s=self.window_s, max_failures=self.max_failures,
                                    request_timeout=self._timeout(self.window_s + self.request_timeout_s))
        except BaseException:
            self._shutdown()  # no watch left running behind an error
            raise

    def _loop(self, until: Callable[[Rows], bool], deadline: float | None, poll_s: float, eval_every_s: float) -> Rows:
        quick_no = self._some_pod_running if getattr(until, "requires_all_terminal", False) else None
        seen_version, last_eval, last_events = -1, 0.0, time.monotonic()
        last_nodes = last_events
        try:
            while True:
                with self._lock:
                    if not (self._stop_requested or self._error) and self._version == seen_version:
                        self._lock.wait(poll_s)  # woken by the next pod event
                    version, error, stop_requested = self._version, self._error, self._stop_requested
                throttle = eval_every_s - (time.monotonic() - last_eval)
                if version != seen_version and throttle > 0 and not (error or stop_requested):
                    time.sleep(min(throttle, poll_s))  # batch the events of a burst into one evaluation
                if error is not None:
                    raise error
                if stop_requested:
                    self.stopped_by = "stop"
                    break
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    self.stopped_by = "deadline"
                    break
                self._side.fetch_nodes()
                if now - last_events >= self.events_every_s and not self._side.events_watched:
                    self._side.refresh_events()  # the event watch was refused or gave up
                    last_events = now
                if now - last_nodes >= self.nodes_every_s:
                    self._side.recheck_nodes()
                    last_nodes = now
                if until is _never:
                    seen_version = version
                elif version != seen_version and now - last_eval >= eval_every_s:
                    seen_version, last_eval = version, now
                    if quick_no is not None and quick_no():
                        # the cheap check may come again sooner than the analysis: after a burst's
                        # last event the stop waited up to eval_every_s for nothing
                        last_eval = now - eval_every_s + QUICK_EVERY_S
                        continue
                    began = time.monotonic()
                    done = until(self.rows())
                    # the analysis is O(pods): keep it under a tenth of the time on big run groups
                    eval_every_s = max(eval_every_s, 10 * (time.monotonic() - began))
                    if done:
                        self.stopped_by = "condition"
                        break
        finally:
            self._shutdown()
        self._final_reads()
        # The watch threads are stopped: each ends at its next event or at the server's window end
        # (daemons; a join waited its full timeout on a thread blocked in a read). What they
        # receive from now on is dropped (see _watch_loop), so these rows are the last.
        return self.rows()

    def _final_reads(self) -> None:
        """The last node reads and, only where the event watch left a gap, a last event listing,
        side by side: both wait on the API server, and at the end of a run nothing else does."""
        with self._lock:
            started = [(p["metadata"].get("namespace") or "", p["metadata"]["name"])
                       for p in self._pods.values() if _started_a_container(p)]
        failed: list[BaseException] = []

        def events() -> None:
            try:
                self._side.refresh_events()
            except BaseException as exc:  # re-raised below, in the caller's thread
                failed.append(exc)

        lister = None
        if not self._side.events_complete(started):
            lister = threading.Thread(target=events, name="pod-watch-events", daemon=True)
            lister.start()
        try:
            self._side.fetch_nodes()
            self._side.recheck_nodes()
        finally:
            if lister is not None:
                lister.join()
        if failed:
            raise failed[0]

    def _is_ours(self, namespace: str, name: str) -> bool:
        return (namespace, name) in self._names

    def _initial_list(self, index: int, selector: str) -> str:
        try:
            items, rv = self._list_pods(selector)
        except Exception as exc:
            if is_network_error(exc) or type(exc).__name__ == "ApiException":
                raise api_error(exc, self.api_client, f"list pods in namespace {self.namespace!r}") from None
            raise
        with self._lock:
            for obj in items:
                self._apply_locked(index, "ADDED", obj)
        return rv

    def _relist(self, index: int, selector: str) -> str:
        with self._relisting:
            return self._relist_turn(index, selector)

    def _relist_turn(self, index: int, selector: str) -> str:
        items, rv = self._list_pods(selector)
        with self._lock:
            if self._stopping:
                return rv
            fresh = set()
            for obj in items:
                fresh.add(self._apply_locked(index, "MODIFIED", obj))
            for key in self._members[index] - fresh:
                self._deleted.add(key)  # deleted while we were not watching: keep the last state
            self.stats["relists"] += 1  # before the notify: a reader woken by it sees the count
            self._version += 1
            self._lock.notify_all()
        return rv

    # ------------------------------------------------------------------ state

    def _apply_locked(self, index: int, etype: str, raw: Mapping[str, Any]) -> str:
        slim = slim_pod(raw)
        meta = slim["metadata"]
        key = meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}"
        prev = self._pods.get(key)
        if prev is not None:
            new_rv, old_rv = _rv_int(slim), _rv_int(prev)
            if new_rv is not None and old_rv is not None and new_rv < old_rv:
                return key  # an older state, from the other selector's stream
            _keep_sandbox_time(prev, slim)
        else:
            self._names.add((meta.get("namespace") or "", meta.get("name") or ""))
        self._pods[key] = slim
        self._members[index].add(key)
        if etype == "DELETED":
            self._deleted.add(key)
        node = slim["spec"].get("nodeName")
        if node:
            self._side.want(node)
        self._version += 1
        self._lock.notify_all()
        return key

    def _watch_loop(self, index: int, selector: str, rv: str) -> None:
        def apply(etype: str, obj: dict[str, Any]) -> None:
            with self._lock:
                if self._stopping:
                    return  # after the stop: the rows are being, or were, returned
                self._apply_locked(index, etype, obj)
                self.stats["events"] += 1

        loop = ResumableWatch(
            list_func=self._core().list_namespaced_pod,
            namespace=self.namespace,
            selectors={"label_selector": selector},
            window_s=self.window_s,
            request_timeout=self._timeout(self.window_s + self.request_timeout_s),
            apply=apply,
            relist=lambda: self._relist(index, selector),
            stopping=lambda: self._stopping,
            max_failures=self.max_failures,
            stats=self.stats,
        )
        self._watches.append(loop)
        error = loop.run(rv)
        if error is not None:
            self._fail(self._as_input_error(error, f"watch pods in namespace {self.namespace!r}"))

    def _as_input_error(self, exc: BaseException, doing: str) -> BaseException:
        """An API or network error as the one line a user reads; anything else as it is."""
        if is_network_error(exc) or type(exc).__name__ == "ApiException":
            return api_error(exc, self.api_client, doing)
        return exc

    def _fail(self, exc: BaseException) -> None:
        with self._lock:
            if self._error is None:
                self._error = exc
            self._lock.notify_all()

    def _shutdown(self) -> None:
        with self._lock:  # under the lock: no watch thread applies an event after this
            self._stopping = True
        for loop in list(self._watches):
            loop.stop()
        self._side.stop()


def _started_a_container(pod: Mapping[str, Any]) -> bool:
    """Whether a (slim) pod's container ever started: its image was there, so kubelet said Pulled."""
    for st in pod["status"].get("containerStatuses") or ():
        for which in ("state", "lastState"):
            state = st.get(which) or {}
            if any((state.get(sub) or {}).get("startedAt") for sub in ("running", "terminated")):
                return True
    return False


def _keep_sandbox_time(prev: Mapping[str, Any], new: dict[str, Any]) -> None:
    """A finished pod's sandbox is torn down and PodReadyToStartContainers turns False: keep when it was ready."""
    old = {c.get("type"): c for c in prev["status"].get("conditions") or ()}
    conditions: Sequence[dict[str, Any]] = new["status"].get("conditions") or []
    for i, cond in enumerate(conditions):
        ctype = cond.get("type")
        if ctype in SANDBOX_CONDITIONS and cond.get("status") != "True":
            before = old.get(ctype)
            if before is not None and before.get("status") == "True":
                new["status"]["conditions"][i] = dict(before)
