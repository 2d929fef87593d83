"""What the terminal (or a CI log) shows besides a command's own output.

- every ``--help`` fits 80 columns, breaks no word, flag or path, cuts no command description
  with ``...``, and every option says what it does;
- no library warning or log line on stderr (MLflow's SQLAlchemy deprecations...), while
  llmpack's own warnings still show;
- a missing run group is answered by sqlite3, before MLflow is imported;
- the hints after Ctrl-C work: ``llmpack sync`` of the kept ``.failed`` directory, and the
  ``llmpack clean`` command the hint names removes it now;
- when stderr is not a terminal, progress is plain timestamped lines (step boundaries, each
  tenth of training), and :func:`llmpack.ui.progress.note` for any other loop.
"""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import sqlite3
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner
from rich.console import Console

from components.record.telemetry import EVENTS_FILE, EventLog, RunContext, make_record
from components.training.progress import PROGRESS_FILE
from llmpack.cli import kept_hint, main
from llmpack.report.run_group_lookup import run_group_absent
from llmpack.ui.progress import LogLines, note, rounds_text, snapshot, timestamp, watch
from llmpack.ui.terminal import quiet_library_warnings
from tests.conftest import REPO, llmpack

WIDTH = 80
TIME = re.compile(r"^\d\d:\d\d:\d\d ")
# A warning, or a line as the logging module (or MLflow's handler) formats one.
NOISE = re.compile(r"Warning|WARNING|^(DEBUG|INFO|ERROR|CRITICAL)[: ]|^\d{4}[/-]\d\d[/-]\d\d \d\d:\d\d:\d\d")


# --------------------------------------------------------------------------- help texts


def _commands(command: click.Command, path: tuple[str, ...], parent: click.Context | None = None
              ) -> Iterator[tuple[tuple[str, ...], click.Command, click.Context | None]]:
    yield path, command, parent
    if isinstance(command, click.Group):
        ctx = command.context_class(command, info_name=path[-1], parent=parent, **command.context_settings)
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            assert sub is not None, name
            yield from _commands(sub, (*path, name), ctx)


COMMANDS = list(_commands(main, ("llmpack",)))


def test_the_walk_finds_every_command() -> None:
    names = {" ".join(path) for path, _, _ in COMMANDS}
    assert {"llmpack run", "llmpack compare", "llmpack report", "llmpack sync", "llmpack clean",
            "llmpack cluster submit kfp", "llmpack cluster submit argo", "llmpack cluster submit mlflow",
            "llmpack cluster compare", "llmpack cluster doctor", "llmpack cluster plan", "llmpack cluster plan project",
            "llmpack cluster timeline"} <= names


@pytest.mark.parametrize(("path", "command", "parent"), COMMANDS, ids=[" ".join(p) for p, _, _ in COMMANDS])
def test_help_fits_80_columns_and_breaks_no_word(path: tuple[str, ...], command: click.Command,
                                                 parent: click.Context | None) -> None:
    result = CliRunner().invoke(main, [*path[1:], "--help"], prog_name="llmpack", terminal_width=WIDTH,
                                env={"COLUMNS": str(WIDTH)})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith(f"Usage: {' '.join(path)} ")
    assert [line for line in lines if len(line) > WIDTH] == []
    # No word, flag or path broken across lines (click's textwrap breaks at hyphens: "llmpack-" / "report"):
    # the same help with no width limit has the same words.
    wide = command.context_class(command, info_name=path[-1], parent=parent,
                                 **{**command.context_settings, "terminal_width": 10_000, "max_content_width": 10_000})
    assert result.output.split() == command.get_help(wide).split()
    # No backquoted command cut in half (issue 52 item 8): each line holds whole `...` spans.
    assert [line for line in lines if line.count("`") % 2] == []
    # A command list shows each description whole (click cuts a long one with "...").
    listed = lines[lines.index("Commands:") + 1:] if "Commands:" in lines else []
    assert [line for line in listed if "..." in line] == []


