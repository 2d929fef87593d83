"""Checkpoints of a training run: written atomically, trusted only when whole, resumed exactly.

The finetune step calls :func:`save_checkpoint` and :func:`resume_newest`, as torchtune's recipes
call its checkpointer. A checkpoint is data, never code (:mod:`components.training.checkpoint_state`);
``manifest.json`` (each file's size and sha256, and whose checkpoint it is) is written after the
files and before the rename that publishes the directory, so :func:`newest_checkpoint` trusts
only a whole one and refuses another run's or other settings'. On a cluster the checkpoints live
on a volume keyed by the pipeline run (:func:`run_checkpoint_dir`), found by every retry.
``benchmarks/chaos_sigkill.py`` checks a killed step resumes byte-identical. Why each rule:
docs/internals/step-process.md.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from components.training.checkpoint_state import STATE_FILES, UnreadableState, read_state, write_state

MANIFEST = "manifest.json"


def run_fingerprint(settings: list[Any], data: bytes) -> str:
    """What makes two runs' checkpoints interchangeable: their training settings and their data."""
    return hashlib.sha256(json.dumps(settings).encode() + hashlib.sha256(data).digest()).hexdigest()[:16]


def run_checkpoint_dir(root: Path, pipeline_run: str, step: str) -> Path:
    """``<root>/<pipeline run>/<step>``: one run's checkpoints on a shared volume, whatever its attempt.

    Both names become one path component each (``/`` and anything outside ``[A-Za-z0-9._-]`` become
    ``-``; a digest keeps two ids that differ only there apart), so no run id reaches another's directory.
    """
    from components.errors import InputError

    if not pipeline_run:
        raise InputError(f"checkpoints under {root}: the run has no pipeline_run id to keep them apart by")

    def part(text: str) -> str:
        safe = re.sub(r"[^A-Za-z0-9._-]", "-", text).strip(".-")[:80] or "x"
        return safe if safe == text else f"{safe}-{hashlib.sha256(text.encode()).hexdigest()[:8]}"

    return root / part(pipeline_run) / part(step)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _fsync(path: Path) -> None:
    """Flush a file's (or a directory's entries') data to the disk, not just to the page cache."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_manifest(path: Path) -> dict[str, Any] | None:
    """A checkpoint directory's manifest, or None when it has no readable one."""
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) and isinstance(manifest.get("files"), dict) else None


def checkpoint_problem(path: Path) -> str | None:
    """Why ``path`` is not a complete checkpoint; None when every file matches its manifest."""
    manifest = read_manifest(path)
    if manifest is None:
        return f"no valid {MANIFEST}"
    for name in STATE_FILES:
        if name not in manifest["files"]:
            return f"{MANIFEST} lists no {name}"
    for name, want in manifest["files"].items():
        file = path / name
        if not isinstance(want, dict):
            return f"{MANIFEST} entry for {name} is not an object"
        if not file.is_file():
            return f"{name} is missing"
        if file.stat().st_size != want.get("bytes"):
            return f"{name} has {file.stat().st_size} bytes, the manifest says {want.get('bytes')}"
        if _sha256(file) != want.get("sha256"):
            return f"{name} does not match the sha256 in the manifest"
    return None


def foreign(manifest: dict[str, Any], fingerprint: str | None, owner: dict[str, str] | None) -> str | None:
    """Why a checkpoint's manifest says it is not this run's to resume from; None when it is."""
    if fingerprint is not None and manifest.get("fingerprint") != fingerprint:
        theirs_fp = str(manifest.get("fingerprint"))[:16]
        return f"its manifest is for other settings or data (fingerprint {theirs_fp!r}, this run's {fingerprint!r})"
    theirs = manifest.get("owner")
    if owner is not None and theirs != owner:
        mine = ", ".join(f"{k} {v!r}" for k, v in owner.items())
        return f"its manifest is for another run or step (this run: {mine})"
    return None


def checkpoint_candidates(
    root: Path, fingerprint: str | None = None, on_skip: Callable[[Path, str], None] | None = None, *,
    owner: dict[str, str] | None = None, on_refuse: Callable[[Path, str], None] | None = None,
) -> Iterator[Path]:
    """This run's complete checkpoints, newest first (:func:`newest_checkpoint` takes the first).

    Each incomplete one passed over is reported to ``on_skip(path, why)``; each whose manifest names
    other settings (``fingerprint``) or another owner (``owner``: pipeline run and step, checked when
    given) to ``on_refuse(path, why)``.
    """
    for path in sorted(root.glob("step-*"), reverse=True):
        manifest = read_manifest(path)
        if manifest is not None:
            why = foreign(manifest, fingerprint, owner)
            if why is not None:
                if on_refuse is not None:
                    on_refuse(path, why)
                continue  # another run's checkpoint in a shared checkpoint_dir, or one planted there
        problem = checkpoint_problem(path)
        if problem is None:
            yield path
        elif on_skip is not None:
            on_skip(path, problem)


