"""Live progress from the steps' own files under the run's staging directory: the same signal for every backend.

Every step writes its JSONL events beside its first output, whichever orchestrator runs it, and
the training step also keeps ``llmpack-progress.json`` there (step k of N, tokens/s, ETA). Both
are found by walking the staging directory, so direct, kfp, argo and mlflow runs show the same
line: ``finetune 23/60 · 1,234 tok/s · ETA 0:12``.

In a terminal that line is live (:func:`llmpack.run.show.run_with_progress`); when stderr is not a
terminal (a CI log), :class:`LogLines` writes plain timestamped lines at each step boundary and each
tenth of training instead, and :func:`note` is the same for any other loop's progress line.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from components import bounded
from components.errors import InputError
from components.record.telemetry import find_event_files, group_by_step, read_records
from components.training.progress import PROGRESS_FILE


@dataclass(frozen=True, kw_only=True)
class TrainProgress:
    """What the training step last wrote: ``step`` of ``max_steps`` done at ``updated_at`` (epoch s)."""

    step: int
    max_steps: int
    tokens_per_s: float | None
    eta_s: float | None
    updated_at: float


def read_train_progress(path: Path) -> TrainProgress | None:
    """The progress file at ``path``, or None when it is absent or not (yet) a progress file."""
    try:
        raw = bounded.read_json(path, 64 << 10, 4)  # a few numbers; a FIFO, link or huge file is not one
        return TrainProgress(
            step=int(raw["step"]),
            max_steps=int(raw["max_steps"]),
            tokens_per_s=None if raw.get("tokens_per_s") is None else float(raw["tokens_per_s"]),
            eta_s=None if raw.get("eta_s") is None else float(raw["eta_s"]),
            updated_at=float(raw["updated_at"]),
        )
    except (OSError, ValueError, TypeError, KeyError, InputError):
        return None


def clock(seconds: float) -> str:
    """``0:12``, ``12:34``, ``1:02:03``."""
    minutes, secs = divmod(int(round(max(0.0, seconds))), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def format_train(step: str, p: TrainProgress, now: float) -> str:
    """``finetune 23/60 · 1,234 tok/s · ETA 0:12``; the ETA counts down between the step's writes."""
    parts = [f"{step} {p.step}/{p.max_steps}"]
    if p.tokens_per_s is not None:
        parts.append(f"{p.tokens_per_s:,.0f} tok/s")
    if p.eta_s is not None:
        parts.append(f"ETA {clock(p.eta_s - max(0.0, now - p.updated_at))}")
    return " · ".join(parts)


@dataclass(frozen=True, kw_only=True)
class Snapshot:
    """What a run is doing, read from its staging directory: ``text`` is what a status line shows."""

    text: str
    done: int  # steps finished
    running: str | None  # the step running now
    train: TrainProgress | None  # the running step's training progress, while it reports it
    # every step finished so far, in the order they finished: (step, "<step> done" or "<step> failed")
    finished: tuple[tuple[str, str], ...] = ()


def snapshot(root: Path, now: float | None = None) -> Snapshot:
    """The run under ``root`` now: the training step's ``finetune 23/60 · 1,234 tok/s · ETA 0:12`` while it
    reports them, else the step running now and how many finished, else the last one finished."""
    try:
        files = find_event_files(root)
        steps = group_by_step(read_records(files))
    except (OSError, ValueError, TypeError):
        return Snapshot(text="", done=0, running=None, train=None)
    done = sorted((s for s in steps.values() if "finished" in s.events), key=lambda s: s.events["finished"])
    finished = tuple((s.step, f"{s.step} {'failed' if s.failed else 'done'}") for s in done)
    running = [s for s in steps.values() if "finished" not in s.events and "process_started" in s.events]
    if running:
        step = running[-1].step
        progress = _progress_of(step, files)
        if progress is None:
            return Snapshot(text=f"{step} · {tasks_done(len(done))}", done=len(done), running=step, train=None,
                            finished=finished)
        text = format_train(step, progress, time.time() if now is None else now)
        return Snapshot(text=text, done=len(done), running=step, train=progress, finished=finished)
    if done:
        return Snapshot(text=finished[-1][1], done=len(done), running=None, train=None, finished=finished)
    return Snapshot(text="starting", done=0, running=None, train=None)


def tasks_done(n: int) -> str:
    """``1 task done``, ``3 tasks done``: pipeline tasks, never "steps" (finetune's optimizer steps are ``23/60``)."""
    return f"{n} task{'' if n == 1 else 's'} done"


def current_step(root: Path, now: float | None = None) -> tuple[str, int]:
    """(what to show, how many steps finished) under ``root``: :func:`snapshot`'s text and count."""
    state = snapshot(root, now)
    return state.text, state.done


def _progress_of(step: str, event_files: list[Path]) -> TrainProgress | None:
    """The newest progress file beside one of ``step``'s event files (retries may leave several)."""
    found = []
    for events in event_files:
        progress = read_train_progress(events.parent / PROGRESS_FILE)
        if progress is not None and any(r.step == step for r in read_records([events])):
            found.append(progress)
    return max(found, key=lambda p: p.updated_at, default=None)


# --------------------------------------------------------------------------- output that is not a terminal


INTERRUPTED_TEXT = "interrupted: stopping the steps"


