"""Kubernetes objects as plain dicts: the labels we read, times, field access and shape checks.

What every reader of pod, node and event objects (the JSON of ``kubectl get ... -o json`` or of a
watch) shares: Kubernetes' and NVIDIA's label names, RFC 3339 / Go duration / image-pull
message parsing, null-safe field access, and the shape check that turns a hand-edited or foreign
dump into one line naming the field (:class:`DumpError`). Stdlib only.
"""

from __future__ import annotations

import calendar
import functools
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from components.errors import InputError
from components.labels import GPU_COUNT_LABEL as POD_GPU_COUNT

# The orchestrators' own labels and annotations are theirs to declare (components.backend.PodMarks).
INSTANCE_TYPE_LABELS = ("node.kubernetes.io/instance-type", "beta.kubernetes.io/instance-type")
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_COUNT_LABEL = "nvidia.com/gpu.count"  # NVIDIA GPU feature discovery
GPU_RESOURCE = "nvidia.com/gpu"
SCALE_DOWN_TAINT = "ToBeDeletedByClusterAutoscaler"  # value: unix seconds when the autoscaler began removing it
# A Kubeflow Trainer TrainJob's node pods (components.trainjob.gang): JobSet names its JobSet after the
# TrainJob and labels every pod with it; the Job controller labels (and annotates) each pod of an
# Indexed Job with its completion index, the torch node rank (PET_NODE_RANK).
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
JOBSET_REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
JOB_COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"  # label since Kubernetes 1.28, annotation before
POD_GPU_COUNT_LABEL = POD_GPU_COUNT  # on every gang pod (the TrainJob's runtimePatches)
# A node's capacity type as each provisioner labels it -> the label value that means spot.
# Karpenter: spot | on-demand | reserved; EKS managed node groups: SPOT | ON_DEMAND | CAPACITY_BLOCK;
# GKE: cloud.google.com/gke-spot=true (and the older preemptible VMs); AKS: spot | regular.
CAPACITY_TYPE_LABELS = {
    "karpenter.sh/capacity-type": "spot",
    "eks.amazonaws.com/capacityType": "SPOT",
    "cloud.google.com/gke-spot": "true",
    "cloud.google.com/gke-preemptible": "true",
    "kubernetes.azure.com/scalesetpriority": "spot",
}

TERMINAL_PHASES = ("Succeeded", "Failed")


def capacity_type(labels: Mapping[str, Any]) -> str | None:
    """``spot`` when any provisioner's label says so, ``on-demand`` when one is there and does not, else None.

    Only spot is priced apart (a spot column in the price table); Karpenter's ``reserved`` and
    EKS's capacity blocks are priced on-demand, as a list price stands for them too.
    """
    present = [(key, str(labels[key])) for key in CAPACITY_TYPE_LABELS if labels.get(key) not in (None, "")]
    if any(value.lower() == CAPACITY_TYPE_LABELS[key].lower() for key, value in present):
        return "spot"
    return "on-demand" if present else None


class DumpError(InputError):
    """A bad field in one object of a dump: ``kind`` (pods|nodes|events) and ``index`` say which.

    :func:`~llmpack.cluster.k8s.timeline.timeline_from_files` rewrites it as ``FILE: items[i] ...``.
    """

    def __init__(self, kind: str, index: int, detail: str) -> None:
        super().__init__(f"{kind}[{index}]{join_detail(detail)}")
        self.kind = kind
        self.index = index
        self.detail = detail


def join_detail(detail: str) -> str:
    """``items[3]`` + detail: "(pod ns/x): field ..." gets a space, ": not an object" none."""
    return detail if detail.startswith(":") else " " + detail


# --------------------------------------------------------------------------- time parsing

_RFC3339 = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(\.\d+)?(?:([Zz])|([+-])(\d{2}):?(\d{2}))$"
)

_PLAIN_UTC = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z")


def _days_since_epoch(year: int, month: int, day: int) -> int:
    """Days from 1970-01-01 to a proleptic Gregorian date (``calendar.timegm``'s, a few times faster:
    the analysis parses several times per pod). Howard Hinnant's ``days_from_civil``."""
    year -= month <= 2
    era = year // 400
    yoe = year - era * 400
    doy = (153 * (month - 3 if month > 2 else month + 9) + 2) // 5 + day - 1
    return era * 146097 + yoe * 365 + yoe // 4 - yoe // 100 + doy - 719468


def parse_time(value: Any) -> float | None:
    """RFC3339 (optional fractional seconds, ``Z`` or an offset) to UTC epoch seconds.

    None and "" give None; anything else unparsable raises ``ValueError``.
    """
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ValueError(value)
    return _parse_text(value)


