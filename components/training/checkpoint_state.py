"""A checkpoint's training state as data that cannot run code: safetensors for the tensors, JSON for the rest.

``torch.load`` unpickles, and a pickle runs code: whoever can write a checkpoint directory could
run it in the next resume. So the state is ``state.safetensors`` (every tensor) and ``state.json``
(everything else, each tensor a reference), which :func:`decode` turns back into the very
structure ``optimizer.load_state_dict`` was given. Anything else is refused at save time; a file
that does not decode is :class:`UnreadableState`. The encoding: docs/internals/step-process.md.

Both are written by :func:`write_state` into new files of a directory this process made, each through its
own descriptor (``O_CREAT|O_EXCL|O_NOFOLLOW``), hashed as the bytes go out: what the manifest signs is
what this process produced, never bytes read back from a path another writer could have replaced.
Both are read bounded (regular files only, size caps, nesting capped) and, given the signed
manifest's entries, checked for size and sha256 on the very bytes decoded.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from components import bounded
from components.errors import InputError

TENSORS_FILE = "state.safetensors"
DATA_FILE = "state.json"
STATE_FILES = (DATA_FILE, TENSORS_FILE)
MAX_DATA_BYTES = bounded.MAX_JSON_BYTES  # state.json (and any file but the tensors): KiBs in practice
MAX_TENSOR_BYTES = 1 << 40  # state.safetensors: 1 TiB, past the fp32 weights and AdamW moments of a 20B model
_TAGS = ("$tensor", "$tuple", "$dict")
_WRITE_CHUNK = 64 << 20
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
# torch's dtype -> safetensors' name, in safetensors' own order (its file lists tensors by it, widest first)
_ST_DTYPES = {"bool": "BOOL", "uint8": "U8", "int8": "I8", "float8_e5m2": "F8_E5M2", "float8_e4m3fn": "F8_E4M3",
              "int16": "I16", "uint16": "U16", "float16": "F16", "bfloat16": "BF16", "int32": "I32", "uint32": "U32",
              "float32": "F32", "float64": "F64", "int64": "I64", "uint64": "U64"}
_ST_RANK = {name: rank for rank, name in enumerate(_ST_DTYPES)}


def size_cap(name: str) -> int:
    """The most bytes a checkpoint's file ``name`` may hold: :data:`MAX_TENSOR_BYTES` for the tensors, else
    :data:`MAX_DATA_BYTES`."""
    return MAX_TENSOR_BYTES if name == TENSORS_FILE else MAX_DATA_BYTES


def sha256_fd(fd: int, size: int) -> str:
    """The sha256 of the first ``size`` bytes of an open file (read by offset: the descriptor's position stays)."""
    digest, offset = hashlib.sha256(), 0
    while offset < size:
        chunk = os.pread(fd, min(1 << 20, size - offset), offset)
        if not chunk:
            break  # shorter than its size: the digest cannot match
        digest.update(chunk)
        offset += len(chunk)
    return digest.hexdigest()


class UnreadableState(ValueError):
    """A checkpoint's state files match their manifest but do not decode to a training state."""


def encode(state: Any, tensors: dict[str, Any]) -> Any:
    """``state`` as JSON-able data; each tensor is moved (detached, on the CPU, contiguous) into ``tensors``."""
    import torch

    storages: set[int] = set()

    def walk(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            key = f"t{len(tensors)}"
            tensor = value.detach().cpu().contiguous()
            if tensor.numel():
                if tensor.untyped_storage().data_ptr() in storages:
                    tensor = tensor.clone()  # safetensors refuses two names on one storage
                storages.add(tensor.untyped_storage().data_ptr())
            tensors[key] = tensor
            return {"$tensor": key}
        if isinstance(value, tuple):
            return {"$tuple": [walk(v) for v in value]}
        if isinstance(value, list):
            return [walk(v) for v in value]
        if isinstance(value, dict):
            if all(isinstance(k, str) and k not in _TAGS for k in value):
                return {k: walk(v) for k, v in value.items()}
            return {"$dict": [[walk(k), walk(v)] for k, v in value.items()]}
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        raise TypeError(f"checkpoint state holds a {type(value).__name__}: only tensors and plain data are saved")

    return walk(state)


def decode(data: Any, tensors: dict[str, Any]) -> Any:
    """The inverse of :func:`encode`; a reference to a missing tensor or a malformed tag is :class:`UnreadableState`."""
    if isinstance(data, list):
        return [decode(v, tensors) for v in data]
    if isinstance(data, dict):
        if len(data) == 1 and next(iter(data)) in _TAGS:
            tag, value = next(iter(data.items()))
            if tag == "$tensor":
                if not isinstance(value, str) or value not in tensors:
                    raise UnreadableState(f"{DATA_FILE} names a tensor {TENSORS_FILE} does not hold")
                return tensors[value]
            if not isinstance(value, list):
                raise UnreadableState(f"{DATA_FILE}: {tag} is not a list")
            if tag == "$tuple":
                return tuple(decode(v, tensors) for v in value)
            if not all(isinstance(p, list) and len(p) == 2 for p in value):
                raise UnreadableState(f"{DATA_FILE}: $dict is not a list of pairs")
            return {_key(decode(k, tensors)): decode(v, tensors) for k, v in value}
        return {k: decode(v, tensors) for k, v in data.items()}
    return data


def _key(key: Any) -> Any:
    if isinstance(key, (list, dict)):
        raise UnreadableState(f"{DATA_FILE}: a dict key is not a plain value")
    return key


def write_file(dir_fd: int, name: str, chunks: Iterable[Any]) -> dict[str, Any]:
    """A new file ``name`` in the directory open as ``dir_fd``: created ``O_EXCL|O_NOFOLLOW`` mode 0600 (an entry
    already there, a symlink included, is an error), ``chunks`` (bytes-like) written through that one descriptor and
    flushed; its ``{"bytes", "sha256"}`` of the bytes written, hashed as they went out, never read back."""
    fd = os.open(name, _CREATE, 0o600, dir_fd=dir_fd)
    digest, size = hashlib.sha256(), 0
    try:
        for chunk in chunks:
            view = memoryview(chunk).cast("B")
            while len(view):
                n = os.write(fd, view[:_WRITE_CHUNK])
                digest.update(view[:n])
                size, view = size + n, view[n:]
        os.fsync(fd)
    finally:
        os.close(fd)
    return {"bytes": size, "sha256": digest.hexdigest()}


def _safetensors(tensors: dict[str, Any]) -> Iterator[Any]:
    """``tensors`` as the bytes of a safetensors file, streamed: its header, then each tensor's own memory (no copy).

    Byte for byte what ``safetensors.torch.save`` makes: tensors ordered by dtype (widest first, so each is
    aligned), then by name; the header padded with spaces to 8 bytes.
    """
    import torch

    def dtype(tensor: Any) -> str:
        name = str(tensor.dtype).removeprefix("torch.")
        if name not in _ST_DTYPES:
            raise TypeError(f"checkpoint state holds a {tensor.dtype} tensor: not a dtype safetensors stores")
        return name

    order = sorted(tensors.items(), key=lambda item: (-_ST_RANK[dtype(item[1])], item[0]))
    header: dict[str, Any] = {}
    offset = 0
    for name, tensor in order:
        size = tensor.numel() * tensor.element_size()
        header[name] = {"dtype": _ST_DTYPES[dtype(tensor)], "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    yield struct.pack("<Q", len(raw)) + raw
    for _, tensor in order:
        if tensor.numel():
            yield tensor.reshape(-1).view(torch.uint8).numpy()  # encode() made it CPU and contiguous


def write_state(dir_fd: int, state: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The state as new files ``state.safetensors`` and ``state.json`` in the directory open as ``dir_fd``,
    flushed; each file's ``{"bytes", "sha256"}`` as written (:func:`write_file`): what the manifest signs."""
    tensors: dict[str, Any] = {}
    data = encode(state, tensors)
    return {TENSORS_FILE: write_file(dir_fd, TENSORS_FILE, _safetensors(tensors)),
            DATA_FILE: write_file(dir_fd, DATA_FILE, [(json.dumps(data) + "\n").encode("utf-8")])}


def _open_state_file(directory: Path, name: str, want: Mapping[str, Any] | None, *, hash_it: bool = True) -> int:
    """A descriptor on a regular state file of the manifest's size (when ``want`` gives one) and under its cap;
    its sha256 checked too unless ``hash_it`` is False (the caller then hashes the very bytes it decodes)."""
    try:
        fd = bounded.open_regular(directory / name)
    except InputError:
        raise UnreadableState(f"{name} is not a regular file (a symlink, FIFO or device is refused)") from None
    except OSError as exc:
        raise UnreadableState(f"{name} cannot be opened ({exc.strerror})") from None
    size = os.fstat(fd).st_size
    why = (f"{name} has {size} bytes, over the {size_cap(name)} byte cap" if size > size_cap(name)
           else f"{name} has {size} bytes, the manifest says {want['bytes']}" if want and size != want["bytes"]
           else None)  # both from fstat: nothing is read from a file of the wrong size
    if why is not None:
        os.close(fd)
        raise UnreadableState(why)
    if hash_it and want is not None and sha256_fd(fd, size) != want["sha256"]:
        os.close(fd)
        raise UnreadableState(f"{name} does not match the sha256 in the manifest")
    return fd


def _read_tensors(directory: Path, want: Mapping[str, Any] | None) -> dict[str, Any]:
    """``state.safetensors``, read once into memory: the bytes hashed are the bytes decoded, so a writer who
    rewrites the file in place while it loads gets it refused, never loaded (a second read could differ)."""
    from safetensors import SafetensorError
    from safetensors.torch import load

    fd = _open_state_file(directory, TENSORS_FILE, want, hash_it=False)
    with os.fdopen(fd, "rb") as fh:
        raw = fh.read(os.fstat(fh.fileno()).st_size + 1)
    if want is not None and (len(raw) != want["bytes"] or hashlib.sha256(raw).hexdigest() != want["sha256"]):
        raise UnreadableState(f"{TENSORS_FILE} does not match the sha256 in the manifest")
    try:
        return load(raw)
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise UnreadableState(f"{TENSORS_FILE} is not a safetensors file ({_first_line(exc)})") from None


def _read_data(directory: Path, want: Mapping[str, Any] | None) -> Any:
    """``state.json`` parsed (NaN allowed: an optimizer may hold one), at most 64 levels deep."""
    fd = _open_state_file(directory, DATA_FILE, want)
    with os.fdopen(fd, "rb") as fh:
        raw = fh.read(os.fstat(fd).st_size + 1)  # its checked size: read(n) allocates n bytes up front
    if want is not None and (len(raw) != want["bytes"] or hashlib.sha256(raw).hexdigest() != want["sha256"]):
        raise UnreadableState(f"{DATA_FILE} changed while it was read")
    try:
        data = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        raise UnreadableState(f"{DATA_FILE} is not JSON ({type(exc).__name__})") from None
    if bounded.depth(data) > bounded.MAX_DEPTH:
        raise UnreadableState(f"{DATA_FILE} is nested deeper than {bounded.MAX_DEPTH} levels")
    return data


def read_state(directory: Path, files: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """The whole state, decoded and checked for shape before anything is applied; else :class:`UnreadableState`.

    ``files``: the signed manifest's entries; each state file must then have the size and sha256 they
    say, checked on the bytes decoded. Without them (a benchmark's own files) only the caps apply.
    """
    data = _read_data(directory, files.get(DATA_FILE) if files is not None else None)
    tensors = _read_tensors(directory, files.get(TENSORS_FILE) if files is not None else None)
    try:
        state = decode(data, tensors)
    except RecursionError:
        raise UnreadableState(f"{DATA_FILE} is nested too deeply") from None
    _check_shape(state)
    return state


def _check_shape(state: Any) -> None:
    import torch

    if not isinstance(state, dict) or not {"step", "trainable", "optimizer", "rng"} <= state.keys():
        raise UnreadableState(f"{DATA_FILE} lacks step, trainable, optimizer or rng")
    if not isinstance(state["step"], int) or isinstance(state["step"], bool) or state["step"] < 0:
        raise UnreadableState(f"{DATA_FILE}: step is not a whole number >= 0")
    trainable = state["trainable"]
    if not isinstance(trainable, dict) or not all(isinstance(v, torch.Tensor) for v in trainable.values()):
        raise UnreadableState(f"{DATA_FILE}: trainable is not a map of tensors")
    if not isinstance(state["optimizer"], dict) or not isinstance(state["rng"], dict):
        raise UnreadableState(f"{DATA_FILE}: optimizer or rng is not a map")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:120]