@contextmanager
def interrupt_flag() -> Iterator[threading.Event]:
    """An event set at Ctrl-C (or SIGTERM) before the interrupt unwinds, so a live line stops reading the steps.

    A step stopped by a signal still writes its ``finished`` event (finetune stops cleanly on
    SIGTERM, to keep a checkpoint), which would read as "finetune done". The previous handlers
    still run, so the interrupt itself is unchanged. Outside the main thread: never set.
    """
    import signal

    flag = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    saved = {sig: h for sig, h in saved.items() if callable(h) or sig == signal.SIGINT}  # a default SIGTERM stays as is

    def handler(signum: int, frame: Any) -> None:
        flag.set()
        previous = saved[signum]
        if callable(previous):
            previous(signum, frame)
        elif signum == signal.SIGINT:
            raise KeyboardInterrupt

    for sig in saved:
        signal.signal(sig, handler)
    try:
        yield flag
    finally:
        for sig, previous in saved.items():
            signal.signal(sig, previous)


def timestamp(now: float | None = None) -> str:
    """``14:03:27``: local wall-clock time, the prefix of every line written for a log."""
    return time.strftime("%H:%M:%S", time.localtime(time.time() if now is None else now))


class LogLines:
    """Progress for a log (stderr is not a terminal, e.g. CI): one plain timestamped line per change worth
    reading, instead of a live line that a log would show only at its end.

    A line when a step starts or finishes, and while the training step runs, when it passes each
    tenth of its steps. Every finished step gets its ``<step> done`` line once, also one that started
    and finished between two observations (or finished beside another)::

        14:03:27 kfp · finetune 6/60 · 1,234 tok/s · ETA 0:54 ·  12.0s

    :func:`watch` calls :meth:`observe` with each :class:`Snapshot` (every 0.3 s); nothing is
    written while nothing changed.
    """

    def __init__(self, label: str, console: Console, *, tenths: int = 10, clock: Callable[[], float] = time.time,
                 interrupted: threading.Event | None = None) -> None:
        self.label, self.console, self.tenths, self.clock = label, console, tenths, clock
        self.interrupted = interrupted  # set on Ctrl-C: what the steps write while they are stopped is not progress
        self._said_interrupted = False
        self._step: tuple[int, str | None] | None = None  # (steps done, step running) last written
        self._tenth: int = -1  # the running training step's last tenth written
        self._finished: set[tuple[str, str]] = set()  # (step, its line) written: "failed", then "done" on a retry

    def observe(self, state: Snapshot, elapsed: float) -> None:
        if self.interrupted is not None and self.interrupted.is_set():
            if not self._said_interrupted:
                self._said_interrupted = True
                self.write(f"{self.label} · {INTERRUPTED_TEXT} · {elapsed:5.1f}s")
            return
        for name, text in state.finished:  # each finished step once, in the order they finished (a step whose
            if (name, text) not in self._finished:  # first attempt failed and whose retry ended well: both; trial 9)
                self._finished.add((name, text))
                self.write(f"{self.label} · {text} · {elapsed:5.1f}s")
        step = (state.done, state.running)
        tenth = -1
        if state.train is not None and state.train.max_steps > 0:
            tenth = min(self.tenths, state.train.step * self.tenths // state.train.max_steps)
        if step == self._step and tenth <= self._tenth:
            return
        if step != self._step:
            self._tenth = -1
        self._step, self._tenth = step, max(self._tenth, tenth)
        if state.running is None and state.finished:
            return  # the text is the last finished step's line, written above
        self.write(f"{self.label} · {state.text} · {elapsed:5.1f}s")

    def write(self, text: str) -> None:
        """``HH:MM:SS text``, as is (no markup, no wrapping: a log line stays one line)."""
        self.console.print(f"{timestamp(self.clock())} {text}", markup=False, highlight=False, soft_wrap=True)


def note(text: str, console: Console | None = None, *, now: float | None = None) -> None:
    """One progress line on stderr from a long loop (``compare``'s rounds): ``HH:MM:SS text`` when stderr
    is not a terminal (a log), else ``text`` as rich prints it (markup allowed: ``[bold]kfp[/]``).

    ``console``: default a console on stderr; pass :data:`llmpack.ui.display.err` while its live status
    line is shown, so that the note goes above it.
    """
    console = console or Console(stderr=True)
    if console.is_terminal:
        console.print(text, highlight=False)
    else:
        plain = Text.from_markup(text).plain
        console.print(f"{timestamp(now)} {plain}", markup=False, highlight=False, soft_wrap=True)


def rounds_text(done: int, at_most: int, elapsed_s: float) -> str:
    """``round 3 of at most 5 · ETA 2:10``: the round starting now (``done`` finished in ``elapsed_s``), and
    the time the rounds left would take at the mean pace so far (no ETA before the first round ends)."""
    text = f"round {done + 1} of at most {at_most}"
    if done > 0:
        text += f" · ETA {clock(elapsed_s / done * (at_most - done))}"
    return text


@contextmanager
def watch(root: Path, update: Callable[[str, int, float], None] | LogLines, interval: float = 0.3) -> Iterator[None]:
    """While the block runs, every ``interval``: ``update(what, steps_done, elapsed_s)`` (what a live status
    line shows, as :func:`current_step`), or for a :class:`LogLines`, ``update.observe(snapshot, elapsed_s)``."""
    stop = threading.Event()
    t0 = time.monotonic()

    def loop() -> None:
        while not stop.wait(interval):
            state = snapshot(root)
            if isinstance(update, LogLines):
                update.observe(state, time.monotonic() - t0)
            else:
                update(state.text, state.done, time.monotonic() - t0)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        if isinstance(update, LogLines):  # a log's last line is how the run ended (a step that failed in 0.1 s too)
            update.observe(snapshot(root), time.monotonic() - t0)