def newest_checkpoint(
    root: Path, fingerprint: str | None = None, on_skip: Callable[[Path, str], None] | None = None, *,
    owner: dict[str, str] | None = None, on_refuse: Callable[[Path, str], None] | None = None,
) -> Path | None:
    """The newest complete checkpoint, of this very run's settings when ``fingerprint`` is given.

    Newest first, the first ``step-*`` directory whose files match its manifest wins (see
    :func:`checkpoint_candidates` for what is reported on the way).
    """
    return next(checkpoint_candidates(root, fingerprint, on_skip, owner=owner, on_refuse=on_refuse), None)


def write_manifest(path: Path, step_no: int, fingerprint: str, owner: dict[str, str] | None = None) -> None:
    """List every file in ``path`` with its size and sha256, after flushing them to disk; name whose it is."""
    files = {}
    for file in sorted(p for p in path.iterdir() if p.is_file() and p.name != MANIFEST):
        _fsync(file)
        files[file.name] = {"bytes": file.stat().st_size, "sha256": _sha256(file)}
    manifest = path / MANIFEST
    doc = {"step": step_no, "fingerprint": fingerprint, "owner": owner or {}, "files": files}
    manifest.write_text(json.dumps(doc, indent=2) + "\n")
    _fsync(manifest)


def prune_checkpoints(root: Path, newest: Path) -> None:
    """Keep the newest two checkpoints; remove older ones and unfinished writes of earlier steps."""
    for old in sorted(p for p in root.glob("step-*") if p != newest)[:-1]:
        shutil.rmtree(old, ignore_errors=True)
    for stale in root.glob(".tmp-step-*"):
        if stale.name < f".tmp-{newest.name}":  # ".tmp-step-00000004-<pid>" sorts before ".tmp-step-00000006"
            shutil.rmtree(stale, ignore_errors=True)


