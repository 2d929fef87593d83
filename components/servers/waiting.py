"""Waiting for a run on a cluster, written once for every orchestrator's ``wait_for_*``.

Each backend reads its own object (a KFP run, an Argo Workflow, a Kubernetes Job) and says what
its state means; what they share is here: the options every wait takes (:class:`WaitOptions`,
with their defaults) and the poll loop whose failed read is one line for the user
(:func:`poll_object`), never a traceback, never a token.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypedDict, TypeVar

from components.errors import InputError
from components.servers.remote import POLL_S, REQUEST_TIMEOUT_S, WAIT_TIMEOUT_S, poll

T = TypeVar("T")


class WaitOptions(TypedDict, total=False):
    """The keywords every ``wait_for_*`` takes beside its run's id and its connection."""

    timeout_s: float  # give up (status "timeout") after this long; default WAIT_TIMEOUT_S
    poll_s: float  # between two reads; default POLL_S
    request_timeout_s: float  # the limit of one read; default REQUEST_TIMEOUT_S
    ca_cert: str | None  # trust this CA (a file)
    insecure_skip_tls_verify: bool  # do not check the server's certificate


def wait_options(options: WaitOptions) -> dict[str, Any]:
    """``options`` with every default filled in."""
    return {"timeout_s": WAIT_TIMEOUT_S, "poll_s": POLL_S, "request_timeout_s": REQUEST_TIMEOUT_S,
            "ca_cert": None, "insecure_skip_tls_verify": False, **options}


def poll_object(fetch: Callable[[], T], state: Callable[[T], tuple[str | None, dict[str, Any]]],
                error: Callable[[BaseException], InputError], options: WaitOptions) -> dict[str, Any]:
    """Read the object with ``fetch`` until ``state`` says it ended (or the timeout).

    A failed read raises ``error(exc)``.
    """
    opts = wait_options(options)

    def read() -> tuple[str | None, dict[str, Any]]:
        try:
            obj = fetch()
        except Exception as exc:  # noqa: BLE001 - one line for the user
            raise error(exc) from None
        return state(obj)

    return poll(read, timeout_s=opts["timeout_s"], poll_s=opts["poll_s"])
