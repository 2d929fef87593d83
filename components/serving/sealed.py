"""The tuned model as finetune wrote it: a seal over its files, and a private copy that is exactly them.

finetune saves the weights into a directory of its own (``mkdtemp``: mode 0700, inside its output),
hashes every file there, moves them into place and signs the digests with the pipeline run
(:data:`KIND`, :data:`SEAL_FILE` beside the weights): the digests are of what it wrote, never of
whatever sits in the output later. evaluate and register never load or log the output itself:
:func:`private_copy` copies each sealed file once into a private directory, hashing as it copies,
and refuses the copy unless every file is the signed one (a file swapped, edited, added to the seal
or missing since finetune); they read only the copy, so what is scored, signed, logged and
registered is what finetune wrote.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from components import bounded, provenance
from components.errors import InputError

KIND = "tuned-model"
SEAL_FILE = "llmpack-model.seal.json"
MAX_SEAL_BYTES = 1 << 20
MAX_FILES = 4096
_CHUNK = 1 << 20


def _problem(name: object) -> str | None:
    """Why ``name`` is not a relative path inside the model directory; None when it is."""
    if not isinstance(name, str) or not name or len(name) > 1024 or "\\" in name or "\0" in name:
        return f"an entry {name!r:.80} that is not a file path"
    parts = name.split("/")
    if name.startswith("/") or any(p in ("", ".", "..") for p in parts) or name == SEAL_FILE:
        return f"{name!r:.80}: only files inside the model directory may be named (no '..' or absolute path)"
    return None


def save_sealed(out: Path, weights: str, save: Callable[[Path], None], meta_name: str, meta: bytes,
                pipeline_run: str) -> dict[str, dict[str, Any]]:
    """``save(dir)`` writes the weights into a private directory; they and ``meta`` go to ``out/weights`` and
    ``out/meta_name``, and their digests, signed, to ``out/SEAL_FILE``. Returns the digests."""
    from components.serving.signed import model_files

    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".llmpack-weights-", dir=out))  # 0700: only this user writes it
    try:
        save(staging / weights)
        bounded.write_atomic(staging / meta_name, meta)
        files = model_files(staging, weights, meta_name)  # hashed where no one else can write
        target = out / weights
        if os.path.islink(target) or target.is_file():
            target.unlink()
        elif target.exists():
            shutil.rmtree(target)
        os.replace(staging / weights, target)
        os.replace(staging / meta_name, out / meta_name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    doc = {"weights": weights, "meta": meta_name, "files": files, "pipeline_run": pipeline_run}
    bounded.write_atomic(out / SEAL_FILE, (provenance.canonical({**doc, "signature": provenance.sign(KIND, doc)})
                                           + b"\n"))
    return files


def verified_seal(model_dir: Path, pipeline_run: str) -> dict[str, Any]:
    """The seal finetune signed for ``model_dir``: ``weights``, ``meta`` and ``files``; else one :class:`InputError`.

    Unsigned, signed with another key, edited, or of another pipeline run (one signed with no run name is
    taken in any): nothing of the model is read.
    """
    path = model_dir / SEAL_FILE
    try:
        doc = bounded.read_json(path, MAX_SEAL_BYTES, max_depth=6)
    except FileNotFoundError:
        raise InputError(f"{model_dir}: no {SEAL_FILE}: not a model llmpack's finetune wrote with your key "
                         "(evaluate and register take no unsealed model)") from None
    if not isinstance(doc, dict):
        raise InputError(f"{path}: not a model seal (a JSON object is expected)")
    signed = {k: v for k, v in doc.items() if k != "signature"}
    if not provenance.verify(KIND, signed, doc.get("signature")):
        raise InputError(f"{path}: not signed by this environment's key (edited, forged or written by hand); "
                         "the model is not trusted")
    files, weights, meta = doc.get("files"), doc.get("weights"), doc.get("meta")
    if not isinstance(files, dict) or not 0 < len(files) <= MAX_FILES or not isinstance(weights, str) \
            or not isinstance(meta, str) or meta not in files:
        raise InputError(f"{path}: a seal without its files")
    for name, want in files.items():
        bad = _problem(name)
        if bad is not None or not isinstance(want, dict) or not isinstance(want.get("bytes"), int) \
                or not isinstance(want.get("sha256"), str):
            raise InputError(f"{path}: {bad or f'no digest for {name!r:.80}'}")
    signed_run = str(doc.get("pipeline_run") or "")
    if signed_run and pipeline_run and signed_run != pipeline_run:
        raise InputError(f"{path}: the model is pipeline run {signed_run!r}'s, not {pipeline_run!r}'s; not trusted")
    return signed


def private_copy(model_dir: Path, files: Mapping[str, Mapping[str, Any]], dest: Path) -> Path:
    """Each of ``files`` copied once from ``model_dir`` into ``dest`` (made 0700), hashed as it is copied.

    A file that is not a regular file, or whose bytes are not its signed size and sha256, is one
    :class:`InputError` naming it; ``dest`` is then removed. Returns ``dest``.
    """
    dest.mkdir(mode=0o700, parents=True)
    try:
        for name, want in files.items():
            bad = _problem(name)
            if bad is not None:
                raise InputError(f"{model_dir}: {bad}")
            target = dest / name
            target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            try:
                fd = bounded.open_regular(model_dir / name)
            except FileNotFoundError:
                raise InputError(f"{model_dir / name}: missing since finetune sealed the model; not trusted") from None
            digest, size, limit = hashlib.sha256(), 0, int(want["bytes"])
            with os.fdopen(fd, "rb") as src, open(target, "xb") as dst:
                while chunk := src.read(min(_CHUNK, limit - size + 1)):
                    size += len(chunk)
                    if size > limit:
                        break
                    digest.update(chunk)
                    dst.write(chunk)
            if size != limit or digest.hexdigest() != want["sha256"]:
                raise InputError(f"{model_dir / name}: not the file finetune sealed (changed since: other bytes); "
                                 "not trusted, nothing scored or registered")
            os.chmod(target, stat.S_IRUSR)
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)
        raise
    return dest
