"""What ``llmpack compile`` wrote, signed with the user's key (:mod:`components.provenance`), so that a budget check
(``llmpack cluster submit --plan``) reads only files it wrote and nobody changed since.

``compile --out DIR`` writes ``DIR/.llmpack-compiled.json``: for each artifact a submit takes (each file, and each
MLflow project directory), its path under ``DIR`` and the HMAC of its SHA-256 under kind ``compiled-artifact``. A file
changed by hand, moved out of ``DIR``, or compiled with another key does not verify: ``--plan`` refuses it in one line
(recompile it, or submit without ``--plan``). Why a signature and not a reading of the file: four rounds of hostile
edits (issue 46, rounds 26 to 29) each found forms of a hand-edited file that a reading let through (more pods, other
GPUs, other values); a signature leaves nothing to read wrongly. In full: docs/plan.md, "The estimate on the run".
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from components import bounded, provenance
from components.errors import InputError

SIGNATURES = ".llmpack-compiled.json"
KIND = "compiled-artifact"
MAX_FILES = 500  # files in one signed directory
MAX_ENTRIES = 1000  # entries seen walking it, skipped ones too (a compiled project has a handful)
MAX_BYTES = 64 * 1024 * 1024  # bytes of one signed file


def _file_digest(path: Path) -> str:
    fd = bounded.open_regular(path)
    digest, total = hashlib.sha256(), 0
    with os.fdopen(fd, "rb") as fh:
        while chunk := fh.read(1 << 20):
            total += len(chunk)
            if total > MAX_BYTES:
                raise InputError(f"{path}: larger than {MAX_BYTES >> 20} MiB; not a compiled artifact")
            digest.update(chunk)
    return digest.hexdigest()


def _files(path: Path) -> list[Path]:
    """A directory's regular files, every one (a planted ``__pycache__`` too: round 30), at most :data:`MAX_FILES`
    of :data:`MAX_ENTRIES` entries walked; a symlink or a special file is one line."""
    found, seen = [], 0
    for top, dirs, names in os.walk(path):
        seen += len(dirs) + len(names)
        if seen > MAX_ENTRIES or len(found) > MAX_FILES:
            raise InputError(f"{path}: more than {MAX_FILES} files ({MAX_ENTRIES} entries); not a compiled artifact")
        for name in names:
            entry = Path(top, name)
            if entry.is_symlink() or not entry.is_file():
                raise InputError(f"{entry}: a symlink or not a regular file; not a compiled artifact")
            found.append(entry)
    return sorted(found)


def digest(path: Path) -> str:
    """SHA-256 of a file's bytes; of a directory, of its regular files' relative paths and digests (sorted). A
    symlink, a special file or one past the limits is one line."""
    if path.is_symlink():
        raise InputError(f"{path}: a symlink; not a compiled artifact")
    if not path.is_dir():
        return _file_digest(path)
    entries = [f"{f.relative_to(path).as_posix()}\0{_file_digest(f)}" for f in _files(path)]
    return hashlib.sha256("\n".join(entries).encode()).hexdigest()


def _payload(name: str, path: Path) -> dict[str, str]:
    return {"path": name, "sha256": digest(path)}


def artifacts_of(out: Path, written: Iterable[Path]) -> list[str]:
    """The artifacts a submit takes among ``written`` (paths under ``out``): every file, and every directory below
    a backend's folder (an MLflow project), as paths relative to ``out``."""
    names: set[str] = set()
    for path in written:
        rel = path.relative_to(out)
        names.add(rel.as_posix())
        if len(rel.parts) > 2:
            names.add(Path(*rel.parts[:2]).as_posix())
    return sorted(names)


def sign(tree: Path, written: Iterable[Path]) -> dict[str, str] | str:
    """The signatures of what ``llmpack compile`` wrote under ``tree`` (its private directory, before the files
    move to ``--out``: round 30, a writer of ``--out`` could get a file of theirs signed there), by path under it;
    a warning line instead when no key can be made (the files are written, ``--plan`` will refuse them)."""
    try:
        key = provenance.signing_key()
        return {name: provenance.sign(KIND, _payload(name, tree / name), key) for name in artifacts_of(tree, written)}
    except InputError as exc:
        return f"the compiled files are not signed ({exc}): llmpack cluster submit --plan will refuse them"


