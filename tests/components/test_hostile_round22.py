"""The twenty-second independent round's weak point (helper-49, issue 46): a Ctrl-C during a retry's wait printed
Python's traceback with the store's error as its context (MLflow's words hold the tracking URI whole) when the step
used MLflow's own client. The wait is outside the except block now, and a step's Ctrl-C is one line."""

from __future__ import annotations

import pytest


def test_a_ctrl_c_in_a_retrys_wait_carries_no_store_error() -> None:
    from components.record.retries import UploadRetry, with_retries

    def call() -> None:
        raise ConnectionError("API request to http://alice:Zq9-secret-22@127.0.0.1:9/api failed")

    def sleep(_s: float) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt) as info:
        with_retries(call, UploadRetry(max_wait_s=30), sleep=sleep)
    assert info.value.__context__ is None and info.value.__cause__ is None


def test_a_steps_ctrl_c_is_one_line_and_ends_by_the_signal(tmp_path) -> None:  # noqa: ANN001 - pytest's tmp_path
    import os
    import signal
    import subprocess
    import sys

    code = ("import sys\nfrom components.process import runner\n"
            "def interrupted(argv):\n    raise KeyboardInterrupt\n"
            "runner.run = interrupted\nsys.exit(runner.main([]))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert r.returncode == -signal.SIGINT and r.stderr.strip() == "llmpack: interrupted", r.stderr