@pytest.mark.parametrize(("path", "command"), [(p, c) for p, c, _ in COMMANDS],
                         ids=[" ".join(p) for p, _, _ in COMMANDS])
def test_every_option_says_what_it_does(path: tuple[str, ...], command: click.Command) -> None:
    silent = [opt.opts[0] for opt in command.params
              if isinstance(opt, click.Option) and not opt.hidden and not opt.help]
    assert silent == [], f"{' '.join(path)}: options without a help text"


def test_a_backquoted_command_is_never_wrapped_inside() -> None:
    """Issue 52 item 8: help wraps between words, never inside a command a user copies; the lines that hold a
    command to type (``to decide:``, the run group's ``llmpack report``) are never wrapped at all."""
    from llmpack.ui.display import print_unbroken
    from llmpack.ui.terminal import Command

    span = "`llmpack cluster submit mlflow --namespace llmpack --wait`"
    for pad in range(0, 40, 3):  # the span lands across the 80-column edge at some padding
        cmd = Command("x", help=f"{'word ' * pad}then type {span} to submit it.")
        text = CliRunner().invoke(cmd, ["--help"], terminal_width=WIDTH).output
        assert any(span in line for line in text.splitlines()), text
        assert " ".join(text.split()).count(span) == 1
    console = Console(width=40, record=True)
    print_unbroken(console, "  to decide: ", "llmpack compare --budget 13.5m --backends direct,kfp,argo")
    assert console.export_text() == "  to decide: llmpack compare --budget 13.5m --backends direct,kfp,argo\n"


def test_top_level_list_names_every_command_on_one_line() -> None:
    output = CliRunner().invoke(main, ["--help"], prog_name="llmpack", terminal_width=WIDTH).output
    listed = output.split("Commands:\n", 1)[1].splitlines()
    assert [line.split()[0] for line in listed] == sorted(main.list_commands(click.Context(main)))


# --------------------------------------------------------------------------- library warnings


def test_library_warnings_are_silenced_and_ours_are_not() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")  # what llmpack.ui.display.library_logs_to sets: every warning once
        quiet_library_warnings()
        for module in ("mlflow.store.tracking.sqlalchemy_store", "sqlalchemy.orm", "kfp.dsl", "hera.workflows",
                       "llmpack.cli", "components.record.tracking", "mlflowish"):
            warnings.warn_explicit(f"from {module}", DeprecationWarning, filename=f"{module}.py", lineno=1,
                                   module=module)
    assert sorted(str(w.message) for w in caught) == ["from components.record.tracking", "from llmpack.cli",
                                                      "from mlflowish"]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "LLMPACK_", "PYTHONWARNINGS"))}
    return {**env, "HF_HUB_OFFLINE": "1", "COLUMNS": str(WIDTH)}


def _quiet(result: Any, *, allowed: int = 0) -> None:
    """stderr: no warning and no library log line; at most ``allowed`` lines (llmpack's own one-line error)."""
    lines = result.stderr.splitlines()
    assert [line for line in lines if NOISE.search(line)] == [], result.stderr
    assert len(lines) <= allowed, result.stderr


def _mlflow_like_store(path: Path, tags: Sequence[tuple[str, str, str]] = (), deleted: tuple[str, ...] = ()) -> str:
    """A sqlite file with the two tables of MLflow's schema the run-group lookup reads (rows: run, key, value)."""
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE runs (run_uuid TEXT PRIMARY KEY, lifecycle_stage TEXT)")
        db.execute("CREATE TABLE tags (key TEXT, value TEXT, run_uuid TEXT)")
        for run in sorted({run for run, _, _ in tags}):
            db.execute("INSERT INTO runs VALUES (?, ?)", (run, "deleted" if run in deleted else "active"))
        db.executemany("INSERT INTO tags (run_uuid, key, value) VALUES (?, ?, ?)", tags)
    return f"sqlite:///{path}"


