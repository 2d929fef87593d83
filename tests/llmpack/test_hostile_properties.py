"""Hypothesis properties of the readers hostile input reaches: the JSONL reader, the price and control-plane loaders.

Each gives its rows or one :class:`InputError` line naming the file (and line), never a traceback
(docs/internals/hostile-input.md); the dump parser's are in ``tests/llmpack/cluster/k8s/test_k8s_dumps.py``.
"""

from __future__ import annotations

import json
import re

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from components.errors import InputError
from components.record import cost
from components.training.data import read_jsonl
from llmpack.report import parse_control_plane

PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=20))
json_values = st.recursive(json_scalars,
                           lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                   st.dictionaries(st.text(max_size=10), inner, max_size=4)),
                           max_leaves=12)
good_rows = st.one_of(
    st.fixed_dictionaries({"prompt": st.text(max_size=30), "response": st.text(min_size=1, max_size=30)}),
    st.fixed_dictionaries({"messages": st.lists(st.fixed_dictionaries({"role": st.sampled_from(["system", "user"]),
                                                                        "content": st.text(max_size=20)}), max_size=3)
                                       .map(lambda m: [*m, {"role": "assistant", "content": "ok"}])}),
)
jsonl_lines = st.one_of(
    good_rows.map(lambda r: json.dumps(r, ensure_ascii=False).encode("utf-8")),
    json_values.map(lambda v: json.dumps(v).encode("utf-8")),
    st.binary(max_size=40).filter(lambda b: b"\n" not in b),
    st.text(max_size=40).map(lambda t: t.replace("\n", " ").encode("utf-8", "surrogatepass")),
)


@PROPERTY
@given(lines=st.lists(jsonl_lines, max_size=6), skip=st.booleans())
def test_jsonl_reader_gives_rows_or_one_line_naming_file_and_line(
        lines: list[bytes], skip: bool, tmp_path_factory: pytest.TempPathFactory) -> None:
    path = tmp_path_factory.getbasetemp() / "property.jsonl"
    path.write_bytes(b"\n".join(lines))
    try:
        rows, skipped = read_jsonl(path, skip_bad_rows=skip)
    except InputError as exc:
        message = str(exc)
        assert "\n" not in message and message.startswith(f"{path}")
        line = re.match(re.escape(str(path)) + r":(\d+): ", message)
        if line:
            assert not skip and 1 <= int(line.group(1)) <= max(1, len(lines))
        return
    assert rows and all(isinstance(r["prompt"], str) and isinstance(r["response"], str) and r["response"] for r in rows)
    assert len(rows) + skipped <= len(lines)
    for row in rows:  # every kept row can be written back as UTF-8 (the prepare_data step does)
        json.dumps(row, ensure_ascii=False).encode("utf-8")


@PROPERTY
@given(rows=st.lists(st.fixed_dictionaries({"prompt": st.text(max_size=30),
                                            "response": st.text(min_size=1, max_size=30)}),
                     min_size=1, max_size=5), crlf=st.booleans())
def test_any_text_round_trips_through_the_jsonl_reader(
        rows: list[dict[str, str]], crlf: bool, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Line separators inside strings (U+2028, U+0085, \\x1c...) are text, not line breaks; CRLF files read the same."""
    path = tmp_path_factory.getbasetemp() / "roundtrip.jsonl"
    end = "\r\n" if crlf else "\n"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + end for r in rows), encoding="utf-8", newline="")
    assert read_jsonl(path) == (rows, 0)


# YAML-ish token soup: flow and block syntax, anchors, explicit tags PyYAML cannot always build.
YAML_TOKENS = ("prices:", "\n", "  - ", "- ", "{", "}", "[", "]", ": ", ", ", "gpu", "per_gpu_hour", "provider",
               "nvidia-l4", "1.5", "-1", "0", "1e400", ".nan", "yes", "~", "null", "!!int ", "!!float ", "!!timestamp ",
               "!!bool ", "!!binary ", "!!set ", "&a ", "*a", "? ", "'", '"', "# ", "|", ">", "\t", "kfp", "Argo", "x")
yaml_soup = st.lists(st.sampled_from(YAML_TOKENS), max_size=30).map("".join)

yaml_texts = st.one_of(
    st.text(max_size=80),
    yaml_soup,
    st.sampled_from(["!!int x", "!!float abc", "!!timestamp x", "!!bool maybe", "[" * 800])
    .map(lambda bad: f"prices:\n  - {{gpu: nvidia-l4, per_gpu_hour: {bad}}}\n"),
    json_values.map(lambda v: yaml.safe_dump({"prices": v})),
    st.lists(st.dictionaries(st.sampled_from(["gpu", "per_gpu_hour", "source", "as_of", "provider"]), json_values,
                             max_size=5),
             max_size=3).map(lambda v: yaml.safe_dump({"prices": v})),
    st.lists(st.fixed_dictionaries({"gpu": st.text(max_size=12), "per_gpu_hour": json_scalars}), max_size=3)
    .map(lambda v: yaml.safe_dump({"prices": v})),
)


@PROPERTY
@given(text=yaml_texts, gpu=st.sampled_from(["nvidia-l4", "acme-x1000"]))
def test_price_loader_gives_a_price_or_one_line_naming_the_file(
        text: str, gpu: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    path = tmp_path_factory.getbasetemp() / "prices.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    try:
        price = cost.resolve_price(gpu, price_file=str(path), env={})
    except InputError as exc:
        assert "\n" not in str(exc) and str(exc).startswith(str(path)), str(exc)
        return
    if price is not None:
        assert isinstance(price.per_gpu_hour, float) and 0 <= price.per_gpu_hour < float("inf")
        assert isinstance(price.source, str)


@PROPERTY
@given(text=st.one_of(st.text(max_size=60), yaml_soup, json_values.map(yaml.safe_dump),
                      st.dictionaries(st.sampled_from(["kfp", "argo", "mlflow", "direct", "Argo"]), json_scalars)
                      .map(yaml.safe_dump)))
def test_control_plane_loader_gives_costs_or_one_line_naming_the_file(
        text: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    path = tmp_path_factory.getbasetemp() / "control-plane.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    try:
        costs = parse_control_plane([], str(path))
    except InputError as exc:
        assert "\n" not in str(exc) and str(exc).startswith(str(path)), str(exc)
        return
    assert set(costs) <= {"kfp", "argo", "mlflow"}
    assert all(isinstance(v, float) and 0 <= v < float("inf") for v in costs.values())
