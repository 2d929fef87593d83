"""A run whose client died: found, its record closed KILLED and its records sent, exactly once.

A client killed with SIGKILL leaves its staging directory (``<runs>/.<pipeline_run>.partial``) and a
RUNNING record. The client writes :data:`OWNER_FILE` there as it makes it (pid, start time, boot id,
the run's identity and record); the next ``llmpack sync`` or ``llmpack clean`` takes the run over
(:func:`take_over`) only when that process no longer lives: a summary saying ``killed``, the
directory moved to ``<pipeline_run>.failed``, sent once. A live run is never touched. In full:
docs/internals/run-directories.md.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from components import bounded
from components.errors import InputError

OWNER_FILE = "llmpack-owner.json"
SIGNATURE_KEY = "signature"  # in the owner file and summary.json: the user's key's seal (:func:`seal`)
SEAL_KIND = "run-directory"
FAILED_SUFFIX = ".failed"  # an interrupted or failed run's directory (llmpack.run.clean removes them)
_PARTIAL = re.compile(r"^\.(.+)\.partial$")
HOLD_WAIT_S = 20.0  # how long a take-over waits for processes still writing the run (a step checkpointing)


def process_identity(pid: int) -> tuple[int, str] | None:
    """``(start ticks since boot, boot id)`` of a live process, None when there is none (from /proc)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    if fields[0] == "Z":  # a zombie has finished: its parent has not collected it yet
        return None
    return int(fields[19]), boot


def _seal_payload(directory: Path, record: Mapping[str, Any]) -> dict[str, Any]:
    body = {k: v for k, v in record.items() if k != SIGNATURE_KEY}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=True, default=str)
    return {"directory_inode": os.lstat(directory).st_ino, "content_sha256": hashlib.sha256(text.encode()).hexdigest()}


def seal(directory: Path, record: Mapping[str, Any]) -> dict[str, Any]:
    """``record`` (an owner file or a summary) with the user's key's signature over all of it and the directory it is
    in (its inode: kept by the renames a run directory goes through, not by a copy). What the directory names (run,
    record id, status, tags) is data: :func:`check_seal` lets a command act on it only when this process wrote it."""
    from components.provenance import sign

    return {**record, SIGNATURE_KEY: sign(SEAL_KIND, _seal_payload(directory, record))}


def check_seal(directory: Path, record: Mapping[str, Any], where: Path) -> None:
    """Nothing when ``record`` bears the user's seal for ``directory``; else one InputError naming ``where``."""
    from components.provenance import verify

    if not verify(SEAL_KIND, _seal_payload(directory, record), record.get(SIGNATURE_KEY)):
        raise InputError(f"{where}: {'unsigned' if SIGNATURE_KEY not in record else 'wrongly signed'} (not written by "
                         "your llmpack in this directory, or edited or copied since); it names a run identity your "
                         "signing key did not seal: nothing was sent and no record was touched")


def write_owner(staging: Path, *, identity: Mapping[str, Any], run_id: str | None, tracking_uri: str,
                tags: Mapping[str, str], params: Mapping[str, Any], pid: int | None = None) -> None:
    """The client's claim on its staging directory (``tracking_uri`` already without credentials);
    ``pid``: the claiming process, this one unless told."""
    pid = os.getpid() if pid is None else pid
    me = process_identity(pid)
    owner = {"pid": pid, "start_ticks": me[0] if me else None, "boot_id": me[1] if me else None,
             "identity": dict(identity), "mlflow_run_id": run_id, "tracking_uri": tracking_uri,
             "tags": dict(tags), "params": dict(params), "written_at": time.time()}
    bounded.write_atomic(staging / OWNER_FILE, (json.dumps(seal(staging, owner), sort_keys=True) + "\n").encode())