def test_offline_commands_print_no_warnings_or_log_lines(tmp_path: Path) -> None:
    runs = tmp_path / "llmpack-runs"
    kept = _closed_kept_run(runs)
    _mlflow_like_store(tmp_path / "mlflow.db")
    fixtures = REPO / "tests" / "fixtures" / "k8s"
    env = _env()
    for args, code, allowed in [
        (("--help",), 0, 0),
        (("clean", "--help"), 0, 0),
        (("report", "--run-group", "nosuch"), 2, 1),
        (("compile", "--out", str(tmp_path / "compiled")), 0, 1),  # the one line: no --checkpoint-pvc
        (("cluster", "timeline", "--pods", str(fixtures / "pods.json"), "--nodes", str(fixtures / "nodes.json"),
          "--events", str(fixtures / "events.json")), 0, 0),
        (("sync", str(kept)), 0, 0),
        (("clean", "--dry-run"), 0, 0),
    ]:
        result = llmpack(*args, cwd=tmp_path, env=env, timeout=120)
        assert result.returncode == code, (args, result.stderr)
        _quiet(result, allowed=allowed)


@pytest.mark.slow
def test_report_on_a_new_mlflow_store_prints_one_line_and_no_sqlalchemy_warning(tmp_path: Path) -> None:
    """The store is set up by MLflow (its SQLAlchemy mappers warn ``SADeprecationWarning``): one line, exit 2."""
    (tmp_path / "mlflow.db").touch()  # a file sqlite3 cannot answer from: MLflow sets it up
    result = llmpack("report", "--run-group", "nosuch", cwd=tmp_path, env=_env(), timeout=300)
    assert result.returncode == 2
    _quiet(result, allowed=1)
    assert result.stderr.startswith("llmpack: error: run group 'nosuch': no llmpack runs in MLflow at sqlite:///")


# --------------------------------------------------------------------------- a missing run group, fast


def test_run_group_lookup_answers_only_absent(tmp_path: Path) -> None:
    uri = _mlflow_like_store(tmp_path / "mlflow.db", [
        ("r1", "llmpack.run_group", "rg-here"), ("r1", "llmpack.record", "pipeline"),
        ("r2", "llmpack.run_group", "rg-steps-only"), ("r2", "llmpack.record", "step"),
        ("r3", "llmpack.run_group", "rg-deleted"), ("r3", "llmpack.record", "pipeline"),
    ], deleted=("r3",))
    assert not run_group_absent(uri, "rg-here")
    assert (run_group_absent(uri, "nosuch") and run_group_absent(uri, "rg-steps-only")
            and run_group_absent(uri, "rg-deleted"))
    (tmp_path / "garbage.db").write_text("not a database")
    (tmp_path / "empty.db").touch()
    for unknown in (f"sqlite:///{tmp_path / 'garbage.db'}", f"sqlite:///{tmp_path / 'empty.db'}",
                    f"sqlite:///{tmp_path / 'missing.db'}", "http://127.0.0.1:5000"):
        assert not run_group_absent(unknown, "nosuch"), unknown  # cannot tell: MLflow is asked


@pytest.mark.slow
def test_run_group_lookup_reads_a_real_mlflow_store(tmp_path: Path) -> None:
    """MLflow's own schema: a synced run's group is there, another is not (the lookup never says absent wrongly)."""
    from llmpack.run.sync import sync_run

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_dir = _unsent_kept_run(tmp_path / "llmpack-runs")
    sync_run(run_dir, uri)
    assert not run_group_absent(uri, "rg-terminal")
    assert run_group_absent(uri, "rg-other")


# --------------------------------------------------------------------------- hints after Ctrl-C

CTX = RunContext(run_group="rg-terminal", pipeline_run="direct-terminal-1", orchestrator="direct", mode="local",
                 submitted_at=1_700_000_000.0)