@functools.lru_cache(maxsize=8192)
def _parse_text(value: str) -> float:
    """:func:`parse_time` of a string, kept: the watcher analyses the same pods again and again (the stop
    condition, then the final rows), and the API server's one-second stamps repeat across a run
    group's pods (the benchmark's 1,000 pods hold 1,174 distinct ones in 14,496 parses). An error is
    never kept (``lru_cache`` does not keep exceptions)."""
    if len(value) == 20:  # what the API server writes, "2025-03-14T10:00:00Z": no regex, no generator
        m = _PLAIN_UTC.match(value)
        if m:
            month, day, hour, minute, second = (int(value[5:7]), int(value[8:10]), int(value[11:13]),
                                                int(value[14:16]), int(value[17:19]))
            if not (1 <= month <= 12 and 1 <= day <= 31 and hour <= 23 and minute <= 59 and second <= 60):
                raise ValueError(value)
            return float(_days_since_epoch(int(value[:4]), month, day) * 86400 + hour * 3600 + minute * 60 + second)
    m = _RFC3339.match(value.strip())
    if not m:
        raise ValueError(value)
    year, month, day, hour, minute, second = (int(g) for g in m.groups()[:6])
    if not (1 <= month <= 12 and 1 <= day <= 31 and hour <= 23 and minute <= 59 and second <= 60):
        raise ValueError(value)
    epoch = calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0))
    if m.group(9):
        offset = int(m.group(10)) * 3600 + int(m.group(11)) * 60
        epoch -= offset if m.group(9) == "+" else -offset
    frac = float(m.group(7)) if m.group(7) else 0.0
    return epoch + frac


_GO_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_GO_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_go_duration(text: str) -> float | None:
    """Go's ``time.Duration.String()`` ("1m50.874s", "812.5ms", "0s") to seconds; None if not one."""
    text = text.strip().rstrip(".,")
    if not text:
        return None
    pos, total = 0, 0.0
    for m in _GO_DURATION_PART.finditer(text):
        if m.start() != pos:
            return None
        total += float(m.group(1)) * _GO_UNITS[m.group(2)]
        pos = m.end()
    return total if pos == len(text) and pos > 0 else None


# Kubelet messages, old and new:
#   Successfully pulled image "img" in 1m50.874s (1m50.874s including waiting). Image size: 123 bytes.
#   Successfully pulled image "img" in 12.3s (12.3s including waiting)
#   Successfully pulled image "img" in 12.3s
#   Successfully pulled image "img"                (no duration: use the Pulling -> Pulled times)
#   Container image "img" already present on machine
_PULLED = re.compile(r'Successfully pulled image "[^"]*" in (\S+?)(?: \((\S+) including waiting\))?(?:[.,]?\s|[.,]?$)')
_PRESENT = re.compile(r'^Container image "[^"]*" already present on machine')


def pull_seconds_from_message(message: str) -> float | None:
    """The pull time a kubelet ``Pulled`` message states (including waiting for a pull slot)."""
    if _PRESENT.match(message or ""):
        return 0.0
    m = _PULLED.search(message or "")
    if not m:
        return None
    # "including waiting" is what the pod actually waited; fall back to the pull time alone.
    for group in (m.group(2), m.group(1)):
        if group:
            seconds = parse_go_duration(group)
            if seconds is not None:
                return seconds
    return None


# --------------------------------------------------------------------------- small accessors


def dig(obj: Any, *path: str) -> Any:
    for key in path:
        if type(obj) is not dict and not isinstance(obj, Mapping):  # a dict first: isinstance of an ABC is slow
            return None
        obj = obj.get(key)
    return obj


def labels_of(obj: Mapping[str, Any]) -> dict[str, str]:
    return dig(obj, "metadata", "labels") or {}


def annotations_of(obj: Mapping[str, Any]) -> dict[str, str]:
    return dig(obj, "metadata", "annotations") or {}


def minus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round(a - b, 6)


def int_or_none(value: Any) -> int | None:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return None


class Where:
    """Builds :class:`DumpError` for one object of a dump."""

    def __init__(self, kind: str, index: int, obj: Mapping[str, Any]) -> None:
        self.kind, self.index = kind, index
        self.label = object_label(kind, obj) if isinstance(obj, Mapping) else ""

    def error(self, detail: str) -> DumpError:
        return DumpError(self.kind, self.index, f"{self.label}: {detail}" if self.label else f": {detail}")

    def time(self, value: Any, field: str) -> float | None:
        try:
            return parse_time(value)
        except ValueError:
            raise self.error(f"{field} {value!r} is not an RFC3339 time") from None


def condition_of(obj: Mapping[str, Any], ctype: str) -> Mapping[str, Any] | None:
    for cond in dig(obj, "status", "conditions") or ():
        if isinstance(cond, Mapping) and cond.get("type") == ctype:
            return cond
    return None


def object_condition_time(obj: Mapping[str, Any], where: Where, *types: str) -> float | None:
    """lastTransitionTime of the first of ``types`` present, when its status is True."""
    for ctype in types:
        cond = condition_of(obj, ctype)
        if cond is not None:
            if str(cond.get("status")) != "True":
                return None
            return where.time(cond.get("lastTransitionTime"), f"status.conditions[{ctype}].lastTransitionTime")
    return None


# --------------------------------------------------------------------------- shape checks


