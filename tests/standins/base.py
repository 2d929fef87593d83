"""What every stand-in server shares: a threaded HTTP/1.1 JSON server on 127.0.0.1 with bearer auth.

A stand-in subclasses :class:`StandInServer` (lifecycle, ``url``, the recorded requests) and gives
:meth:`StandInServer.handler` a :class:`StandInHandler` subclass whose ``_handle(method)`` starts
with :meth:`StandInHandler._receive` (parse, authenticate, record) and answers with
:meth:`StandInHandler._json`. Every request is recorded without its ``Authorization`` header.
"""

from __future__ import annotations

import json
import ssl
import threading
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar
from urllib.parse import SplitResult, parse_qsl, urlsplit

S = TypeVar("S", bound="StandInServer")


@dataclass
class RecordedRequest:
    """One request the stand-in received (the Authorization header is never kept)."""

    method: str
    path: str
    query: dict[str, str]
    body: Any = None
    authorized: bool = True
    headers: dict[str, str] = field(default_factory=dict)


def utc_now() -> str:
    """Now, as the RFC 3339 second-resolution UTC time servers put in object metadata."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class StandInServer:
    """A server on 127.0.0.1, on a free port. Use as a context manager, or ``start()`` / ``close()``."""

    thread_name = "standin"
    poll_interval_s = 0.5  # how often serve_forever checks for shutdown
    request_type: type[RecordedRequest] = RecordedRequest

    def __init__(self, *, token: str | None, tls: ssl.SSLContext | None = None) -> None:
        self.token = token  # None: no auth
        self.tls = tls  # a server-side context: serve https (see tests/backends/test_tls.py for a self-signed one)
        self.requests: list[RecordedRequest] = []
        self._server: ThreadingHTTPServer | None = None
        self._port: int | None = None
        self._thread: threading.Thread | None = None

    def handler(self) -> type[BaseHTTPRequestHandler]:
        """The request handler class, bound to this server's state."""
        raise NotImplementedError

    def start(self: S) -> S:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self.handler())
        self._server.daemon_threads = True
        if self.tls is not None:  # the handshake happens at accept(); a client that refuses it is dropped there
            self._server.socket = self.tls.wrap_socket(self._server.socket, server_side=True)
        self._port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": self.poll_interval_s},
                                        name=self.thread_name, daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self: S) -> S:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def port(self) -> int:
        assert self._port is not None, "not started"
        return self._port

    @property
    def url(self) -> str:
        return f"{'https' if self.tls is not None else 'http'}://127.0.0.1:{self.port}"

    def recorded(self, method: str | None = None, path_contains: str = "") -> list[RecordedRequest]:
        return [r for r in list(self.requests) if (method is None or r.method == method) and path_contains in r.path]


class StandInHandler(BaseHTTPRequestHandler):
    """JSON over HTTP/1.1, quiet; GET and POST go to ``_handle(method)``."""

    protocol_version = "HTTP/1.1"
    unrecorded_headers: tuple[str, ...] = ("authorization", "cookie")  # lower-case names never recorded

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def _json(self, code: int, obj: Any) -> None:
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def _handle(self, method: str) -> None:
        raise NotImplementedError

    def _receive(self, api: StandInServer, method: str) -> tuple[SplitResult, dict[str, str], Any, bool]:
        """Parse the request (a JSON body, else its text), check the bearer token, record it.

        Returns ``(url parts, query, body, authorized)``.
        """
        parts = urlsplit(self.path)
        query = dict(parse_qsl(parts.query, keep_blank_values=True))
        body: Any = None
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            raw = self.rfile.read(length)
            try:
                body = json.loads(raw)
            except ValueError:
                body = raw.decode("utf-8", "replace")
        scheme, _, credentials = (self.headers.get("Authorization") or "").partition(" ")
        # the scheme is case-insensitive (RFC 7235; the API server's bearer authenticator too): the
        # kubernetes client's in-cluster loader sends "bearer <service account token>"
        authorized = api.token is None or (scheme.lower() == "bearer" and credentials == api.token)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in self.unrecorded_headers}
        api.requests.append(api.request_type(method, parts.path, query, body, authorized, headers))
        return parts, query, body, authorized