def _closed_kept_run(runs: Path) -> Path:
    """A ``.failed`` directory as an interrupted run leaves it when its record was sent and closed: the steps'
    records, no summary.json (llmpack.run.local._abandon writes one only when it could not send)."""
    kept = runs / f"{CTX.pipeline_run}.failed"
    log = EventLog(kept / "finetune" / "model" / EVENTS_FILE)
    for i, name in enumerate(("process_started", "model_loaded")):
        log.append(make_record(CTX, "event", "finetune", name, CTX.submitted_at + i))
    return kept


def _unsent_kept_run(runs: Path) -> Path:
    """A ``.failed`` directory as an interrupted run leaves it when the store did not answer."""
    from llmpack.run.local import write_run_files

    kept = _closed_kept_run(runs)
    records = [make_record(CTX, "event", "finetune", "process_started", CTX.submitted_at)]
    write_run_files(kept, records, {
        "pipeline_run": CTX.pipeline_run, "run_group": CTX.run_group, "orchestrator": "direct", "mode": "local",
        "submitted_at": CTX.submitted_at, "finished_at": CTX.submitted_at + 3, "status": "killed",
        "metrics": {}, "tags": CTX.tags(), "tracking": "not sent", "artifacts": {"run_dir": str(kept)}})
    return kept


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_sync_of_a_closed_kept_run_says_so_twice_and_changes_nothing(tmp_path: Path) -> None:
    kept = _closed_kept_run(tmp_path / "llmpack-runs")
    before = _files(kept)
    for _ in range(2):
        result = llmpack("sync", str(kept), cwd=tmp_path, env=_env(), timeout=120)
        assert result.returncode == 0 and result.stderr == "", result.stderr
        assert result.stdout.strip() == (f"nothing to send: {kept} is an interrupted run whose MLflow record was "
                                         "sent and closed when it stopped")
    assert _files(kept) == before
    assert not (tmp_path / "mlflow.db").exists(), "no store was opened, let alone created"


def _hinted_clean(hint: str) -> list[str]:
    (command,) = re.findall(r"llmpack clean [^,;)]*", hint)
    return shlex.split(command)[1:]


def test_the_clean_command_of_the_interrupt_hint_removes_the_kept_run_now(tmp_path: Path) -> None:
    runs = tmp_path / "llmpack-runs"
    kept = _closed_kept_run(runs)
    done = runs / "direct-terminal-0"  # a successful run beside it: never removed
    done.mkdir()
    hint = kept_hint(Path("llmpack-runs") / kept.name)  # as the run names it: relative to where it was started
    assert hint.startswith(f"the run's MLflow record ended KILLED; kept llmpack-runs/{kept.name} (remove with: rm -rf ")
    result = llmpack(*_hinted_clean(hint), cwd=tmp_path, env=_env(), timeout=120)
    assert result.returncode == 0, result.stderr
    assert f"removed llmpack-runs/{kept.name}" in result.stdout
    assert not kept.exists() and done.is_dir()


def test_the_hint_for_a_kept_run_elsewhere_names_its_runs_dir(tmp_path: Path) -> None:
    kept = _closed_kept_run(tmp_path / "my runs")
    args = _hinted_clean(kept_hint(kept))
    assert args == ["clean", "--older-than", "0", "--output-dir", str(tmp_path / "my runs")]
    result = llmpack(*args, cwd=tmp_path, env=_env(), timeout=120)
    assert result.returncode == 0 and not kept.exists(), result.stderr


def test_the_hint_for_an_unsent_kept_run_says_sync_first(tmp_path: Path) -> None:
    kept = _unsent_kept_run(tmp_path / "llmpack-runs")
    hint = kept_hint(kept)
    assert hint.startswith(f"kept {kept} with the run's records, not sent (send them with: llmpack sync {kept}; then")
    assert "ended KILLED" not in hint


# --------------------------------------------------------------------------- progress in a log


def _log_console() -> Console:
    return Console(file=io.StringIO(), force_terminal=False, width=WIDTH)