def save(out: Path, signed: dict[str, str]) -> None:
    """``out``'s :data:`SIGNATURES`, written whole (a temporary file renamed over it)."""
    tmp = out / f"{SIGNATURES}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps({"version": 1, "artifacts": signed}, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, out / SIGNATURES)


def _listing(root: Path, fix: str) -> bytes:
    try:
        return bounded.read_bytes(root / SIGNATURES)
    except OSError:
        raise InputError(fix.format(f"no {SIGNATURES} beside its folder")) from None
    except InputError as exc:
        raise InputError(fix.format(f"{SIGNATURES}: {str(exc)[:120]}")) from None


def verify(artifact: str, listing: bytes | None = None) -> None:
    """Refuse, in one line, an ``artifact`` (a compiled file or MLflow project directory) that is not as a
    ``llmpack compile`` signed with the user's key wrote it: it must lie where that compile put it (two levels below
    the ``--out`` directory holding :data:`SIGNATURES`, or ``listing``'s bytes) and hash as it did then."""
    path = Path(os.path.abspath(artifact))  # round 30: `--workflow finetune.yaml` typed in its own folder
    fix = (f"--plan: {artifact} is not a file your llmpack compile wrote and nobody changed since ({{}}): --plan "
           "checks only such files (recompile it with llmpack compile --out DIR and submit DIR's file, or submit "
           "without --plan); not submitted")
    try:
        data = bounded.loads(listing if listing is not None else _listing(path.parent.parent, fix), SIGNATURES)
    except InputError as exc:
        raise InputError(fix.format(f"{SIGNATURES}: {str(exc)[:120]}")) from None
    signed = data.get("artifacts") if isinstance(data, dict) else None
    name = Path(path.parent.name, path.name).as_posix()
    signature = signed.get(name) if isinstance(signed, dict) else None
    if signature is None:
        raise InputError(fix.format(f"{SIGNATURES} does not list {name}"))
    if not provenance.verify(KIND, _payload(name, path), signature):
        raise InputError(fix.format("changed since, or signed with another key"))


def _copy_file(src: Path, dest: Path) -> None:
    fd = bounded.open_regular(src)
    with os.fdopen(fd, "rb") as fh, open(dest, "xb") as out:
        total = 0
        while chunk := fh.read(1 << 20):
            total += len(chunk)
            if total > MAX_BYTES:
                raise InputError(f"{src}: larger than {MAX_BYTES >> 20} MiB; not a compiled artifact")
            out.write(chunk)


@contextmanager
def verified(artifact: str) -> Iterator[Path]:
    """A private copy of ``artifact`` that verifies (:func:`verify`): what ``--plan`` reads is what is sent, never
    the file again (round 30: a file swapped between the check and the send was sent). Removed on exit."""
    path = Path(os.path.abspath(artifact))
    fix = f"--plan: {artifact}: {{}}; not submitted"
    listing = _listing(path.parent.parent, fix)
    tmp = Path(tempfile.mkdtemp(prefix="llmpack-verified-"))
    try:
        copy = tmp / path.parent.name / path.name
        try:
            copy.parent.mkdir()
            if path.is_dir() and not path.is_symlink():
                for found in _files(path):
                    (copy / found.relative_to(path)).parent.mkdir(parents=True, exist_ok=True)
                    _copy_file(found, copy / found.relative_to(path))
            else:
                _copy_file(path, copy)
        except OSError as exc:
            raise InputError(fix.format(f"cannot be read ({exc.strerror or exc})")) from None
        (tmp / SIGNATURES).write_bytes(listing)  # beside the copy, as beside the original: it verifies again
        verify(str(copy), listing)
        yield copy
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
