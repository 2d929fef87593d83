"""A checkpoint's manifest: its files (size and sha256), whose it is, signed with the user's key.

A checksum list proves nothing against whoever can write the checkpoint directory, and the settings
fingerprint is computable by anyone who knows the settings; so ``manifest.json`` carries a
provenance signature (:mod:`components.provenance`, kind ``checkpoint``) over all of it: step,
fingerprint, owner and every file's size and sha256. It is checked in an order where nothing a
manifest names is looked at before the manifest is bounded-read, shaped (plain names inside the
checkpoint, sizes under their caps) and verified, and no file is read before fstat shows it a
regular file of its signed size. :class:`Incomplete` (torn: skipped) and :class:`Untrusted`
(not the user's: refused). The order and why: docs/internals/step-process.md.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from components import bounded, provenance
from components.errors import InputError
from components.training.checkpoint_state import STATE_FILES, sha256_fd, size_cap

MANIFEST = "manifest.json"
KIND = "checkpoint"  # the provenance kind: a signature made for anything else never verifies as a checkpoint
MAX_MANIFEST_BYTES = 64 << 10
MAX_ENTRIES = 16
_HEX = frozenset("0123456789abcdef")


class Incomplete(ValueError):
    """A checkpoint that is torn or damaged: a killed write, a missing or cut file. Skipped."""


class Untrusted(ValueError):
    """A checkpoint the user's key did not sign, or that names files outside itself. Refused, never resumed."""


def _show(name: object) -> str:
    """A name from a manifest as it may be printed: quoted, control bytes escaped, at most 80 characters."""
    return repr(name[:80] if isinstance(name, str) else name)[:100]


def entry_problem(name: object) -> str | None:
    """Why ``name`` is not a file directly inside its checkpoint; None when it is. Looks at no file."""
    if not isinstance(name, str) or not name or len(name) > 255:
        return f"an entry {_show(name)} that is not a file name"
    if name in (".", "..", MANIFEST) or any(c in name for c in "/\\\0"):
        return f"{_show(name)}: only files directly inside the checkpoint may be named (no '/', '..' or absolute path)"
    return None


def signed_part(manifest: dict[str, Any]) -> dict[str, Any]:
    """What the signature covers: the whole manifest but the signature itself."""
    return {k: v for k, v in manifest.items() if k != "signature"}


def _read(path: Path) -> dict[str, Any]:
    try:
        st = os.lstat(path)
    except OSError:
        raise Incomplete("it is gone") from None
    if not stat.S_ISDIR(st.st_mode):
        raise Untrusted("not a directory (a symlink is refused)")
    file = path / MANIFEST
    try:
        manifest = bounded.read_json(file, MAX_MANIFEST_BYTES, max_depth=8)
    except FileNotFoundError:
        raise Incomplete(f"no valid {MANIFEST} (missing)") from None
    except (InputError, OSError) as exc:
        raise Incomplete(f"no valid {MANIFEST} ({str(exc).removeprefix(f'{file}: ')[:160]})") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        raise Incomplete(f"no valid {MANIFEST} (no files map)")
    return manifest


def _check_shape(path: Path, manifest: dict[str, Any]) -> None:
    files = manifest["files"]
    if len(files) > MAX_ENTRIES:
        raise Untrusted(f"{MANIFEST} lists {len(files)} files; at most {MAX_ENTRIES}")
    for name, want in files.items():
        bad = entry_problem(name)
        if bad is not None:
            raise Untrusted(f"{MANIFEST} names {bad}")
        if not isinstance(want, dict):
            raise Incomplete(f"{MANIFEST} entry for {name} is not an object")
        size, digest = want.get("bytes"), want.get("sha256")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise Incomplete(f"{MANIFEST} gives {name} no size")
        if size > size_cap(name):
            raise Untrusted(f"{MANIFEST} says {name} has {size} bytes, over its {size_cap(name)} byte cap")
        if not isinstance(digest, str) or len(digest) != 64 or not set(digest) <= _HEX:
            raise Incomplete(f"{MANIFEST} gives {name} no sha256")
    for name in STATE_FILES:
        if name not in files:
            raise Incomplete(f"{MANIFEST} lists no {name}")
    step = manifest.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise Incomplete(f"{MANIFEST} gives no step")
    if path.name != f"step-{step:08d}":
        raise Untrusted(f"{MANIFEST} is step {step}'s, in a directory named {_show(path.name)}")


def load_manifest(path: Path) -> dict[str, Any]:
    """The checkpoint's manifest once its shape and signature are checked (1-4 above); else
    :class:`Incomplete` or :class:`Untrusted`. No file it names has been looked at."""
    manifest = _read(path)
    _check_shape(path, manifest)
    signature = manifest.get("signature")
    if signature is None:
        raise Untrusted(f"its {MANIFEST} is unsigned (llmpack signs every checkpoint it writes with your key)")
    if not provenance.verify(KIND, signed_part(manifest), signature):
        raise Untrusted(f"its {MANIFEST} signature does not verify with your signing key "
                        "(forged, or written under another key)")
    return manifest


def read_manifest(path: Path) -> dict[str, Any] | None:
    """A checkpoint directory's verified manifest, or None when it has none that is whole and signed."""
    try:
        return load_manifest(path)
    except (Incomplete, Untrusted):
        return None


def check_files(path: Path, manifest: dict[str, Any], *, digests: bool = True) -> None:
    """Each file the manifest names is a regular file of its signed size (fstat, before any read) and,
    with ``digests``, of its sha256; else :class:`Incomplete` (or :class:`Untrusted` for a symlink, FIFO, device)."""
    for name, want in manifest["files"].items():
        try:
            fd = bounded.open_regular(path / name)
        except FileNotFoundError:
            raise Incomplete(f"{name} is missing") from None
        except InputError:
            raise Untrusted(f"{name} is not a regular file (a symlink, FIFO or device is refused)") from None
        except OSError as exc:
            raise Incomplete(f"{name} cannot be opened ({exc.strerror})") from None
        try:
            size = os.fstat(fd).st_size
            if size != want["bytes"]:
                raise Incomplete(f"{name} has {size} bytes, the manifest says {want['bytes']}")
            if digests and sha256_fd(fd, size) != want["sha256"]:
                raise Incomplete(f"{name} does not match the sha256 in the manifest")
        finally:
            os.close(fd)


def checkpoint_problem(path: Path) -> str | None:
    """Why ``path`` is not a complete checkpoint signed by the user's key; None when every file matches."""
    try:
        check_files(path, load_manifest(path))
    except (Incomplete, Untrusted) as exc:
        return str(exc)
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


def fsync_path(path: Path) -> None:
    """Flush a file's (or a directory's entries') data to the disk, not just to the page cache."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_manifest(path: Path, step_no: int, fingerprint: str, owner: dict[str, str] | None = None) -> None:
    """List every regular file in ``path`` with its size and sha256 (after flushing it), name whose it is,
    and sign it all with the user's key."""
    files = {}
    for file in sorted(p for p in path.iterdir() if p.name != MANIFEST and stat.S_ISREG(os.lstat(p).st_mode)):
        fsync_path(file)
        fd = bounded.open_regular(file)
        try:
            size = os.fstat(fd).st_size
            files[file.name] = {"bytes": size, "sha256": sha256_fd(fd, size)}
        finally:
            os.close(fd)
    doc: dict[str, Any] = {"step": step_no, "fingerprint": fingerprint, "owner": owner or {}, "files": files}
    doc["signature"] = provenance.sign(KIND, doc)
    manifest = path / MANIFEST
    manifest.write_text(json.dumps(doc, indent=2) + "\n")
    fsync_path(manifest)
