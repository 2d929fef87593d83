"""SIGKILL the finetune step at random moments; every restart must end byte-identical to an uninterrupted run.

    python benchmarks/chaos_sigkill.py [--kills 20] [--seed 0] [--max-steps 12] [--checkpoint-every 2]

How to run it, what it prints and why: docs/internals/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from components import settings
from components.record.telemetry import EVENTS_FILE

REPO = Path(__file__).resolve().parents[1]
PREP = "components.steps.prepare_data:prepare_data"
TOK = "components.steps.tokenize:tokenize"
TUNE = "components.steps.finetune:finetune"
ADAPTER = Path("adapter") / "adapter_model.safetensors"
POLL_S = 0.005
Phase = Literal["startup", "step", "checkpoint", "between"]
PHASES: tuple[Phase, ...] = ("startup", "step", "checkpoint", "between")


@dataclass(frozen=True, kw_only=True)
class Settings:
    max_steps: int
    checkpoint_every: int
    batch_size: int
    pause_s: float  # the checkpoint-write pause of the "checkpoint" trials
    threads: int  # OMP_NUM_THREADS / MKL_NUM_THREADS of every finetune process; 0: the environment's
    timeout_s: float  # per process


@dataclass(frozen=True, kw_only=True)
class Reference:
    adapter: bytes
    load_s: float  # process start -> model_loaded
    train_s: float
    step_s: float  # mean time of a step after the first (the first one also warms up)


@dataclass(frozen=True, kw_only=True)
class KillPlan:
    phase: Phase
    fraction: float  # of the phase's span: load (startup), one step (step), the write pause (checkpoint)
    at_step: int  # the step whose log line (step), checkpoint write (checkpoint) or rename (between) is aimed at


@dataclass(frozen=True, kw_only=True)
class Trial:
    plan: KillPlan
    killed: bool
    kill_at_s: float  # after the killed process was started
    landed: str
    intact_steps: tuple[int, ...]  # step-* directories that passed torch.load after the kill
    torn_steps: tuple[int, ...]  # step-* directories that did not
    resumed_from: int
    skipped_reported: int  # "skipping incomplete checkpoint" lines of the restart
    restart_rc: int
    restart_tail: str  # the restart's last output lines, shown when it failed
    identical: bool
    leftovers: tuple[str, ...]  # .tmp-* directories after the restart finished

    @property
    def partial_loaded(self) -> bool:
        return self.resumed_from != 0 and self.resumed_from not in self.intact_steps

    @property
    def ok(self) -> bool:
        newest_intact = max(self.intact_steps, default=0)
        return (self.killed and self.restart_rc == 0 and self.identical and self.resumed_from == newest_intact
                and not self.leftovers)


# --------------------------------------------------------------------------- files the step writes


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def _lines_since(path: Path, offset: int) -> list[str]:
    if not path.exists():
        return []
    with path.open("rb") as fh:
        fh.seek(offset)
        text = fh.read().decode("utf-8", errors="replace")
    return [line for line in text.splitlines() if line.strip()]


def _records_since(path: Path, offset: int) -> list[dict[str, Any]]:
    out = []
    for line in _lines_since(path, offset):
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut short by the kill
    return out


def _intact_step(path: Path) -> int | None:
    """The step a checkpoint directory holds when its state file loads whole and says so, else None."""
    from components.training.checkpoint_state import read_state

    try:
        state = read_state(path)
        step = int(state["step"])
    except Exception:  # noqa: BLE001 - any failure to load means the directory is not a whole checkpoint
        return None
    whole = {"trainable", "optimizer", "rng"} <= state.keys() and path.name == f"step-{step:08d}"
    return step if whole else None


# --------------------------------------------------------------------------- running the steps


def _env(extra: dict[str, str] | None = None, threads: int = 0) -> dict[str, str]:
    pinned = {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)} if threads else {}
    return {**os.environ, "LLMPACK_MLFLOW_LOGGING": "0", "HF_HUB_OFFLINE": "1", **pinned, **(extra or {})}


def _step(ref: str, *args: str) -> None:
    r = subprocess.run([sys.executable, "-m", "components.run", ref, *args], cwd=REPO, env=_env(),
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise SystemExit(f"{ref} failed ({r.returncode}):\n{r.stdout}{r.stderr}")


def prepare(root: Path, builtin_size: int, seq_len: int) -> Path:
    """Built-in data, prepared and tokenized once; the tokens directory."""
    _step(PREP, f"--output=dataset={root / 'data'}", f"--param=builtin_size={builtin_size}")
    _step(TOK, f"--input=dataset={root / 'data'}", f"--output=tokens={root / 'tokens'}", f"--param=seq_len={seq_len}")
    return root / "tokens"


def finetune_cmd(tokens: Path, out: Path, ckpt: Path, s: Settings) -> list[str]:
    return [sys.executable, "-m", "components.run", TUNE, f"--input=tokens={tokens}", f"--output=model={out}",
            f"--param=max_steps={s.max_steps}", f"--param=batch_size={s.batch_size}",
            f"--param=checkpoint_every={s.checkpoint_every}", f"--param=checkpoint_dir={ckpt}"]


def reference(tokens: Path, root: Path, s: Settings) -> Reference:
    """One uninterrupted run of the same command: the bytes every trial must end with."""
    out = root / "reference"
    r = subprocess.run(finetune_cmd(tokens, out, root / "reference-ckpt", s), cwd=REPO, env=_env(threads=s.threads),
                       capture_output=True, text=True, timeout=s.timeout_s)
    if r.returncode != 0:
        raise SystemExit(f"reference finetune failed ({r.returncode}):\n{r.stdout}{r.stderr}")
    rec = {x["name"]: x["value"] for x in _records_since(out / EVENTS_FILE, 0)}
    first_s = rec["first_step"] - rec["model_loaded"]
    return Reference(adapter=(out / ADAPTER).read_bytes(), load_s=rec["model_loaded"] - rec["process_started"],
                     train_s=rec["train_s"], step_s=max(0.0, rec["train_s"] - first_s) / max(1, s.max_steps - 1))


def plan_kills(n: int, rng: random.Random, s: Settings) -> list[KillPlan]:
    checkpoints = list(range(s.checkpoint_every, s.max_steps, s.checkpoint_every))
    plans = []
    for i in range(n):
        phase = PHASES[i % len(PHASES)]
        at_step = rng.randrange(1, s.max_steps) if phase == "step" else rng.choice(checkpoints)
        plans.append(KillPlan(phase=phase, fraction=rng.uniform(0.1, 0.9), at_step=at_step))
    return plans


def _wait(until: Callable[[], bool], proc: subprocess.Popen[str], deadline: float) -> bool:
    """Poll ``until`` while the process runs; False when it exited (or time ran out) first."""
    while proc.poll() is None and time.monotonic() < deadline:
        if until():
            return True
        time.sleep(POLL_S)
    return False


def kill_at_moment(proc: subprocess.Popen[str], plan: KillPlan, ref: Reference, s: Settings, *, train_log: Path,
                   log_offset: int, ckpt: Path) -> bool:
    """Wait for the planned moment and SIGKILL the process; False when it finished first."""
    started = time.monotonic()
    deadline = started + s.timeout_s

    def later(delay_s: float) -> bool:
        target = time.monotonic() + delay_s
        return _wait(lambda: time.monotonic() >= target, proc, deadline)

    if plan.phase == "startup":
        hit = later(plan.fraction * ref.load_s)
    elif plan.phase == "step":
        hit = _wait(lambda: len(_lines_since(train_log, log_offset)) >= plan.at_step, proc, deadline)
        hit = hit and later(plan.fraction * ref.step_s)
    elif plan.phase == "checkpoint":
        hit = _wait((ckpt / f".tmp-step-{plan.at_step:08d}-{proc.pid}").exists, proc, deadline)
        hit = hit and later(plan.fraction * s.pause_s)
    else:  # between
        hit = _wait((ckpt / f"step-{plan.at_step:08d}").exists, proc, deadline)
    if hit:
        proc.send_signal(signal.SIGKILL)
    proc.wait()
    return hit


def landed(*, pid: int, out: Path, ckpt: Path, events_offset: int, log_offset: int, max_steps: int) -> str:
    """Where the kill landed, from what the killed attempt left behind."""
    names = {r.get("name") for r in _records_since(out / EVENTS_FILE, events_offset)}
    if "model_loaded" not in names:
        return "startup"
    writing = sorted(ckpt.glob(f".tmp-step-*-{pid}"))
    if writing:
        return f"checkpoint {int(writing[0].name.split('-')[2])} write"
    done = len(_lines_since(out / "train_log.jsonl", log_offset))
    return f"{done} steps done" if done < max_steps else "saving outputs"


def run_trial(index: int, plan: KillPlan, tokens: Path, root: Path, ref: Reference, s: Settings) -> Trial:
    out, ckpt = root / f"trial-{index:02d}", root / f"trial-{index:02d}-ckpt"
    cmd = finetune_cmd(tokens, out, ckpt, s)
    env = _env({settings.CHAOS_CHECKPOINT_PAUSE_S.name: str(s.pause_s)} if plan.phase == "checkpoint" else None,
               s.threads)

    # ---- the attempt that gets killed
    events_offset, log_offset = _size(out / EVENTS_FILE), _size(out / "train_log.jsonl")
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True)
    killed = kill_at_moment(proc, plan, ref, s, train_log=out / "train_log.jsonl", log_offset=log_offset, ckpt=ckpt)
    kill_at_s = time.monotonic() - t0
    where = landed(pid=proc.pid, out=out, ckpt=ckpt, events_offset=events_offset, log_offset=log_offset,
                   max_steps=s.max_steps)

    # ---- what a restart may resume from: checked while nothing runs, without the step's own check
    checked = {p: _intact_step(p) for p in sorted(ckpt.glob("step-*"))}
    intact = tuple(sorted(step for step in checked.values() if step is not None))
    torn = tuple(int(p.name.removeprefix("step-")) for p, step in checked.items() if step is None)

    # ---- the restart: the same command, to the end
    events_offset = _size(out / EVENTS_FILE)
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=s.timeout_s)
    resumed = [x["value"] for x in _records_since(out / EVENTS_FILE, events_offset)
               if x.get("name") == "resumed_from_step"]
    adapter = out / ADAPTER
    return Trial(plan=plan, killed=killed, kill_at_s=kill_at_s, landed=where, intact_steps=intact, torn_steps=torn,
                 resumed_from=int(resumed[-1]) if resumed else 0,
                 skipped_reported=r.stdout.count("skipping incomplete checkpoint"), restart_rc=r.returncode,
                 restart_tail="\n".join((r.stdout + r.stderr).splitlines()[-8:]),
                 identical=adapter.exists() and adapter.read_bytes() == ref.adapter,
                 leftovers=tuple(p.name for p in ckpt.glob(".tmp-*")))


# --------------------------------------------------------------------------- report


def render_row(i: int, t: Trial) -> str:
    target = {"startup": "startup", "step": f"inside step {t.plan.at_step + 1}",
              "checkpoint": f"checkpoint {t.plan.at_step} write",
              "between": f"after checkpoint {t.plan.at_step}"}[t.plan.phase]
    kill = f"{t.kill_at_s:6.2f} s / {t.landed}" if t.killed else "no kill (finished first)"
    resumed = f"step {t.resumed_from}" if t.resumed_from else "start (none)"
    verdict = "yes" if t.identical else "NO"
    notes = []
    if t.torn_steps:
        notes.append(f"torn on disk: {list(t.torn_steps)}")
    if t.restart_rc != 0:
        notes.append(f"restart exit {t.restart_rc}")
    if t.resumed_from != max(t.intact_steps, default=0):
        notes.append(f"newest whole checkpoint was {max(t.intact_steps, default=0)}")
    if t.leftovers:
        notes.append(f"left: {', '.join(t.leftovers)}")
    return f"{i:>5}  {target:<20}  {kill:<32}  {resumed:<13}  {verdict:<9}  {'; '.join(notes)}".rstrip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=20, help="trials, one SIGKILL each (default 20)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the kill moments (default 0)")
    parser.add_argument("--max-steps", type=int, default=12)
    parser.add_argument("--checkpoint-every", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--builtin-size", type=int, default=600)
    parser.add_argument("--pause-s", type=float, default=0.3, help="checkpoint-write pause of the checkpoint trials")
    parser.add_argument("--threads", type=int, default=1, help="OMP/MKL threads per finetune process; 0: as set")
    parser.add_argument("--workdir", type=Path, help="keep every run here (default: a temporary directory, removed)")
    args = parser.parse_args(argv)
    if args.kills < 1 or args.checkpoint_every < 1 or args.max_steps <= args.checkpoint_every:
        parser.error("need --kills >= 1 and 1 <= --checkpoint-every < --max-steps")
    s = Settings(max_steps=args.max_steps, checkpoint_every=args.checkpoint_every, batch_size=args.batch_size,
                 pause_s=args.pause_s, threads=args.threads, timeout_s=300)

    wall0 = time.monotonic()
    print(f"load average before: {os.getloadavg()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="llmpack-chaos-") as scratch:
        root = args.workdir or Path(scratch)
        root.mkdir(parents=True, exist_ok=True)
        tokens = prepare(root, args.builtin_size, args.seq_len)
        ref = reference(tokens, root, s)
        print(f"reference: model loaded after {ref.load_s:.2f} s, {s.max_steps} steps in {ref.train_s:.2f} s "
              f"({ref.step_s:.2f} s a step after the first), checkpoint every {s.checkpoint_every}, "
              f"threads {s.threads or 'as set'}; {args.kills} trials, seed {args.seed}", flush=True)
        print(f"{'trial':>5}  {'phase targeted':<20}  {'kill at (s / where it landed)':<32}  {'resumed from':<13}  "
              f"identical  notes", flush=True)
        trials = []
        for i, plan in enumerate(plan_kills(args.kills, random.Random(args.seed), s), start=1):
            trials.append(run_trial(i, plan, tokens, root, ref, s))
            print(render_row(i, trials[-1]), flush=True)
            if trials[-1].restart_rc != 0:
                print(trials[-1].restart_tail, flush=True)

    identical = sum(t.identical for t in trials)
    partial = sum(t.partial_loaded for t in trials)
    torn = sum(len(t.torn_steps) for t in trials)
    print(f"{identical}/{len(trials)} identical, {partial} partial checkpoints loaded", flush=True)
    print(f"torn checkpoint directories on disk after a kill: {torn}; restarts that reported skipping one: "
          f"{sum(t.skipped_reported > 0 for t in trials)}; kills that landed: {sum(t.killed for t in trials)}/"
          f"{len(trials)}; trials passing every check: {sum(t.ok for t in trials)}/{len(trials)}")
    print(f"wall time {time.monotonic() - wall0:.0f} s; load average after: {os.getloadavg()}", flush=True)
    return 0 if all(t.ok for t in trials) else 1


if __name__ == "__main__":
    raise SystemExit(main())
