"""Checkpoints of a training run: written atomically, signed, trusted only when whole and the user's own.

The finetune step calls :func:`save_checkpoint` and :func:`resume_newest`, as torchtune's recipes
call its checkpointer. A checkpoint is data, never code (:mod:`components.training.checkpoint_state`);
``manifest.json`` (each file's size and sha256, whose checkpoint it is, and a signature with the
user's key over all of it: :mod:`components.training.checkpoint_manifest`) is written after the
files and before the rename that publishes the directory, so :func:`newest_checkpoint` trusts
only a whole one and refuses an unsigned or forged one, another run's or other settings'. On a
cluster they live on a volume keyed by the pipeline run (:func:`run_checkpoint_dir`), in a real
directory (:func:`real_run_dir`), found by every retry. Why each rule: docs/internals/step-process.md.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from components import bounded
from components.errors import InputError
from components.training.checkpoint_manifest import (
    MANIFEST,
    Incomplete,
    Untrusted,
    check_files,
    checkpoint_problem,
    foreign,
    load_manifest,
    manifest_bytes,
    read_manifest,
    write_manifest,
)
from components.training.checkpoint_state import UnreadableState, read_state, write_file, write_state

__all__ = ["MANIFEST", "checkpoint_problem", "read_manifest", "write_manifest", "foreign", "newest_checkpoint",
           "resume_newest", "save_checkpoint", "load_checkpoint", "run_checkpoint_dir", "real_run_dir",
           "remove_scratch", "checkpoint_candidates"]


def run_fingerprint(settings: list[Any], data: bytes, *, shape: tuple[int, ...] = ()) -> str:
    """What makes two runs' checkpoints interchangeable: their training settings and their data, its rows' shape
    too (round 31: one token stream cut at 256 and at 512 was the same bytes)."""
    described = json.dumps([*settings, list(shape)]).encode()
    return hashlib.sha256(described + hashlib.sha256(data).digest()).hexdigest()[:16]


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


def real_run_dir(root: Path, path: Path) -> Path:
    """``path`` (below ``root``), each directory under ``root`` made if missing and checked a real one; else one
    :class:`InputError`.

    ``mkdir`` never follows a symlink where it creates, and lstat sees the entry itself: a run
    directory planted as a symlink on the volume is refused, so no checkpoint is written into, nor
    anything removed from, the place it points at.
    """
    root.mkdir(parents=True, exist_ok=True)  # the volume's mount: the user's own setting
    current = root
    for part in path.relative_to(root).parts:
        current = current / part
        try:
            os.mkdir(current)
        except FileExistsError:
            pass
        why = _not_a_real_dir(current)
        if why is not None:
            raise InputError(f"checkpoints: {current} is {why}; the checkpoint root's run directory must be a "
                             "real directory (remove it and rerun)")
    return path


def _not_a_real_dir(path: Path) -> str | None:
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return "missing"
    return None if stat.S_ISDIR(mode) else "a symlink" if stat.S_ISLNK(mode) else "not a directory"


def remove_scratch(path: Path, root: Path) -> None:
    """Remove a finished run's checkpoints at ``path`` and then each emptied directory up to ``root``.

    Each directory from ``root`` down to ``path`` is checked a real directory first (lstat): when one
    became a symlink, nothing is removed and one line says so (the run's outputs are already saved).
    """
    levels = [root.joinpath(*path.relative_to(root).parts[: i + 1]) for i in range(len(path.relative_to(root).parts))]
    try:
        bounded.check_pinned(path)  # the checkpoint directory the step began with, not one swapped in since
    except InputError as exc:
        print(f"finetune: not removing checkpoints: {exc}", flush=True)
        return
    for level in levels:
        why = _not_a_real_dir(level)
        if why == "missing":
            return  # no checkpoint was ever written
        if why is not None:
            print(f"finetune: not removing checkpoints under {level}: it is {why}", flush=True)
            return
    _remove(path)  # through descriptors, the pinned directory's own (never a path rmtree would follow)
    for level in reversed(levels[:-1]):
        try:
            level.rmdir()  # the run's own directory on the volume, when nothing else is in it
        except OSError:
            return


def checkpoint_candidates(
    root: Path, fingerprint: str | None = None, on_skip: Callable[[Path, str], None] | None = None, *,
    owner: dict[str, str] | None = None, on_refuse: Callable[[Path, str], None] | None = None, digests: bool = True,
) -> Iterator[Path]:
    """This run's complete checkpoints signed by the user's key, newest first (:func:`newest_checkpoint` takes the
    first).

    Each incomplete one passed over is reported to ``on_skip(path, why)``; each unsigned, forged or
    symlinked one, and each whose signed manifest names other settings (``fingerprint``) or another
    owner (``owner``: pipeline run and step, checked when given), to ``on_refuse(path, why)``.
    ``digests=False``: files are checked for size only (the loader hashes the bytes it decodes).
    """
    for path in sorted(root.glob("step-*"), reverse=True):
        try:
            manifest = load_manifest(path)
            why = foreign(manifest, fingerprint, owner)
            if why is not None:
                raise Untrusted(why)  # another run's checkpoint in a shared checkpoint_dir
            check_files(path, manifest, digests=digests)
        except Untrusted as exc:
            if on_refuse is not None:
                on_refuse(path, str(exc))
        except Incomplete as exc:
            if on_skip is not None:
                on_skip(path, str(exc))
        else:
            yield path


def newest_checkpoint(
    root: Path, fingerprint: str | None = None, on_skip: Callable[[Path, str], None] | None = None, *,
    owner: dict[str, str] | None = None, on_refuse: Callable[[Path, str], None] | None = None,
) -> Path | None:
    """The newest complete, signed checkpoint, of this very run's settings when ``fingerprint`` is given.

    Newest first, the first ``step-*`` directory whose files match its signed manifest wins (see
    :func:`checkpoint_candidates` for what is reported on the way).
    """
    return next(checkpoint_candidates(root, fingerprint, on_skip, owner=owner, on_refuse=on_refuse), None)


def _remove(path: Path) -> None:
    """Remove a directory, or a symlink planted where one goes (never what it points at).

    Everything relative to descriptors: the directory it is in, opened without following a link and, when
    pinned (the checkpoint root), checked the pinned one; then the entry itself, opened the same way, and
    its contents removed through that descriptor. A directory on the way swapped for a link while this
    runs removes nothing outside (what a path-based ``rmtree`` would follow).
    """
    try:
        parent_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return
    try:
        bounded.check_pinned_fd(path.parent, parent_fd)
        _remove_at(parent_fd, path.name, expect=path)
    except (InputError, OSError):
        pass  # not ours to remove (swapped, or gone): nothing is
    finally:
        os.close(parent_fd)


def _remove_at(parent_fd: int, name: str, *, expect: Path | None = None) -> None:
    """``name`` in the directory open as ``parent_fd`` removed through descriptors (a link: unlinked, never
    followed); ``expect``: when pinned, the directory opened must be the pinned one."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent_fd)
    except NotADirectoryError:
        os.unlink(name, dir_fd=parent_fd)
        return
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # a symlink where a directory goes: the link, never its target
            os.unlink(name, dir_fd=parent_fd)
        return
    try:
        if expect is not None:
            bounded.check_pinned_fd(expect, fd)
        for entry in os.scandir(fd):
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.name, dir_fd=fd, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.name, dir_fd=fd)
    finally:
        os.close(fd)
    with contextlib.suppress(OSError):
        os.rmdir(name, dir_fd=parent_fd)