def train_state(model: Any, optimizer: Any, *, sharded: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    """(trainable weights, optimizer state) as whole CPU tensors; under FSDP a collective every rank calls
    (rank 0 gets the gathered state, the others empty dicts)."""
    if not sharded:
        return {k: v.detach().cpu() for k, v in model.named_parameters() if v.requires_grad}, optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict

    whole = StateDictOptions(full_state_dict=True, cpu_offload=True)
    wanted = {k for k, v in model.named_parameters() if v.requires_grad}
    weights = {k: v for k, v in get_model_state_dict(model, options=whole).items() if k in wanted}
    return weights, get_optimizer_state_dict(model, optimizer, options=whole)


def save_checkpoint(
    root: Path, step_no: int, model: Any, optimizer: Any, fingerprint: str = "", *, chaos_pause_s: float = 0.0,
    state: tuple[dict[str, Any], dict[str, Any]] | None = None, owner: dict[str, str] | None = None,
) -> Path:
    """Write to a temporary directory, manifest last, then rename: a checkpoint is complete or absent.

    ``state``: the (trainable, optimizer) state :func:`train_state` gathered, when the model is sharded;
    ``owner``: the pipeline run and step it belongs to, written into the manifest.
    """
    import numpy as np
    import torch

    final = root / f"step-{step_no:08d}"
    tmp = root / f".tmp-step-{step_no:08d}-{os.getpid()}"
    for stale in root.glob(f".tmp-step-{step_no:08d}-*"):  # a killed attempt's unfinished write of this step
        shutil.rmtree(stale, ignore_errors=True)
    tmp.mkdir(parents=True)
    trainable, optimizer_state = state if state is not None else train_state(model, optimizer)
    kind, keys, pos, has_gauss, cached_gaussian = np.random.get_state()
    write_state(tmp, {
        "step": step_no,
        "trainable": trainable,
        "optimizer": optimizer_state,
        "rng": {
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "numpy": {"kind": str(kind), "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                      "has_gauss": int(has_gauss), "cached_gaussian": float(cached_gaussian)},
        },
    })
    if chaos_pause_s > 0:
        time.sleep(chaos_pause_s)  # test hook (settings.CHAOS_CHECKPOINT_PAUSE_S.name): a window to kill the write in
    write_manifest(tmp, step_no, fingerprint, owner)
    shutil.rmtree(final, ignore_errors=True)  # this step's leftover: torn (not resumed from) or another run's
    os.replace(tmp, final)
    _fsync(root)  # the rename itself survives a node crash
    prune_checkpoints(root, final)
    return final


def _numpy_rng(rng: Any) -> tuple[Any, ...]:
    """The numpy RNG state ``np.random.set_state`` takes, from its saved form; else :class:`UnreadableState`."""
    import numpy as np
    import torch

    try:
        saved = rng["numpy"]
        keys = saved["keys"]
        if not isinstance(keys, torch.Tensor) or keys.shape != (624,):
            raise UnreadableState("rng.numpy.keys is not 624 numbers")
        return (str(saved["kind"]), keys.numpy().astype(np.uint32), int(saved["pos"]), int(saved["has_gauss"]),
                float(saved["cached_gaussian"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise UnreadableState(f"rng.numpy is not a numpy RNG state ({type(exc).__name__})") from None


def load_checkpoint(path: Path, model: Any, optimizer: Any, *, sharded: bool = False) -> int:
    """Restore weights, optimizer and RNG states from a checkpoint ``newest_checkpoint`` chose; its step.

    The whole state is decoded and checked before anything is restored: a checkpoint that does not
    decode, or whose weights do not fit this model, is :class:`UnreadableState` with the model,
    optimizer and RNGs untouched. ``sharded`` (FSDP): every rank reads the whole state and keeps its shards.
    """
    import numpy as np
    import torch

    state = read_state(path)
    numpy_rng = _numpy_rng(state["rng"])
    torch_rng, cuda_rng = state["rng"].get("torch"), state["rng"].get("cuda") or []
    if not isinstance(torch_rng, torch.Tensor) or not isinstance(cuda_rng, list):
        raise UnreadableState("rng.torch is not a tensor")
    if sharded:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        whole = StateDictOptions(full_state_dict=True, strict=False)
        set_model_state_dict(model, state["trainable"], options=whole)
        set_optimizer_state_dict(model, optimizer, state["optimizer"], options=whole)
    else:
        params = dict(model.named_parameters())
        for name, value in state["trainable"].items():
            if name not in params or params[name].shape != value.shape:
                raise UnreadableState(f"its weight {name[:80]!r} is not one of this model's trainable weights")
        try:
            optimizer.load_state_dict(state["optimizer"])  # checks the groups before it changes anything
        except (KeyError, TypeError, ValueError, IndexError, RuntimeError) as exc:
            raise UnreadableState(f"its optimizer state does not fit ({type(exc).__name__})") from None
        with torch.no_grad():
            for name, value in state["trainable"].items():
                params[name].copy_(value)
    torch.set_rng_state(torch_rng)
    if torch.cuda.is_available() and cuda_rng:
        torch.cuda.set_rng_state_all(cuda_rng)
    np.random.set_state(numpy_rng)
    return int(state["step"])


def resume_newest(
    root: Path, fingerprint: str, model: Any, optimizer: Any, *, sharded: bool = False,
    owner: dict[str, str] | None = None,
) -> tuple[Path, int] | None:
    """``(checkpoint, its step)`` restored from the newest of this run's checkpoints that loads, else None.

    Newest first: an incomplete one is skipped with one line (:func:`report_skipped`), one that is not
    this run's refused with one line (:func:`report_refused`), and one that matches its manifest but
    does not decode skipped with one line (:func:`report_unreadable`), the one before it tried next.
    """
    for path in checkpoint_candidates(root, fingerprint, report_skipped, owner=owner, on_refuse=report_refused):
        try:
            return path, load_checkpoint(path, model, optimizer, sharded=sharded)
        except UnreadableState as exc:
            report_unreadable(path, str(exc))
    return None


def report_skipped(path: Path, why: str) -> None:
    """Say which incomplete checkpoint a resume passed over, and why."""
    print(f"finetune: skipping incomplete checkpoint {path} ({why})", flush=True)


def report_refused(path: Path, why: str) -> None:
    """Say which checkpoint a resume refused as not this run's, and why."""
    print(f"finetune: refusing checkpoint {path}: {why}; not resumed from", flush=True)


def report_unreadable(path: Path, why: str) -> None:
    """Say which whole-looking checkpoint did not decode; the previous one is tried next."""
    print(f"finetune: warning: skipping unreadable checkpoint {path} ({why}); trying the previous one", flush=True)
