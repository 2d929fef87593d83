"""Cancelling a launcher: SIGTERM or SIGINT while it waits deletes the TrainJob it created or adopted.

KFP terminate, Argo stop, ``kubectl delete`` of the pod or Job and Ctrl-C all reach the launcher
as SIGTERM or SIGINT; the delete is ``Foreground`` with a ``uid`` precondition, then
:class:`components.errors.Interrupted` (exit 143 / 130).
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator, Mapping
from typing import Any

from components.errors import InputError, Interrupted, StepFailed
from components.trainjob.client import delete
from components.trainjob.rbac import RESOURCE

DELETE_TIMEOUT_S = 10.0  # the delete on the way out of a cancelled run (the pod's grace period is ~30 s)


class Cancel:
    """SIGTERM/SIGINT while waiting: delete the tracked TrainJob, then raise :class:`Interrupted`.

    Handlers are installed only from the main thread (elsewhere ``signal.signal`` refuses; a
    KeyboardInterrupt or Interrupted raised by the caller's own handler still deletes).
    """

    def __init__(self, custom: Any, namespace: str, signals: tuple[int, ...]) -> None:
        self.custom = custom
        self.namespace = namespace
        self.signals = signals
        self.name: str | None = None
        self.uid: str | None = None
        self.signum: int | None = None
        self._defer = False
        self._previous: dict[int, Any] = {}

    def _handler(self, signum: int, _frame: Any) -> None:
        if self.signum is not None:  # a second signal while the first is handled (the delete): ignored
            return
        self.signum = signum
        if not self._defer:
            raise Interrupted(signum)

    def __enter__(self) -> Cancel:
        if threading.current_thread() is threading.main_thread():
            for sig in self.signals:
                self._previous[sig] = signal.signal(sig, self._handler)
        return self

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        """Hold a signal until the block ends (the create request: its answer names what to delete)."""
        self._defer = True
        try:
            yield
        finally:  # the signal wins over whatever the block raised (a 409 would otherwise swallow it)
            self._defer = False
            if self.signum is not None:
                raise Interrupted(self.signum)

    def track(self, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        self.name, self.uid = meta.get("name"), meta.get("uid")

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        try:
            if isinstance(exc, (Interrupted, KeyboardInterrupt)) and self.name:
                if self.signum is None:  # no more signals from here on: the delete must go out
                    self.signum = exc.signum if isinstance(exc, Interrupted) else signal.SIGINT
                self._delete()
        finally:
            for sig, handler in self._previous.items():
                signal.signal(sig, handler)
            self._previous.clear()

    def _delete(self) -> None:
        try:
            gone = delete(self.name or "", self.namespace, custom=self.custom, uid=self.uid,
                          request_timeout=DELETE_TIMEOUT_S)
        except (InputError, StepFailed) as exc:
            print(f"llmpack: TrainJob {self.namespace}/{self.name} was not deleted: {exc}; delete it with "
                  f"`kubectl delete {RESOURCE} {self.name} -n {self.namespace}`", file=sys.stderr, flush=True)
            return
        if gone:
            print(f"llmpack: run cancelled: deleted TrainJob {self.namespace}/{self.name}", file=sys.stderr, flush=True)
