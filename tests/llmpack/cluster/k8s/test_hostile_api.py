"""An API server that answers with garbage, with broken watch events, or slowly: one line or rows, in time.

A loopback server that is not Kubernetes plays each answer; the real kubernetes client and the pod
watcher read it. Before: garbage was a JSONDecodeError traceback, and a server that took 30 s to
answer held a watch given 4 s for over a minute (urllib3 retried each timed-out read three times,
and the first reads ignored the run's deadline).
"""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from components.errors import InputError
from llmpack.cluster.k8s.api import build_api_client
from llmpack.cluster.k8s.watcher import PodWatcher

NS = "llmpack"
Answer = Callable[[http.server.BaseHTTPRequestHandler], None]


def _send(h: http.server.BaseHTTPRequestHandler, body: bytes, status: int = 200) -> None:
    h.send_response(status)
    h.send_header("Content-Type", "application/json")
    h.send_header("Content-Length", str(len(body)))
    h.end_headers()
    h.wfile.write(body)


def garbage(h: http.server.BaseHTTPRequestHandler) -> None:
    _send(h, b"<html>a proxy's login page, not Kubernetes</html>")


def broken_events(h: http.server.BaseHTTPRequestHandler) -> None:
    """Empty lists, then a watch stream of a line that is not JSON and an event whose object is not one."""
    path = h.path.split("?")[0]
    if "watch=true" in h.path:
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.end_headers()
        h.wfile.write(b"this is not json\n" + json.dumps({"type": "ADDED", "object": "not an object"}).encode() + b"\n")
        h.wfile.flush()
        time.sleep(1)
        return
    if path.endswith(f"/namespaces/{NS}"):
        _send(h, json.dumps({"kind": "Namespace", "apiVersion": "v1", "metadata": {"name": NS}}).encode())
        return
    _send(h,
          json.dumps({"kind": "List", "apiVersion": "v1", "metadata": {"resourceVersion": "5"}, "items": []}).encode())


def slow(h: http.server.BaseHTTPRequestHandler) -> None:
    time.sleep(20)  # longer than the watch may take; the server's thread ends by itself


@pytest.fixture
def server() -> Iterator[Callable[[Answer], str]]:
    servers: list[http.server.ThreadingHTTPServer] = []

    def start(answer: Answer) -> str:
        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                answer(self)

        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        srv.daemon_threads = True
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return f"http://127.0.0.1:{srv.server_address[1]}"

    yield start
    for srv in servers:
        srv.shutdown()
        srv.server_close()


def _watch(url: str, timeout_s: float) -> tuple[object, float]:
    client = build_api_client(host=url, token="hostile-test-token")
    began = time.monotonic()
    try:
        return PodWatcher(client, NS, "rg-1", window_s=1).run(timeout_s=timeout_s), time.monotonic() - began
    except InputError as exc:
        return exc, time.monotonic() - began


def test_an_answer_that_is_not_json_is_one_line(server: Callable[[Answer], str]) -> None:
    error, _ = _watch(server(garbage), timeout_s=4)
    assert isinstance(error, InputError)
    assert str(error).startswith('the Kubernetes API answered with something that is not JSON (it starts "<html>')
    assert "\n" not in str(error)


def test_broken_watch_events_are_passed_over(server: Callable[[Answer], str]) -> None:
    rows, took = _watch(server(broken_events), timeout_s=3)
    assert rows == [] and took < 10


def test_a_slow_server_cannot_hold_the_watch_past_its_deadline(server: Callable[[Answer], str]) -> None:
    error, took = _watch(server(slow), timeout_s=3)
    assert isinstance(error, InputError) and "timed out" in str(error), error
    assert took < 8, took  # its deadline plus a little, not 4 x 15 s of retried reads