def prune_checkpoints(root: Path, newest: Path) -> None:
    """Keep the newest two checkpoints; remove older ones and unfinished writes of earlier steps."""
    bounded.check_pinned(root)  # never through a directory swapped since the step began
    for old in sorted(p for p in root.glob("step-*") if p != newest)[:-1]:
        _remove(old)
    for stale in root.glob(".tmp-step-*"):
        if stale.name < f".tmp-{newest.name}":  # ".tmp-step-00000004-<pid>" sorts before ".tmp-step-00000006"
            _remove(stale)


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
    ``owner``: the pipeline run and step it belongs to, written into the manifest, which is signed with
    the user's key over the sizes and sha256 of the bytes this process wrote (:func:`write_state`), never
    over bytes read back from disk, into a directory only this user can enter (``mkdtemp``, 0700).
    """

    final = root / f"step-{step_no:08d}"
    bounded.check_pinned(root)  # the checkpoint directory the step began with (not swapped for a link since)
    for stale in root.glob(f".tmp-step-{step_no:08d}-*"):  # a killed attempt's unfinished write of this step
        _remove(stale)
    root.mkdir(parents=True, exist_ok=True)
    # Everything below relative to the root opened once and checked the pinned one: the root swapped for a link
    # after this (a flipper between the check and a path-based mkdtemp published signed checkpoints in another
    # directory) changes nothing where this writes, renames or removes.
    try:
        root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise InputError(f"checkpoints: {root} was moved or replaced (perhaps by a link) while the step ran "
                         f"({exc.strerror}); nothing was written") from None
    try:
        bounded.check_pinned_fd(root, root_fd)
        return _save_at(root, root_fd, final, step_no, model, optimizer, fingerprint, chaos_pause_s=chaos_pause_s,
                        state=state, owner=owner)
    finally:
        os.close(root_fd)


def _save_at(root: Path, root_fd: int, final: Path, step_no: int, model: Any, optimizer: Any, fingerprint: str, *,
             chaos_pause_s: float, state: tuple[dict[str, Any], dict[str, Any]] | None,
             owner: dict[str, str] | None) -> Path:
    """:func:`save_checkpoint`'s write, every name relative to ``root_fd``."""
    import secrets

    import numpy as np
    import torch

    # private (0700, a fresh random name) and written only through descriptors this process created: the digests
    # it signs are of the bytes it wrote, so a file swapped in by another writer is never signed, only refused
    name = f".tmp-step-{step_no:08d}-{secrets.token_hex(6)}-{os.getpid()}"
    os.mkdir(name, 0o700, dir_fd=root_fd)
    tmp = root / name
    dir_fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=root_fd)
    try:
        trainable, optimizer_state = state if state is not None else train_state(model, optimizer)
        kind, keys, pos, has_gauss, cached_gaussian = np.random.get_state()
        files = write_state(dir_fd, {
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
            time.sleep(chaos_pause_s)  # test hook (settings.CHAOS_CHECKPOINT_PAUSE_S.name): a window to kill the write
        write_file(dir_fd, MANIFEST, [manifest_bytes(step_no, fingerprint, owner, files)])
        os.fsync(dir_fd)
        _check_ours(tmp, dir_fd, root_fd)
    finally:
        os.close(dir_fd)
    _remove_at(root_fd, final.name)  # this step's leftover: torn (not resumed from), another run's, or planted
    os.replace(name, final.name, src_dir_fd=root_fd, dst_dir_fd=root_fd)
    os.fsync(root_fd)  # the rename itself survives a node crash
    prune_checkpoints(root, final)
    return final


def _check_ours(tmp: Path, dir_fd: int, root_fd: int) -> None:
    """The directory ``tmp`` names in the root open as ``root_fd`` is still the private one this process made (its
    inode, owner and 0700); else one :class:`InputError` and nothing is published."""
    made = os.fstat(dir_fd)
    try:
        at = os.stat(tmp.name, dir_fd=root_fd, follow_symlinks=False)
    except OSError:
        at = None  # moved away
    if at is None or (at.st_dev, at.st_ino) != (made.st_dev, made.st_ino) or made.st_uid != os.geteuid() or \
            stat.S_IMODE(made.st_mode) & 0o077:
        raise InputError(f"checkpoints: {tmp} was replaced or opened to others while it was written; not published")


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


def load_checkpoint(path: Path, model: Any, optimizer: Any, *, sharded: bool = False, fingerprint: str | None = None,
                    owner: dict[str, str] | None = None) -> int:
    """Restore weights, optimizer and RNG states from a checkpoint ``newest_checkpoint`` chose; its step.

    Its manifest is verified again (signature, shape) and the state files' sizes and sha256 are
    checked on the very bytes decoded: unsigned or forged is :class:`Untrusted`. The whole state is
    decoded and checked before anything is restored: a checkpoint that does not decode, whose step
    is not its manifest's, or whose weights do not fit this model, is :class:`UnreadableState` with
    the model, optimizer and RNGs untouched. ``sharded`` (FSDP): every rank reads the whole state and
    keeps its shards. ``fingerprint`` and ``owner``: the manifest read here must name this run's settings and
    owner too (checked again on the very manifest whose digests the state is checked against: a checkpoint
    swapped for another run's after :func:`checkpoint_candidates` listed it is :class:`Untrusted`).
    """
    import numpy as np
    import torch

    manifest = load_manifest(path)
    why = foreign(manifest, fingerprint, owner)
    if why is not None:
        raise Untrusted(why)
    state = read_state(path, manifest["files"])
    if state["step"] != manifest["step"]:
        raise UnreadableState(f"its state is step {state['step']}, its manifest step {manifest['step']}")
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

    Newest first: an incomplete one is skipped with one line (:func:`report_skipped`); one that is not
    signed with the user's key (unsigned, forged, under another key), names files outside itself or is
    not this run's is refused with one line (:func:`report_refused`) and never loaded; one that
    matches its manifest but does not decode is skipped with one line (:func:`report_unreadable`).
    Each time the one before it is tried next; when none is left, training starts from step 0.
    """
    candidates = checkpoint_candidates(root, fingerprint, report_skipped, owner=owner, on_refuse=report_refused,
                                       digests=False)  # load_checkpoint hashes the bytes it decodes
    for path in candidates:
        try:
            return path, load_checkpoint(path, model, optimizer, sharded=sharded, fingerprint=fingerprint,
                                         owner=owner)
        except Untrusted as exc:  # changed since it was listed
            report_refused(path, str(exc))
        except (UnreadableState, Incomplete) as exc:
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
