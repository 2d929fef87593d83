"""A fused step's MLflow uploads in a process of their own, so that a member hands over at once.

A step that logs its own records (no llmpack client uploading them after the run: a run started
with ``kfp run submit``, ``argo submit`` or ``mlflow run``, and every pod on a cluster) imports
MLflow and uploads when it finishes. In a fused pod that sat between the members: data
preparation's upload, MLflow's import included (~2 s on the 2-core build machine), ran before
finetune could start. So a fused step process starts this one at once
(``python -m components.uploader``): it imports MLflow and opens the store beside the members'
own start-up (a thread would hold the GIL against them: README, "tried and dropped"), then
reads batches of records from its stdin, one JSON line per finished member, and uploads each
with the same bounded retries (:mod:`components.tracking`; a failure is the same one warning,
and the JSONL keeps every record). A member hands its records over and the next one starts; at
its very end the fused process closes the pipe and waits until the last batch is logged, so the
run's summarizing task finds every record in MLflow, as before. A member killed mid-run (an
OOM kill of the training) still leaves the earlier members' records logged.

What it does not change: the records, where they are logged, the outage bound, the ``finished``
events. Where it is not started: a step that is its own process (measured, it gains nothing
there: the upload is the process's last act, with nothing to overlap; ``benchmarks/step_upload.py``),
a warm-ahead parked process (its member has MLflow loaded), and wherever steps do not upload
(the llmpack client uploads after a local run: ``LLMPACK_CLIENT_UPLOADS=1``;
``LLMPACK_MLFLOW_LOGGING=0``). ``LLMPACK_UPLOADER=0`` uploads in the fused process, as before.
When the uploader process is gone, a member uploads in the fused process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from components.telemetry import Record, RunContext

SWITCH_ENV = "LLMPACK_UPLOADER"  # "0": each step uploads in its own process, as before
# Past the per-batch bound (LLMPACK_TRACKING_MAX_WAIT_S), what the last batch may take to be
# logged once the store answers, and the MLflow import itself on a busy machine.
_CLOSE_MARGIN_S = 60.0


def enabled() -> bool:
    return os.environ.get(SWITCH_ENV, "1") != "0"


def upload(ctx: RunContext, records: Sequence[Record]) -> None:
    """Log ``records`` on the run's record, bounded; a failure only warns (the JSONL keeps them)."""
    try:
        from components import tracking

        mc = tracking.client()
        tracking.with_retries(lambda: tracking.log_records(mc, tracking.open_pipeline_run(mc, ctx), list(records)),
                              tracking.upload_retry())
    except Exception as exc:  # noqa: BLE001 - the JSONL file keeps everything
        print(f"llmpack: warning: MLflow logging failed ({type(exc).__name__}: {exc}); events kept in JSONL",
              file=sys.stderr, flush=True)


@dataclass(kw_only=True)
class Uploader:
    """The uploader process, as the step process holds it."""

    proc: subprocess.Popen[str]
    batches: int = 0

    @classmethod
    def start(cls) -> Uploader:
        proc = subprocess.Popen([sys.executable, "-m", "components.uploader"], stdin=subprocess.PIPE, text=True)
        return cls(proc=proc)

    def send(self, ctx: RunContext, records: Sequence[Record]) -> bool:
        """Hand a finished step's records over; False when the process is gone (upload them here then)."""
        if self.proc.poll() is not None or self.proc.stdin is None or self.proc.stdin.closed:
            return False
        line = json.dumps({"ctx": asdict(ctx), "records": [asdict(r) for r in records]})
        try:
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            return False
        self.batches += 1
        return True

    def close(self) -> None:
        """No more batches: wait until the sent ones are logged (bounded), then the process is gone."""
        from components.tracking import upload_retry

        if self.proc.stdin is not None and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except (BrokenPipeError, OSError):
                pass
        bound = self.batches * upload_retry().max_wait_s + _CLOSE_MARGIN_S
        try:
            rc = self.proc.wait(timeout=bound)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            rc = None
        if rc != 0 and self.batches:
            why = f"did not finish within {bound:.0f} s" if rc is None else f"exited {rc}"
            print(f"llmpack: warning: the MLflow uploader {why}; events kept in JSONL (llmpack sync uploads them)",
                  file=sys.stderr, flush=True)


def main() -> None:
    """The uploader process: start up, then log each batch read from stdin until end-of-file; exit 0."""
    # Ctrl-C, or a SIGTERM to the whole group, ends the step, whose exit closes our stdin: what it
    # sent is logged first (each upload is bounded), then we exit. SIGKILL still ends us at once.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        from components import tracking

        tracking.client()  # the start-up: MLflow imported, the store opened (MLflow keeps it per URI)
    except Exception:  # noqa: BLE001 - met again, and reported, by the first upload
        pass
    for line in sys.stdin:
        if not line.strip():
            continue
        batch = json.loads(line)
        upload(RunContext(**batch["ctx"]), [Record(**r) for r in batch["records"]])
    # Every batch is logged (each call returned): end now. The interpreter's own exit would walk
    # MLflow's objects for a second or so (components.startup) while the step process waits.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
