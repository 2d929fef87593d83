"""Bad and hostile ``kubectl get ... -o json`` dumps: one line naming the file (and item, field), never a traceback.

The pod phases read from good dumps are in ``tests/llmpack/cluster/k8s/test_k8s_phases.py``.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from components.errors import InputError
from llmpack.cluster.k8s import objects
from llmpack.cluster.k8s.dumps import load_dump
from llmpack.cluster.k8s.objects import parse_go_duration, pull_seconds_from_message
from llmpack.cluster.k8s.podphases import ROW_FIELDS, analyze
from llmpack.cluster.k8s.timeline import format_table, timeline_from_files

FIXTURES = Path(__file__).parents[3] / "fixtures" / "k8s"
PODS, NODES, EVENTS = FIXTURES / "pods.json", FIXTURES / "nodes.json", FIXTURES / "events.json"
KFP_EXECUTOR = "llm-finetune-7tq4m-system-container-impl-1183460071"
ARGO_POD = "llm-finetune-x4w8z-finetune-3094715625"


def _items(path: Path) -> list[dict]:
    return json.loads(path.read_text())["items"]


# --------------------------------------------------------------------------- bad dumps: one clear line naming the file


def _write(tmp_path: Path, name: str, content) -> Path:
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else json.dumps(content, indent=2))
    return path


def _error(fn, *args, **kwargs) -> str:
    with pytest.raises(InputError) as info:
        fn(*args, **kwargs)
    message = str(info.value)
    assert "\n" not in message
    assert info.value.exit_code == 2
    return message


def test_malformed_json_names_file_line_and_column(tmp_path):
    path = _write(tmp_path, "pods.json",
                  '{\n  "items": [\n    {"metadata": {"name": "a"}}\n    {"metadata": {}}\n  ]\n}\n')
    message = _error(timeline_from_files, path)
    assert message.startswith(f"{path}: line 4 column 5: not valid JSON")


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ({"kind": "List", "apiVersion": "v1"}, r"not a 'kubectl get pods -o json' dump \(no 'items' list\)"),
        ({"kind": "Node", "metadata": {"name": "n"}}, r"not a 'kubectl get pods -o json' dump \(a Node object\)"),
        ([1, 2], r"not a 'kubectl get pods -o json' dump \(no 'items' list\)"),
        ({"items": {"a": 1}}, r"'items' is a dict, expected a list of Pod objects"),
        ({"items": [3]}, r"items\[0\] is not an object"),
        ({"items": [{"kind": "Pod", "metadata": {}}]}, r"items\[0\]: missing metadata.name"),
        ({"items": [{"kind": "Event", "metadata": {"name": "e"}}]}, r"items\[0\] is a Event, expected a Pod"),
        ("", r"empty file"),
    ],
)
def test_bad_pod_dumps(tmp_path, content, expected):
    path = _write(tmp_path, "pods.json", content)
    message = _error(timeline_from_files, path)
    assert message.startswith(f"{path}: ")
    assert re.search(expected, message), message


def test_missing_file(tmp_path):
    assert _error(timeline_from_files, tmp_path / "pods.json") == f"{tmp_path / 'pods.json'}: file not found"


def test_nodes_file_holding_pods_is_named(tmp_path):
    nodes = _write(tmp_path, "nodes.json", json.loads(PODS.read_text()))
    message = _error(timeline_from_files, PODS, nodes)
    assert message == f"{nodes}: items[0] is a Pod, expected a Node (is this the nodes dump?)"


def test_dump_with_no_llmpack_or_orchestrator_pods(tmp_path):
    doc = json.loads(PODS.read_text())
    doc["items"] = [p for p in doc["items"] if p["metadata"]["name"].startswith("mlflow-tracking")]
    path = _write(tmp_path, "pods.json", doc)
    message = _error(timeline_from_files, path)
    assert message == (
        f"{path}: no llmpack or orchestrator pods among 1 pods (no llmpack.io/ labels, no KFP, Argo or MLflow pods)"
    )
    empty = _write(tmp_path, "empty.json", {"kind": "List", "items": None})
    assert "no llmpack or orchestrator pods among 0 pods" in _error(timeline_from_files, empty)


def test_bad_timestamp_in_pods_names_file_item_and_field(tmp_path):
    doc = json.loads(PODS.read_text())
    doc["items"][1]["metadata"]["creationTimestamp"] = "yesterday"
    path = _write(tmp_path, "pods.json", doc)
    assert _error(timeline_from_files, path) == (
        f"{path}: items[1] (pod llmpack/{KFP_EXECUTOR}): metadata.creationTimestamp 'yesterday' is not an RFC3339 time"
    )
    doc = json.loads(PODS.read_text())
    doc["items"][2]["status"]["containerStatuses"][0]["state"]["terminated"]["finishedAt"] = "09:24"
    path = _write(tmp_path, "pods2.json", doc)
    assert _error(timeline_from_files, path) == (
        f"{path}: items[2] (pod llmpack/{ARGO_POD}): "
        "status.containerStatuses[main].state.terminated.finishedAt '09:24' is not an RFC3339 time"
    )


def test_bad_timestamp_in_nodes_and_events_names_their_file(tmp_path):
    doc = json.loads(NODES.read_text())
    doc["items"][2]["status"]["conditions"][3]["lastTransitionTime"] = "soon"
    nodes = _write(tmp_path, "nodes.json", doc)
    assert _error(timeline_from_files, PODS, nodes) == (
        f"{nodes}: items[2] (node ip-10-0-7-141.ec2.internal): "
        "status.conditions[Ready].lastTransitionTime 'soon' is not an RFC3339 time"
    )
    doc = json.loads(EVENTS.read_text())
    index = next(i for i, e in enumerate(doc["items"]) if e["reason"] == "Pulled")
    doc["items"][index]["firstTimestamp"] = "2025-03-14 late"
    doc["items"][index]["eventTime"] = None
    events = _write(tmp_path, "events.json", doc)
    message = _error(timeline_from_files, PODS, NODES, events)
    assert message.startswith(f"{events}: items[{index}] (event llmpack/")
    assert message.endswith("firstTimestamp '2025-03-14 late' is not an RFC3339 time")


def test_single_pod_object_is_accepted(tmp_path):
    pod = json.loads(PODS.read_text())["items"][1]
    path = _write(tmp_path, "pod.json", pod)
    [row] = timeline_from_files(path, NODES, EVENTS)
    assert row["pod"] == KFP_EXECUTOR and row["provision_s"] == 195.0 and row["run_group"] is None


def test_load_dump_kinds():
    assert len(load_dump(NODES, "nodes")) == 3
    assert len(load_dump(EVENTS, "events")) == 46
    with pytest.raises(ValueError):
        load_dump(PODS, "deployments")


def test_analyze_rejects_non_objects_with_index():
    with pytest.raises(objects.DumpError, match=r"^pods\[1\]: not an object$"):
        analyze([copy.deepcopy(_items(PODS)[0]), "x"])


# --------------------------------------------------------------------------- hostile dumps (properties)

_leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=12))
_json = st.recursive(_leaf, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                    st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                     max_leaves=8)


def _paths(obj: object, prefix: tuple = ()) -> Iterator[tuple]:
    """Every path into a parsed JSON document (dict keys and list indexes)."""
    yield prefix
    children = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for key, value in children:
        yield from _paths(value, (*prefix, key))


_DUMPS = {"pods": json.loads(PODS.read_text()), "nodes": json.loads(NODES.read_text()),
          "events": json.loads(EVENTS.read_text())}
_DUMP_PATHS = [(kind, path) for kind, doc in _DUMPS.items() for path in _paths(doc["items"]) if path]


def _replace(doc: object, path: tuple, value: object) -> None:
    for key in path[:-1]:
        try:
            doc = doc[key]
        except (KeyError, IndexError, TypeError):  # an earlier edit removed this path
            return
    if isinstance(doc, (dict, list)) and (isinstance(doc, dict) or (isinstance(path[-1], int) and path[-1] < len(doc))):
        doc[path[-1]] = value


@settings(max_examples=150, deadline=None)
@given(edits=st.lists(st.tuples(st.sampled_from(_DUMP_PATHS), _json), min_size=1, max_size=3))
def test_any_field_of_any_json_type_gives_rows_or_one_line_naming_file_and_item(
        edits: list[tuple[tuple[str, tuple], object]], tmp_path_factory: pytest.TempPathFactory) -> None:
    """Replace up to three fields anywhere in the recorded dumps with any JSON value: never a traceback."""
    docs = copy.deepcopy(_DUMPS)
    for (kind, path), value in edits:
        _replace(docs[kind]["items"], path, value)
    base = tmp_path_factory.getbasetemp()
    files = {kind: base / f"{kind}.json" for kind in docs}
    for kind, doc in docs.items():
        files[kind].write_text(json.dumps(doc))
    try:
        rows = timeline_from_files(files["pods"], files["nodes"], files["events"])
    except InputError as exc:
        message = str(exc)
        assert "\n" not in message, message
        assert any(message.startswith(f"{files[kind]}: ") for kind in files), message
        return
    for row in rows:
        assert tuple(row) == ROW_FIELDS or set(ROW_FIELDS) <= set(row)
    format_table(rows)
    json.dumps(rows)


@settings(max_examples=100, deadline=None)
@given(data=st.one_of(st.binary(max_size=200), _json.map(lambda v: json.dumps(v).encode()),
                      st.dictionaries(st.sampled_from(["kind", "items", "apiVersion", "metadata"]), _json)
                      .map(lambda v: json.dumps(v).encode())))
def test_load_dump_of_any_bytes_gives_items_or_one_line(data: bytes, tmp_path_factory: pytest.TempPathFactory) -> None:
    path = tmp_path_factory.getbasetemp() / "dump.json"
    path.write_bytes(data)
    for kind in ("pods", "nodes", "events"):
        try:
            items = load_dump(path, kind)
        except InputError as exc:
            assert "\n" not in str(exc) and str(exc).startswith(f"{path}: "), str(exc)
        else:
            assert isinstance(items, list) and all(isinstance(i, dict) for i in items)


@given(st.text(max_size=60))
def test_kubelet_messages_and_go_durations_never_raise(text: str) -> None:
    seconds = pull_seconds_from_message(text)
    assert seconds is None or seconds >= 0
    duration = parse_go_duration(text)
    assert duration is None or duration >= 0