def _lines(console: Console) -> list[str]:
    return console.file.getvalue().splitlines()  # type: ignore[attr-defined]


def _events(out: Path, step: str, **events: float) -> None:
    log = EventLog(out / EVENTS_FILE)
    for name, ts in events.items():
        log.append(make_record(CTX, "event", step, name, ts))


def _progress(model: Path, step: int, max_steps: int = 60) -> None:
    state = {"step": step, "max_steps": max_steps, "tokens_per_s": 1234.4, "eta_s": float(max_steps - step),
             "updated_at": 2000.0}
    (model / PROGRESS_FILE).write_text(json.dumps(state))


def test_log_lines_at_step_boundaries_and_each_tenth_of_training(tmp_path: Path) -> None:
    """A run's staging directory replayed as the steps write it, observed as watch() would, 0.3 s apart."""
    console = _log_console()
    lines = LogLines("kfp", console, clock=lambda: 3600.0 * 13 + 60 * 4 + 5)
    elapsed = iter(range(1000))

    def observe() -> None:
        lines.observe(snapshot(tmp_path, now=2000.0), float(next(elapsed)))

    observe()  # nothing yet
    _events(tmp_path / "prepare-data" / "dataset", "prepare_data", process_started=1001.0)
    observe()
    observe()  # no change: no line
    _events(tmp_path / "prepare-data" / "dataset", "prepare_data", finished=1002.0)
    model = tmp_path / "finetune" / "outputs" / "model"
    _events(model, "finetune", process_started=1003.0)
    observe()
    for step in range(0, 61):  # one observation per training step
        _progress(model, step)
        observe()
        observe()
    _events(model, "finetune", finished=1010.0)
    observe()
    out = _lines(console)
    assert all(TIME.match(line) for line in out), out
    assert all(line.startswith(f"{timestamp(3600.0 * 13 + 60 * 4 + 5)} kfp · ") for line in out)
    texts = [line.split(" · ", 1)[1].rsplit(" · ", 1)[0] for line in out]
    training = [t for t in texts if t.startswith("finetune ") and "/60" in t]
    assert texts[:4] == ["starting", "prepare_data · 0 tasks done", "prepare_data done", "finetune · 1 task done"]
    assert [t.split()[1] for t in training] == [f"{k}/60" for k in range(0, 61, 6)]  # each tenth, once
    assert training[1] == "finetune 6/60 · 1,234 tok/s · ETA 0:54"
    assert texts[-1] == "finetune done" and len(texts) == 4 + 11 + 1


def test_log_lines_say_every_finished_step_once_even_one_between_two_observations(tmp_path: Path) -> None:
    """Issue 52 (newcomer5): a quick step that starts and finishes between two polls, or finishes beside another,
    still gets its ``<step> done`` line (docs/cli.md: one when a step finishes), once, in finish order."""
    console = _log_console()
    lines = LogLines("direct", console, clock=lambda: 0.0)
    elapsed = iter(range(1000))

    def observe() -> None:
        lines.observe(snapshot(tmp_path, now=2000.0), float(next(elapsed)))

    _events(tmp_path / "prepare-data" / "dataset", "prepare-data", process_started=1001.0, finished=1001.2)
    observe()  # prepare-data started and finished before the first look
    _events(tmp_path / "prompt-lengths" / "stats", "prompt-lengths", process_started=1001.3, finished=1001.4)
    _events(tmp_path / "vocab-size" / "vocab", "vocab-size", process_started=1001.3, finished=1001.6)
    observe()  # both finished between two looks
    observe()
    observe()
    texts = [line.split(" · ", 1)[1].rsplit(" · ", 1)[0] for line in _lines(console)]
    assert texts == ["prepare-data done", "prompt-lengths done", "vocab-size done"]


