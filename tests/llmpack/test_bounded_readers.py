"""Issue 46, item 15: every reader of JSON, JSONL and kubectl dumps is bounded (:mod:`components.bounded`):
a FIFO, a device or (inside a run directory) a symlink is refused before a byte is read, and a file or line
over its limit is one line naming the limit, exit 2.

Run on code without the bounds, these tests would hang (a FIFO) or eat memory (``/dev/zero``): run them
there under ``ulimit -v`` and ``timeout``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from components.errors import InputError
from components.record.telemetry import read_records_counted
from components.training.data import read_jsonl, read_split
from llmpack.cli import main
from llmpack.cluster.k8s import dumps
from llmpack.run import orphans

LONG_LINE = 1024 * 1024 + 10  # one byte past components.bounded.MAX_LINE_BYTES, and then some


def _one_line_exit_2(argv: list[str], *needles: str) -> str:
    res = CliRunner().invoke(main, argv)
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.output, res.output
    assert all(n in lines[0] for n in needles), lines[0]
    return lines[0]


def test_timeline_refuses_dev_zero_and_a_fifo_as_pods(tmp_path: Path) -> None:
    _one_line_exit_2(["cluster", "timeline", "--pods", "/dev/zero"], "/dev/zero", "not a regular file")
    fifo = tmp_path / "pods.json"
    os.mkfifo(fifo)  # nobody writes it: a reader that opened it blocking would wait for ever
    _one_line_exit_2(["cluster", "timeline", "--pods", str(fifo)], "not a regular file")
    link = tmp_path / "link.json"
    link.symlink_to("/dev/zero")
    _one_line_exit_2(["cluster", "timeline", "--pods", str(link)], "not a regular file")


def test_a_dump_over_its_limit_or_nested_past_64_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    big = tmp_path / "pods.json"
    big.write_text(json.dumps({"items": [], "pad": "x" * 5000}))
    monkeypatch.setattr(dumps, "DUMP_LIMIT", 4096)
    with pytest.raises(InputError, match=r"pods.json: larger than the 4 KiB limit for this file$"):
        dumps.load_dump(big)
    deep = tmp_path / "deep.json"
    deep.write_text('{"items": ' + "[" * 65 + "]" * 65 + "}")  # too shallow for a RecursionError
    with pytest.raises(InputError, match=r"deep.json: JSON nested too deeply to be 'kubectl get pods -o json'"):
        dumps.load_dump(deep)


def _run_dir(tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "summary.json").write_text(json.dumps(orphans.seal(run_dir,
        {"run_group": "rg-x", "pipeline_run": "direct-x", "orchestrator": "direct", "mode": "local",
         "status": "succeeded", "submitted_at": 1.7e9, "finished_at": 1.7e9 + 60, "tracking": "not sent"})))
    return run_dir


def test_sync_refuses_an_events_file_linked_to_dev_zero_before_any_request(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path)
    (run_dir / "events.jsonl").symlink_to("/dev/zero")
    _one_line_exit_2(["sync", str(run_dir), "--tracking-uri", "http://127.0.0.1:9"], "events.jsonl",
                     "a symlink where a regular file is expected")


def test_sync_refuses_a_fifo_events_file_and_summary(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path)
    os.mkfifo(run_dir / "events.jsonl")
    _one_line_exit_2(["sync", str(run_dir), "--tracking-uri", "http://127.0.0.1:9"], "events.jsonl",
                     "not a regular file")
    (run_dir / "events.jsonl").unlink()
    (run_dir / "summary.json").unlink()
    os.mkfifo(run_dir / "summary.json")
    _one_line_exit_2(["sync", str(run_dir), "--tracking-uri", "http://127.0.0.1:9"], "summary.json",
                     "not a regular file")


def test_an_events_line_over_the_line_limit_is_refused_naming_it(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    events.write_text('{"kind": "event"}\n' + '{"name": "' + "x" * LONG_LINE + '"}\n')
    with pytest.raises(InputError, match=r"events.jsonl: a line longer than the 1 MiB limit per line$"):
        read_records_counted([events])


def test_a_100_mb_style_line_in_the_training_data_is_refused_skip_bad_rows_or_not(tmp_path: Path) -> None:
    data = tmp_path / "data.jsonl"
    data.write_text('{"prompt": "a", "response": "b"}\n' + json.dumps({"prompt": "p" * LONG_LINE, "response": "r"})
                    + "\n")
    for skip in (False, True):
        with pytest.raises(InputError, match=r"data.jsonl: a line longer than the 1 MiB limit per line$"):
            read_jsonl(data, skip_bad_rows=skip)
    _one_line_exit_2(["run", "--data", str(data)], "a line longer than the 1 MiB limit per line")
    # and what it read before, it reads as before: a BOM, CRLF, U+2028 inside a string, no final newline
    good = tmp_path / "good.jsonl"
    good.write_bytes(b"\xef\xbb\xbf" + b'{"prompt": "a\xe2\x80\xa8b", "response": "c"}\r\n\n{"prompt": "d", '
                     b'"response": "e"}')
    rows, skipped = read_jsonl(good)
    assert [r["prompt"] for r in rows] == ["a\u2028b", "d"] and skipped == 0
    link = tmp_path / "link.jsonl"
    link.symlink_to(good)  # a file the user names may be a symlink to a regular file
    assert read_jsonl(link)[0] == rows
    split = tmp_path / "train.jsonl"
    split.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n")
    assert read_split(split) == rows
