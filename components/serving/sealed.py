"""A step's output as the step wrote it: a seal over its files, and a private copy that is exactly them.

Three outputs are sealed: prepare_data's split (:data:`DATASET`: which rows are training and which are
held out), the tokenize step's (:data:`TOKENS`: the eval split, its prompts and answers, which evaluate
scores and promotion compares) and finetune's tuned model (:data:`MODEL`).
The step writes them into a directory of its own process (``mkdtemp`` in the step's temporary
directory: the pod's own filesystem, never the shared volume its output is on), then
:func:`sealed_output` copies each file into the output, hashing the bytes as it writes them, and
signs those digests with the pipeline run (``<kind>.seal.json`` beside them): what is signed is
what the step wrote, whatever a writer of the volume does to the output later or meanwhile.
tokenize, finetune, evaluate and register never read a sealed output itself: :func:`private_copy` copies each sealed
file once into a private directory, hashing as it copies, and refuses the copy unless every file is
the signed one (swapped, edited or missing since); they read only the copy.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import shutil
import stat
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components import bounded, provenance
from components.errors import InputError

MAX_SEAL_BYTES = 1 << 20
MAX_FILES = 4096
_CHUNK = 1 << 20


@dataclass(frozen=True)
class Kind:
    """What is sealed: the signature's kind, and the seal's file name in the output."""

    name: str
    seal_file: str
    what: str  # how a refusal names the output's writer
    how: str = ""  # how a step of the user's own writes one, when it may


DATASET = Kind("dataset", "llmpack-dataset.seal.json", "prepare_data",
               "a step of your own writes one inside `with split_output(dataset) as out:`, "
               "from components.steps.prepare_data")
TOKENS = Kind("tokens", "llmpack-tokens.seal.json", "the tokenize step")
MODEL = Kind("tuned-model", "llmpack-model.seal.json", "finetune")
SEAL_FILE = MODEL.seal_file


def _problem(name: object) -> str | None:
    """Why ``name`` is not a relative path inside the output; None when it is."""
    if not isinstance(name, str) or not name or len(name) > 1024 or "\\" in name or "\0" in name:
        return f"an entry {name!r:.80} that is not a file path"
    parts = name.split("/")
    if name.startswith("/") or any(p in ("", ".", "..") for p in parts) or name.endswith(".seal.json"):
        return f"{name!r:.80}: only files inside the output may be named (no '..' or absolute path)"
    return None


def _clear_at(name: str, dir_fd: int) -> None:
    """Remove ``name`` in the directory open as ``dir_fd`` (a planted link is unlinked, never followed)."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(name, dir_fd=dir_fd)
    else:
        os.unlink(name, dir_fd=dir_fd)


def _copy_hashing(src: Path, dir_fd: int, name: str) -> dict[str, Any]:
    """``src`` (in the step's private directory) written as ``name`` in the directory open as ``dir_fd``, through a
    new temporary file there and a rename, both relative to that descriptor (a directory swapped for a link since
    it was opened is never written through): the digest of the bytes written."""
    tmp = f".{name}.{secrets.token_hex(4)}.tmp"
    digest, size = hashlib.sha256(), 0
    out_fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=dir_fd)
    try:
        with open(src, "rb") as fh, os.fdopen(out_fd, "wb") as out:
            while chunk := fh.read(_CHUNK):
                digest.update(chunk)
                size += len(chunk)
                out.write(chunk)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise
    return {"sha256": digest.hexdigest(), "bytes": size}


