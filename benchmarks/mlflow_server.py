"""A real ``mlflow server`` (sqlite backend) on 127.0.0.1, for the benchmarks and tests that need one.

    with MlflowServer(root) as srv:      # started; killed (SIGKILL, whole process group) on exit
        ... MLFLOW_TRACKING_URI=srv.uri ...

``kill()`` then ``start()`` brings it back on the same port with the same database (an outage).
Same command line as ``benchmarks/tracking_outage.py`` and ``tests/components/test_tracking_outage.py`` use:
``--workers 1`` by default and no job runner, so it starts in seconds on a loaded 2-core machine.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import TracebackType


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without ``MLFLOW_*`` / ``LLMPACK_*`` settings, offline, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "LLMPACK_"))}
    return {**env, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", **extra}


class MlflowServer:
    """``mlflow server`` with its database, artifacts and log under ``root``; started, killed, restarted on one port."""

    def __init__(self, root: Path, *, workers: int = 1) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.workers = workers
        self.port = free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.log = self.root / "server.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        return [sys.executable, "-m", "mlflow", "server",
                "--backend-store-uri", f"sqlite:///{self.root / 'server.db'}",
                "--artifacts-destination", str(self.root / "artifacts"),
                "--host", "127.0.0.1", "--port", str(self.port), "--workers", str(self.workers)]

    def start(self, timeout_s: float = 180.0) -> float:
        """Start it (a no-op when it is up) and wait for ``/health``; the seconds that took."""
        if self.proc is not None and self.proc.poll() is None:
            return 0.0
        t0 = time.monotonic()
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                self.command(), cwd=self.root, env=clean_env(MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false"),
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        while not self._healthy():
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited ({self.proc.returncode}): {self.log_tail()}")
            if time.monotonic() - t0 > timeout_s:
                self.kill()
                raise TimeoutError(f"mlflow server on {self.uri} did not answer /health in {timeout_s:g} s")
            time.sleep(0.3)
        return time.monotonic() - t0

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL the server and its workers (its own process group)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        self.proc = None

    def log_tail(self, chars: int = 2000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    def __enter__(self) -> MlflowServer:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.kill()
