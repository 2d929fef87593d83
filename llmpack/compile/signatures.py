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
from collections.abc import Iterable
from pathlib import Path

from components import bounded, provenance
from components.errors import InputError

SIGNATURES = ".llmpack-compiled.json"
KIND = "compiled-artifact"
MAX_FILES = 500  # files in one signed directory
MAX_BYTES = 64 * 1024 * 1024  # bytes of one signed file
_SKIPPED = ("__pycache__",)


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


def digest(path: Path) -> str:
    """SHA-256 of a file's bytes; of a directory, of its regular files' relative paths and digests (sorted,
    ``__pycache__`` skipped). A symlink, a special file or one past the limits is one line."""
    if path.is_symlink():
        raise InputError(f"{path}: a symlink; not a compiled artifact")
    if not path.is_dir():
        return _file_digest(path)
    entries = []
    for found in sorted(path.rglob("*")):
        if any(part in _SKIPPED for part in found.relative_to(path).parts) or found.is_dir() and not found.is_symlink():
            continue
        if len(entries) >= MAX_FILES:
            raise InputError(f"{path}: more than {MAX_FILES} files; not a compiled artifact")
        entries.append(f"{found.relative_to(path).as_posix()}\0{_file_digest(found)}")
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


def write(out: Path, written: Iterable[Path]) -> str | None:
    """Sign what ``llmpack compile`` wrote under ``out``; returns a warning when it could not (no key can be made:
    the files are written, ``--plan`` will refuse them), else None."""
    try:
        key = provenance.signing_key()
        signed = {name: provenance.sign(KIND, _payload(name, out / name), key) for name in artifacts_of(out, written)}
    except InputError as exc:
        return f"the compiled files are not signed ({exc}): llmpack cluster submit --plan will refuse them"
    tmp = out / f"{SIGNATURES}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps({"version": 1, "artifacts": signed}, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, out / SIGNATURES)
    return None


def verify(artifact: str) -> None:
    """Refuse, in one line, an ``artifact`` (a compiled file or MLflow project directory) that is not as a
    ``llmpack compile`` signed with the user's key wrote it: it must lie where that compile put it (two levels below
    the ``--out`` directory holding :data:`SIGNATURES`) and hash as it did then."""
    path = Path(artifact)
    root = path.parent.parent
    fix = (f"--plan: {artifact} is not a file your llmpack compile wrote and nobody changed since ({{}}): --plan "
           "checks only such files (recompile it with llmpack compile --out DIR and submit DIR's file, or submit "
           "without --plan); not submitted")
    try:
        data = bounded.read_json(root / SIGNATURES)
    except OSError:
        raise InputError(fix.format(f"no {SIGNATURES} beside its folder")) from None
    except InputError as exc:
        raise InputError(fix.format(f"{SIGNATURES}: {str(exc)[:120]}")) from None
    signed = data.get("artifacts") if isinstance(data, dict) else None
    name = Path(path.parent.name, path.name).as_posix()
    signature = signed.get(name) if isinstance(signed, dict) else None
    if signature is None:
        raise InputError(fix.format(f"{SIGNATURES} does not list {name}"))
    if not provenance.verify(KIND, _payload(name, path), signature):
        raise InputError(fix.format("changed since, or signed with another key"))
