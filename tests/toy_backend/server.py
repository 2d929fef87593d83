"""The toy cluster's stand-in server on 127.0.0.1: it takes a run and says it succeeded.

``POST /api/runs`` with the run (its plan, parameters and ids) answers ``{"id": ...}``;
``GET /api/runs/<id>`` answers ``{"state": "Succeeded"}``; ``GET /api/version`` its version
(what ``llmpack doctor`` asks). What it was sent is kept in
:attr:`ToyServer.runs` for a test to read.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

VERSION = "toy-0.1"


class ToyServer:
    def __init__(self) -> None:
        self.runs: dict[str, dict[str, Any]] = {}
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                if self.path != "/api/runs":
                    return self._answer(404, {"error": "not found"})
                run = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                run_id = f"toy-{len(outer.runs) + 1}"
                outer.runs[run_id] = run
                return self._answer(200, {"id": run_id})

            def do_GET(self) -> None:  # noqa: N802
                if self.path == "/api/version":
                    return self._answer(200, {"version": VERSION})
                run_id = self.path.removeprefix("/api/runs/")
                if run_id not in outer.runs:
                    return self._answer(404, {"error": f"no run {run_id}"})
                return self._answer(200, {"state": "Succeeded"})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.host = f"http://127.0.0.1:{self.httpd.server_port}"

    def __enter__(self) -> ToyServer:
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