def test_log_lines_are_never_wrapped(tmp_path: Path) -> None:
    console = _log_console()
    model = tmp_path / "finetune" / "model"
    _events(model, "finetune", process_started=1003.0)
    _progress(model, 500, max_steps=1000)
    LogLines("a-very-long-label-for-a-comparison-run+fuse-gpu", console).observe(snapshot(tmp_path, now=2000.0), 1234.5)
    (line,) = _lines(console)
    assert len(line) > WIDTH and line.endswith("finetune 500/1000 · 1,234 tok/s · ETA 8:20 · 1234.5s")


def test_run_with_progress_writes_log_lines_when_stderr_is_not_a_terminal(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from llmpack.run import local as runs
    from llmpack.run import show
    from llmpack.ui import display

    console = _log_console()
    monkeypatch.setattr(display, "err", console)

    def run_pipeline(opts: Any, progress: Any = None, **_: Any) -> dict[str, Any]:
        """The steps' files written under watch(), as runs.run_pipeline does around a backend's run."""
        assert isinstance(progress, LogLines)
        with watch(tmp_path, progress, interval=0.01):
            _events(tmp_path / "tokenize" / "out", "tokenize", process_started=1001.0)
            _wait_for(lambda: any("tokenize" in line for line in _lines(console)))
        return {"status": "succeeded", "metrics": {"total_s": 1.0}, "artifacts": {"run_dir": str(tmp_path)}}

    monkeypatch.setattr(runs, "run_pipeline", run_pipeline)
    show.run_with_progress(type("Opts", (), {"backend": "argo"})())
    out = _lines(console)
    progress = [line for line in out if " argo · " in line]
    assert progress and all(TIME.match(line) for line in progress), out
    assert any(" argo · tokenize · 0 tasks done · " in line for line in progress), out
    assert any(line.startswith("argo: ok in 1.0s") for line in out), out


def _wait_for(condition: Any, timeout_s: float = 30.0) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "watch() wrote no line"
        time.sleep(0.01)


def test_note_is_timestamped_plain_text_in_a_log_and_rich_in_a_terminal() -> None:
    log = _log_console()
    note("[bold]kfp[/] · round 2 of at most 5", log, now=0.0)
    assert _lines(log) == [f"{timestamp(0.0)} kfp · round 2 of at most 5"]
    terminal = Console(file=io.StringIO(), force_terminal=True, width=WIDTH)
    note("[bold]kfp[/] · round 2 of at most 5", terminal)
    out = terminal.file.getvalue()  # type: ignore[attr-defined]
    assert "\x1b[1mkfp\x1b[0m · round 2 of at most 5" in out and not TIME.match(out)


def test_rounds_text() -> None:
    assert rounds_text(0, 5, 0.0) == "round 1 of at most 5"
    assert rounds_text(2, 5, 100.0) == "round 3 of at most 5 · ETA 2:30"


def test_a_step_whose_retry_ended_well_gets_its_done_line_after_its_failed_one(tmp_path: Path) -> None:
    """Trial 9: a step whose first attempt failed and whose retry succeeded showed `picky failed`, never `done`."""
    from components.record.telemetry import FAILED_METRIC

    console = _log_console()
    lines = LogLines("direct", console, clock=lambda: 0.0)
    out = tmp_path / "picky" / "checked"
    log = EventLog(out / EVENTS_FILE)
    for rec in (make_record(CTX, "event", "picky", "process_started", 1001.0, 0),
                make_record(CTX, "metric", "picky", FAILED_METRIC, 1.0, 0),
                make_record(CTX, "event", "picky", "finished", 1001.2, 0)):
        log.append(rec)
    lines.observe(snapshot(tmp_path, now=2000.0), 1.0)
    for rec in (make_record(CTX, "event", "picky", "process_started", 1002.0, 1),
                make_record(CTX, "event", "picky", "finished", 1002.5, 1)):
        log.append(rec)
    lines.observe(snapshot(tmp_path, now=2000.0), 2.0)
    texts = [line.split(" · ", 1)[1].rsplit(" · ", 1)[0] for line in _lines(console)]
    assert texts == ["picky failed", "picky done"]
