"""A checkpoint's training state as data that cannot run code: safetensors for the tensors, JSON for the rest.

``torch.load`` unpickles, and a pickle runs code: whoever can write a checkpoint directory could
run it in the next resume. So the state is ``state.safetensors`` (every tensor) and ``state.json``
(everything else, each tensor a reference), which :func:`decode` turns back into the very
structure ``optimizer.load_state_dict`` was given. Anything else is refused at save time; a file
that does not decode is :class:`UnreadableState`. The encoding: docs/internals/step-process.md.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

TENSORS_FILE = "state.safetensors"
DATA_FILE = "state.json"
STATE_FILES = (DATA_FILE, TENSORS_FILE)
_TAGS = ("$tensor", "$tuple", "$dict")


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


def write_state(directory: Path, state: dict[str, Any]) -> None:
    """The state as ``state.safetensors`` and ``state.json`` in ``directory``.

    Not yet flushed: the manifest does that.
    """
    from safetensors.torch import save_file

    tensors: dict[str, Any] = {}
    data = encode(state, tensors)
    save_file(tensors, str(directory / TENSORS_FILE))
    (directory / DATA_FILE).write_text(json.dumps(data) + "\n", encoding="utf-8")


def read_state(directory: Path) -> dict[str, Any]:
    """The whole state, decoded and checked for shape before anything is applied; else :class:`UnreadableState`."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        tensors = load_file(str(directory / TENSORS_FILE))
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise UnreadableState(f"{TENSORS_FILE} is not a safetensors file ({_first_line(exc)})") from None
    try:
        data = json.loads((directory / DATA_FILE).read_bytes().decode("utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        raise UnreadableState(f"{DATA_FILE} is not JSON ({type(exc).__name__})") from None
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