def read_owner(staging: Path) -> dict[str, Any]:
    """The staging directory's owner record, or an InputError naming what is wrong with it: not a regular file,
    over its size or depth bound, not JSON, or not sealed by the user's key for this directory (:func:`check_seal`)."""
    path = staging / OWNER_FILE
    try:
        owner = bounded.read_json(path)  # a FIFO, /dev/zero, a symlink, 10^6 '[': one line
    except FileNotFoundError:
        raise InputError(f"RUN_DIR {staging}: a run in progress without {OWNER_FILE}; "
                         "it was started by an older llmpack: leave it, or remove it by hand") from None
    except InputError:
        raise
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: not readable as JSON ({type(exc).__name__})") from None
    if (not isinstance(owner, dict) or not isinstance(owner.get("pid"), int)
            or not isinstance(owner.get("identity"), dict)):
        raise InputError(f"{path}: not an llmpack owner record")
    check_seal(staging, owner, path)
    return owner


def owner_alive(owner: Mapping[str, Any]) -> bool:
    """Does the client that wrote ``owner`` still run? (same pid, same start time, same boot)"""
    now = process_identity(int(owner["pid"]))
    if now is None:
        return False
    if owner.get("start_ticks") is None:  # written where /proc could not be read: a live pid counts
        return True
    return now == (owner["start_ticks"], owner.get("boot_id"))


def holders(directory: Path) -> list[int]:
    """Processes with a file open, or their working directory, under ``directory`` (from /proc)."""
    root = str(directory.resolve())
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            links = [os.readlink(entry / "cwd"), *(os.readlink(fd) for fd in (entry / "fd").iterdir())]
        except OSError:
            continue
        if any(link == root or link.startswith(root + os.sep) for link in links):
            found.append(int(entry.name))
    return found


def partial_name(path: Path) -> str | None:
    """The pipeline run of a staging directory's name (``.<run>.partial``), else None."""
    match = _PARTIAL.match(path.name)
    return match.group(1) if match else None


def find_partial_runs(runs_dir: Path) -> list[Path]:
    """The staging directories directly in ``runs_dir`` (real directories; links are not followed)."""
    with os.scandir(runs_dir) as entries:
        return sorted(runs_dir / e.name for e in entries
                      if partial_name(Path(e.name)) and e.is_dir(follow_symlinks=False))


def take_over(staging: Path, *, wait_s: float = HOLD_WAIT_S, sleep: Any = time.sleep) -> Path:
    """A dead client's staging directory made an interrupted run's: its records and a ``killed`` summary
    written, moved to ``<run>.failed``; returns that directory. An InputError when its client lives."""
    from components.record import telemetry
    from components.record.close import write_json_atomic

    run = partial_name(staging)
    if run is None:
        raise InputError(f"RUN_DIR {staging}: not a staging directory (.<run>.partial)")
    owner = read_owner(staging)
    if owner_alive(owner):
        raise InputError(f"RUN_DIR {staging}: its run is in progress (llmpack pid {owner['pid']} is running); "
                         "nothing was touched")
    deadline = time.monotonic() + wait_s
    while (held := holders(staging)) and time.monotonic() < deadline:
        sleep(0.2)
    if held:
        raise InputError(f"RUN_DIR {staging}: still in use by pid {', '.join(map(str, held))}; nothing was touched")
    if os.path.lexists(staging / "summary.json"):  # a run its client published (the second check's n1: a
        # finished run renamed to .<run>.partial keeps its owner file and inode): never a dead client's to close
        raise InputError(f"RUN_DIR {staging}: it holds a run's summary.json, so its client finished it; a finished "
                         "run is never taken over (rename it back to its run's name); nothing was touched")
    kept = staging.parent / f"{run}{FAILED_SUFFIX}"
    if os.path.lexists(kept):  # round 31: a dangling link there too, or the run was half-written, then refused
        raise InputError(f"RUN_DIR {staging}: {kept} exists already; move one of them away")
    identity = owner["identity"]
    records = telemetry.read_records(telemetry.find_event_files(staging))
    started = [r for r in records if r.kind == "event" and r.name == "process_started"]
    error = f"the llmpack client (pid {owner['pid']}) died before the run ended"
    finished_at = max((r.value for r in records if r.kind == "event"),
                      default=float(owner.get("written_at") or time.time()))
    summary = {
        **identity, "status": "killed", "error": error,
        "failed_step": max(started, key=lambda r: r.value).step if started else None,
        "finished_at": finished_at, "metrics": {}, "params": owner.get("params") or {}, "tracking": "not sent",
        "tags": {**(owner.get("tags") or {}), "llmpack.status": "killed", "llmpack.error": error},
        "artifacts": {"run_dir": str(kept), "events_file": str(kept / "events.jsonl"),
                      "mlflow_run_id": owner.get("mlflow_run_id"), "tracking_uri": owner.get("tracking_uri") or ""},
    }
    digest = write_events(staging / "events.jsonl", records)  # a planted link or FIFO there: refused
    sealed = {**summary, EVENTS_DIGEST: digest, EXTRAS_DIGEST: write_extras(staging)}
    write_json_atomic(staging / "summary.json", seal(staging, sealed))
    os.replace(staging, kept)
    return kept


