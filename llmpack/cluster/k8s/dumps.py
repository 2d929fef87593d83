"""Kubectl dumps: the ``items`` of ``kubectl get pods|nodes|events -o json`` files, checked.

Every error is one line naming the file (and line, item or field), never a traceback.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from components import bounded
from components.errors import InputError
from components.redaction import printable
from llmpack.cluster.k8s import LABEL_PREFIX
from llmpack.cluster.k8s.objects import dig, object_label, shape_problem
from llmpack.cluster.k8s.podphases import is_llmpack_pod, orchestrator_of

# --------------------------------------------------------------------------- dumps (files)

_KIND = {"pods": "Pod", "nodes": "Node", "events": "Event"}
DUMP_LIMIT = bounded.MAX_JSONL_BYTES  # a whole cluster's pods as JSON: tens of MiB for 10,000 pods


def load_dump(path: str | Path, kind: str = "pods") -> list[dict[str, Any]]:
    """The ``items`` of a ``kubectl get <kind> -o json`` dump (a single object is accepted too).

    Raises :class:`InputError` with one line naming the file (and line, item or field).
    """
    if kind not in _KIND:
        raise ValueError(f"kind must be one of {sorted(_KIND)}")
    name = str(path)
    if Path(path).is_dir():
        raise InputError(f"{name}: is a directory, expected a 'kubectl get {kind} -o json' file")
    try:  # a regular file (a named symlink is followed to one), at most DUMP_LIMIT bytes: never /dev/zero or a FIFO
        text = bounded.read_bytes(path, DUMP_LIMIT, follow_symlinks=True).decode("utf-8")
    except FileNotFoundError:
        raise InputError(f"{name}: file not found") from None
    except OSError as exc:
        raise InputError(f"{name}: cannot read ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise InputError(f"{name}: not UTF-8 text; expected 'kubectl get {kind} -o json' output") from None
    if not text.strip():
        raise InputError(f"{name}: empty file; expected 'kubectl get {kind} -o json' output")
    # JSON refused as components.training.data refuses a JSONL row: alike in shape, each in its own
    # words (a whole kubectl dump here, one data row there), both held by the hostile-input table.
    try:
        data = json.loads(text)
        deep = bounded.depth(data) > bounded.MAX_DEPTH
    except json.JSONDecodeError as exc:
        raise InputError(f"{name}: line {exc.lineno} column {exc.colno}: not valid JSON ({exc.msg})") from None
    except RecursionError:
        deep = True
    if deep:
        raise InputError(f"{name}: JSON nested too deeply to be 'kubectl get {kind} -o json' output")
    expected = _KIND[kind]
    if isinstance(data, dict) and data.get("kind") == expected and "items" not in data:
        items: Any = [data]
    elif isinstance(data, dict) and "items" in data:
        items = data["items"]
        if items is None:  # `kubectl get ... -o json` of nothing can print "items": null
            items = []
        if not isinstance(items, list):
            raise InputError(f"{name}: 'items' is a {type(items).__name__}, expected a list of {expected} objects")
    else:
        other = data.get("kind") if isinstance(data, dict) else None
        shown = printable(str(other), 60)
        what = f"a {shown} object" if other and not str(other).endswith("List") else "no 'items' list"
        raise InputError(f"{name}: not a 'kubectl get {kind} -o json' dump ({what})")
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise InputError(f"{name}: items[{i}] is not an object")
        item_kind = item.get("kind")
        if item_kind and item_kind != expected:
            raise InputError(f"{name}: items[{i}] is a {printable(str(item_kind), 60)}, expected a {expected} "
                             f"(is this the {kind} dump?)")
        if not dig(item, "metadata", "name"):
            raise InputError(f"{name}: items[{i}]: missing metadata.name")
        problem = shape_problem(kind, item)
        if problem:
            label = object_label(kind, item)
            raise InputError(f"{name}: items[{i}]{' ' + label if label else ''}: {problem}")
    return items


def load_pods(path: str | Path) -> list[dict[str, Any]]:
    """Pods of a dump; at least one must be an llmpack or orchestrator (KFP, Argo, MLflow) pod."""
    items = load_dump(path, "pods")
    if not any(is_llmpack_pod(p) or orchestrator_of(p) != "unknown" for p in items):
        raise InputError(
            f"{path}: no llmpack or orchestrator pods among {len(items)} pods "
            f"(no {LABEL_PREFIX} labels, no KFP, Argo or MLflow pods)"
        )
    return items


def load_nodes(path: str | Path) -> list[dict[str, Any]]:
    return load_dump(path, "nodes")


def load_events(path: str | Path) -> list[dict[str, Any]]:
    return load_dump(path, "events")