def _open_dir(name: str, dir_fd: int | None) -> int:
    """The directory ``name`` (made if absent) open by descriptor; a symlink in its place is refused."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(name, 0o755, dir_fd=dir_fd)
    try:
        return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
    except OSError:
        raise InputError(f"{name}: not a directory (a symlink is refused); the output is not sealed") from None


@contextmanager
def sealed_output(out: Path, kind: Kind, pipeline_run: str, **fields: str) -> Iterator[Path]:
    """A private directory to write the output in; on a clean exit its files go to ``out`` and are sealed.

    ``fields`` (strings) are signed with the digests (the model's ``weights`` and ``meta``).
    """
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="llmpack-seal-"))  # the step's own temporary directory, 0700
    try:
        yield staging
        files: dict[str, dict[str, Any]] = {}
        # the output opened first (a link in its place refused), then everything relative to it: what is cleared
        # and written is in the output, never where a link planted since points
        bounded.check_pinned(out)  # the output the step began with, not a directory on the way swapped since
        fds: dict[Path, int] = {Path("."): _open_dir(str(out), None)}
        try:
            bounded.check_pinned_fd(out, fds[Path(".")])  # and the one opened is it: cleared and written through
            for top in sorted(os.listdir(staging)):
                _clear_at(top, fds[Path(".")])
            for directory, dirs, names in os.walk(staging):
                dirs.sort()
                rel_dir = Path(directory).relative_to(staging)
                if rel_dir != Path("."):  # each directory opened by descriptor, relative to its parent's
                    fds[rel_dir] = _open_dir(rel_dir.name, fds[rel_dir.parent])
                for name in sorted(names):
                    src = Path(directory) / name
                    if not stat.S_ISREG(os.lstat(src).st_mode):
                        raise InputError(f"{src}: not a regular file; a sealed output holds regular files only")
                    files[(rel_dir / name).as_posix()] = _copy_hashing(src, fds[rel_dir], name)
        finally:
            for fd in fds.values():
                os.close(fd)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    doc = {**fields, "files": files, "pipeline_run": pipeline_run}
    seal = provenance.canonical({**doc, "signature": provenance.sign(kind.name, doc)}) + b"\n"
    bounded.write_atomic(out / kind.seal_file, seal)


def verified_seal(out: Path, pipeline_run: str, kind: Kind = MODEL) -> dict[str, Any]:
    """The seal ``kind.what`` signed for ``out``: its ``files`` (and fields); else one :class:`InputError`.

    Unsigned, signed with another key, edited, or of another pipeline run (one signed with no run name, by a
    step the user ran by hand outside any pipeline run, is taken: the user's own output; docs/internals/
    hostile-input.md, round 17): nothing of the output is read.
    """
    path = out / kind.seal_file
    try:
        doc = bounded.read_json(path, MAX_SEAL_BYTES, max_depth=6)
    except FileNotFoundError:
        raise InputError(f"{out}: no {kind.seal_file}: not an output {kind.what} wrote with your key "
                         f"(no step takes an unsealed {kind.name} output"
                         + (f"; {kind.how})" if kind.how else ")")) from None
    if not isinstance(doc, dict):
        raise InputError(f"{path}: not a seal (a JSON object is expected)")
    signed = {k: v for k, v in doc.items() if k != "signature"}
    if not provenance.verify(kind.name, signed, doc.get("signature")):
        raise InputError(f"{path}: not signed by this environment's key (edited, forged or written by hand); "
                         "not trusted")
    files = doc.get("files")
    if not isinstance(files, dict) or not 0 < len(files) <= MAX_FILES:
        raise InputError(f"{path}: a seal without its files")
    for name, want in files.items():
        bad = _problem(name)
        if bad is not None or not isinstance(want, dict) or not isinstance(want.get("bytes"), int) \
                or not isinstance(want.get("sha256"), str):
            raise InputError(f"{path}: {bad or f'no digest for {name!r:.80}'}")
    signed_run = str(doc.get("pipeline_run") or "")
    if signed_run and pipeline_run and signed_run != pipeline_run:  # (one sealed by hand, outside any run: taken)
        raise InputError(f"{path}: the output is pipeline run {signed_run!r}'s, not {pipeline_run!r}'s; not trusted")
    return signed


def seal_id(signed: Mapping[str, Any]) -> str:
    """The identity of a verified seal (the digest of what its signature covers): a step that consumed it signs this
    with its own output, so a later step can tell which of the run's outputs that output came from."""
    return hashlib.sha256(provenance.canonical(signed)).hexdigest()


def check_trained_on(model_seal: Mapping[str, Any], tokens_seal: Mapping[str, Any], model_dir: Path) -> None:
    """Refuse a model not trained on ``tokens_seal``'s split: scoring it on another tokenize output of the run (a
    writer of the volume swapping two genuine ones) could score it on its own training rows."""
    if model_seal.get("tokens_seal") != seal_id(tokens_seal):
        raise InputError(f"{model_dir / MODEL.seal_file}: the model was not trained on the tokens it is scored on "
                         "(another tokenize output of this run in their place); not trusted")


def verified_model(model_dir: Path, pipeline_run: str) -> dict[str, Any]:
    """finetune's seal for ``model_dir``, naming its ``weights`` directory and its ``meta`` file among its files."""
    seal = verified_seal(model_dir, pipeline_run, MODEL)
    weights, meta = seal.get("weights"), seal.get("meta")
    if weights not in ("adapter", "full") or not isinstance(meta, str) or meta not in seal["files"]:
        raise InputError(f"{model_dir / MODEL.seal_file}: a model seal without its weights and metadata")
    return seal


def private_copy(src_dir: Path, files: Mapping[str, Mapping[str, Any]], dest: Path) -> Path:
    """Each of ``files`` copied once from ``src_dir`` into ``dest`` (made 0700), hashed as it is copied.

    A file that is not a regular file, or whose bytes are not its signed size and sha256, is one
    :class:`InputError` naming it; ``dest`` is then removed. Returns ``dest``.
    """
    dest.mkdir(mode=0o700, parents=True)
    try:
        for name, want in files.items():
            bad = _problem(name)
            if bad is not None:
                raise InputError(f"{src_dir}: {bad}")
            target = dest / name
            target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            try:
                fd = bounded.open_regular(src_dir / name)
            except FileNotFoundError:
                raise InputError(f"{src_dir / name}: missing since it was sealed; not trusted") from None
            digest, size, limit = hashlib.sha256(), 0, int(want["bytes"])
            with os.fdopen(fd, "rb") as src, open(target, "xb") as dst:
                while chunk := src.read(min(_CHUNK, limit - size + 1)):
                    size += len(chunk)
                    if size > limit:
                        break
                    digest.update(chunk)
                    dst.write(chunk)
            if size != limit or digest.hexdigest() != want["sha256"]:
                raise InputError(f"{src_dir / name}: not the file that was sealed (changed since: other bytes); "
                                 "not trusted, nothing scored or registered")
            os.chmod(target, stat.S_IRUSR)
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise
    return dest