#: a summary's key for the sha256 of the ``events.jsonl`` written beside it (sealed with the summary): ``llmpack
#: sync`` then sends those very records and no other file's (a planted event file re-keyed a metric)
EVENTS_DIGEST = "events_sha256"


#: ... and of ``extras.json``, the training-loss curve and GPU series read from the run's own outputs when it closed
#: (sync sends these, never what a walk of the directory finds later: a planted sample file re-wrote the series)
EXTRAS_DIGEST = "extras_sha256"
EXTRAS_FILE = "extras.json"


def write_extras(run_dir: Path) -> str:
    """``extras.json``: the loss curve and GPU series under ``run_dir`` now, through
    :func:`components.bounded.write_atomic`; the sha256 of the bytes written."""
    import hashlib

    from components.record import gpu_metrics, uniform

    data = json.dumps({"curve": uniform.loss_curve(run_dir), "series": gpu_metrics.read_series(run_dir)},
                      sort_keys=True).encode()
    bounded.write_atomic(run_dir / EXTRAS_FILE, data)
    return hashlib.sha256(data).hexdigest()


def read_extras(run_dir: Path, digest: object) -> tuple[list[tuple[int, float]], dict[str, list[Any]]]:
    """The sealed ``extras.json`` (checked against ``digest``): its curve and series; none for a summary sealed
    without one (a take-over's, or an earlier version's)."""
    import hashlib

    if not isinstance(digest, str):
        return [], {}
    data = bounded.read_bytes(run_dir / EXTRAS_FILE, 64 << 20)
    if hashlib.sha256(data).hexdigest() != digest:
        raise InputError(f"{run_dir / EXTRAS_FILE}: not the file sealed with the run's summary (edited since); "
                         "nothing was sent")
    extras = json.loads(data)
    curve = [(int(step), float(loss)) for step, loss in extras.get("curve") or []]
    series = {str(k): [tuple(p) for p in v] for k, v in (extras.get("series") or {}).items()}
    return curve, series


def write_events(path: Path, records: list[Any]) -> str:
    """``events.jsonl``: the records in time order, through :func:`components.bounded.write_atomic`; the sha256 of
    the bytes written."""
    import hashlib

    ordered = sorted(records, key=lambda r: (r.kind != "event", r.value if r.kind == "event" else 0.0, r.key))
    data = "".join(json.dumps(rec.__dict__, sort_keys=True) + "\n" for rec in ordered).encode()
    bounded.write_atomic(path, data)
    return hashlib.sha256(data).hexdigest()


def taken_over(run_dir: Path) -> Path | None:
    """Where a staging directory went when it was taken over already (``<run>.failed`` beside it), else None."""
    run = partial_name(run_dir)
    if run is None or run_dir.exists():
        return None
    kept = run_dir.parent / f"{run}{FAILED_SUFFIX}"
    return kept if (kept / "summary.json").is_file() else None