# The fields analysis reads and the JSON type each must have where present (null counts as absent).
# A dump from kubectl always fits; a hand-edited or foreign one gets one line naming the field.
_SHAPES: dict[str, tuple[tuple[str, type], ...]] = {
    "common": (("metadata", Mapping), ("metadata.name", str), ("metadata.namespace", str), ("metadata.uid", str),
               ("metadata.labels", Mapping), ("metadata.annotations", Mapping), ("spec", Mapping),
               ("status", Mapping), ("status.conditions", list)),
    "pods": (("spec.nodeName", str), ("spec.containers", list), ("status.phase", str),
             ("status.containerStatuses", list)),
    "nodes": (),
    "events": (("involvedObject", Mapping), ("regarding", Mapping), ("involvedObject.name", str),
               ("regarding.name", str), ("involvedObject.namespace", str), ("regarding.namespace", str),
               ("involvedObject.uid", str), ("regarding.uid", str), ("involvedObject.fieldPath", str),
               ("regarding.fieldPath", str)),
}
_CONTAINER_SHAPE: tuple[tuple[str, type], ...] = (("name", str), ("image", str), ("command", list), ("env", list))


_JSON_NAMES: tuple[tuple[type, str], ...] = (
    (bool, "boolean"), (str, "string"), (int, "number"), (float, "number"), (Mapping, "object"), (list, "array"),
)


def _a(name: str) -> str:
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def _json_name(value: Any) -> str:
    """``string``, ``object``, ``number``...: the JSON type of a parsed value."""
    if value is None:
        return "null"
    return next((name for typ, name in _JSON_NAMES if isinstance(value, typ)), type(value).__name__)


def _is(value: Any, typ: type) -> bool:
    return (typ is Mapping and type(value) is dict) or isinstance(value, typ)


@functools.cache
def _split(path: str) -> tuple[str, ...]:
    return tuple(path.split("."))


def _wrong_type(obj: Any, fields: Iterable[tuple[str, type]], prefix: str = "") -> str | None:
    for path, typ in fields:
        value = dig(obj, *_split(path))
        if value is not None and not _is(value, typ):
            expected = next(name for t, name in _JSON_NAMES if t is typ)
            return f"{prefix}{path} is {_a(_json_name(value))}, expected {_a(expected)}"
    return None


_Tree = dict[str, tuple[type, "_Tree"]]


@functools.cache
def _tree(kind: str) -> _Tree:
    """The fields of one kind as a tree (key -> (type, the fields under it)): checked in one walk."""
    tree: _Tree = {}
    for path, typ in _CONTAINER_SHAPE if kind == "container" else (*_SHAPES["common"], *_SHAPES[kind]):
        node = tree
        *parents, last = path.split(".")
        for key in parents:  # a parent is declared (a Mapping) before its fields
            node = node[key][1]
        node[last] = (typ, {})
    return tree


def _fits(obj: Mapping[str, Any], tree: _Tree) -> bool:
    """Whether every field of ``tree`` present in ``obj`` has its type: the common answer, fast. Only
    an object that does not fit is searched field by field (:func:`_wrong_type`) for the message."""
    for key, (typ, under) in tree.items():
        value = obj.get(key)
        if value is not None and (not _is(value, typ) or (under and not _fits(value, under))):
            return False
    return True


def shape_problem(kind: str, obj: Mapping[str, Any]) -> str | None:
    """What makes ``obj`` unfit for analysis as one of ``kind`` (a field of the wrong JSON type), or None."""
    problem = None if _fits(obj, _tree(kind)) else _wrong_type(obj, (*_SHAPES["common"], *_SHAPES[kind]))
    if problem:
        return problem
    for field in ("labels", "annotations"):
        for key, value in (dig(obj, "metadata", field) or {}).items():
            if not isinstance(value, str):
                return f"metadata.{field}[{key!r}] is {_a(_json_name(value))}, expected a string"
    if kind == "pods":
        for j, container in enumerate(dig(obj, "spec", "containers") or ()):
            if not isinstance(container, Mapping):
                return f"spec.containers[{j}] is {_a(_json_name(container))}, expected an object"
            problem = None if _fits(container, _tree("container")) else _wrong_type(
                container, _CONTAINER_SHAPE, f"spec.containers[{j}].")
            if problem:
                return problem
    return None


def object_label(kind: str, obj: Mapping[str, Any]) -> str:
    """``(pod ns/name)`` when the object has a string name, else nothing."""
    name, ns = dig(obj, "metadata", "name"), dig(obj, "metadata", "namespace")
    if not isinstance(name, str) or not name:
        return ""
    noun = {"pods": "pod", "nodes": "node", "events": "event"}[kind]
    return f"({noun} {ns + '/' if isinstance(ns, str) and ns else ''}{name})"


def check_objects(kind: str, objs: Sequence[Any], *, named: bool = True) -> None:
    for i, obj in enumerate(objs):
        if not isinstance(obj, Mapping):
            raise DumpError(kind, i, ": not an object")
        if named and not dig(obj, "metadata", "name"):
            raise DumpError(kind, i, ": missing metadata.name")
        problem = shape_problem(kind, obj)
        if problem:
            label = object_label(kind, obj)
            raise DumpError(kind, i, f"{label}: {problem}" if label else f": {problem}")
