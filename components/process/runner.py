"""Run one step in this process: the entry point every orchestrator's task calls.

    python -m components.run components.steps.finetune:finetune \\
        --input dataset=DIR --output model=DIR --param max_steps=60 --param submitted_at=...

Records ``process_started`` from the OS, calls the step function with its artifacts and typed
parameters, records ``finished``, writes every record to the JSONL file beside the step's first
output, and uploads them to MLflow (a failure there is a warning; the JSONL keeps them).
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from components import bounded, names, reporting, settings
from components.commands import CRASH_MARK, parse_pairs
from components.dsl import Step, coerce
from components.errors import InputError, Interrupted, StepFailed
from components.fusion import FusedStep, member_paths, member_values
from components.params import RUNTIME_PARAMS, TELEMETRY_PARAMS
from components.process import handoff, lifeline, startup, torchrun, warm_ahead
from components.record import gpu_metrics, telemetry, uniform
from components.record.telemetry import EVENTS_FILE, RunContext, process_start_time
from components.reporting import StepTelemetry
from components.training import distributed
from components.trainjob import gang


def load_step(ref: str) -> Step:
    module, _, attr = ref.partition(":")
    try:
        obj = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise InputError(f"step {ref!r}: cannot import ({exc})") from None
    if not isinstance(obj, Step):
        raise InputError(f"step {ref!r}: not a @step")
    return obj


def _injected_start_delay(step: Step) -> float:
    """Fault injection: the step's process starts ``delay`` seconds later, doing the same work.

    The process sleeps ``delay`` seconds where it stands and records its start that much later
    than the OS says; the seconds actually slept are returned (0.0 without injection). Nothing
    else differs from a run without injection: the same process, warm or cold alike, does the
    same work before the sleep and after it, so time to first step moves by exactly the sleep.
    (The first version re-ran the command line after the sleep; the second process's start-up
    ran beside the first's page cache and tear-down, which biased the work after the start by
    +0.2 s on a quiet machine and by -2 to +10 s under load.)
    """
    spec = os.environ.get(settings.INJECT_START_DELAY.name, "")
    delays = dict(part.split("=", 1) for part in spec.split(",") if "=" in part)
    if step.name not in delays:
        return 0.0
    try:
        delay = float(delays[step.name])
    except ValueError:
        raise InputError(f"{settings.INJECT_START_DELAY.name}={spec!r}: "
                         f"{delays[step.name]!r} is not a number of seconds") from None
    t0 = time.monotonic()
    time.sleep(max(0.0, delay))
    return time.monotonic() - t0


def _upload(tel: StepTelemetry, outputs: dict[str, str], gpu_series: dict[str, list[tuple[int, float, float]]]) -> None:
    """Log the step's records (a training log's loss curve, its GPU samples) on the run's record; bounded
    (``LLMPACK_TRACKING_MAX_WAIT_S``), a failure only warns."""
    if os.environ.get(settings.MLFLOW_LOGGING.name, "1") == "0" or os.environ.get(settings.CLIENT_UPLOADS.name) == "1":
        return
    curve = next((points for out in outputs.values() if (points := uniform.loss_curve(out))), [])
    try:
        from components.record import tracking

        handoff.await_run_id()  # a step started before its run existed: the record is marked first
        mc = tracking.step_client()  # an http(s) store: MLflow's REST API, no MLflow import

        def upload() -> None:
            run_id = tracking.open_pipeline_run(mc, tel.ctx)
            present = tracking.metric_keys(mc, run_id)  # one read for all (the series' keys are no record's)
            tracking.log_records(mc, run_id, tel.records, present=present)
            tracking.log_curve(mc, run_id, uniform.LOSS_CURVE, curve, present=present)
            for key, points in gpu_series.items():
                tracking.log_series(mc, run_id, key, points, present=present)  # once per series, as the loss curve

        tracking.with_retries(upload, tracking.upload_retry())
    except Exception as exc:  # noqa: BLE001 - the JSONL file keeps everything
        from components.redaction import redact_text  # MLflow's message may quote the tracking URI whole

        print(redact_text(f"llmpack: warning: MLflow logging failed ({type(exc).__name__}: {exc}); "
                          "events kept in JSONL"),
              file=sys.stderr)


def _fixed_thread_math() -> None:
    """Ask MKL and OpenMP for the thread count they are given, never fewer chosen at run time.

    Byte-identical weights across paths rest on every run doing its reductions the same way.
    MKL_DYNAMIC / OMP_DYNAMIC (on by default) let the libraries pick fewer threads per call;
    a fresh-clone CI run saw one of twelve identical runs end 6.8e-7 away from the others, and
    this is the one knob that can vary between otherwise identical runs. Set before torch is
    imported (the steps import it lazily); a user's own setting wins.

    OMP_WAIT_POLICY=PASSIVE: an OpenMP thread that finished its share sleeps instead of spinning.
    torch's default spins, which on a CPU shared with other work (a compare's other path, a busy
    laptop) made one process with a thread per core train 9x slower than with one thread (20 steps
    in 55 s against 6 s, load 8 on 2 cores), and so a 2-rank run (torchrun gives each rank one
    thread) report 13x the tokens/s of one rank on the same work. It changes when threads wait,
    never how a reduction is summed, so the weights stay byte-identical.
    """
    os.environ.setdefault("MKL_DYNAMIC", "FALSE")
    os.environ.setdefault("OMP_DYNAMIC", "FALSE")
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def run(argv: Sequence[str]) -> int:
    started = process_start_time()
    _fixed_thread_math()
    parser = argparse.ArgumentParser(prog="python -m components.run", description="Run one llmpack step.")
    parser.add_argument("step", help="module:function of the @step")
    parser.add_argument("--input", action="append", default=[], metavar="NAME=DIR")
    parser.add_argument("--output", action="append", default=[], metavar="NAME=DIR")
    parser.add_argument("--param", action="append", default=[], metavar="NAME=VALUE")
    args = parser.parse_args(argv)

    step = load_step(args.step)
    # fused: per member; a rank under our launcher: the launcher slept it
    injected = 0.0 if isinstance(step, FusedStep) or distributed.under_our_launcher() else _injected_start_delay(step)

    inputs, outputs, raw = (parse_pairs(args.input, "--input"), parse_pairs(args.output, "--output"),
                            parse_pairs(args.param, "--param"))
    known = {**step.params, **TELEMETRY_PARAMS, **RUNTIME_PARAMS}
    for key in raw:
        if key not in known:
            raise InputError(f"step {step.name!r}: unknown parameter {key!r}")
    for key, text in raw.items():
        names.check_length(key, text, f"step {step.name!r} parameter")
    values = {k: coerce(v, known[k].type, f"step {step.name!r} parameter {k!r}") for k, v in raw.items()}
    if not distributed.is_rank():  # no gang compiled into this pod: nnodes 1, no trainjob (a gang's ranks: its own)
        gang.check_pinned(values, f"step {step.name!r} parameter")
    for name in step.inputs:
        if name not in inputs:
            raise InputError(f"step {step.name!r}: missing --input {name}=DIR")
        if not Path(inputs[name]).is_dir():
            raise InputError(f"step {step.name!r}: input {name!r} directory {inputs[name]} does not exist")
    for name in step.outputs:
        if name not in outputs:
            raise InputError(f"step {step.name!r}: missing --output {name}=DIR")
        Path(outputs[name]).mkdir(parents=True, exist_ok=True)

    telemetry_values = {k: values.pop(k, p.default) for k, p in TELEMETRY_PARAMS.items()}
    orchestrator_run_id = values.pop("orchestrator_run_id", "")
    # A run started by the orchestrator's own CLI has no client-chosen id: use the orchestrator's.
    telemetry_values["pipeline_run"] = telemetry_values["pipeline_run"] or orchestrator_run_id
    telemetry_values["run_group"] = telemetry_values["run_group"] or telemetry_values["pipeline_run"]
    names.check_identity(telemetry_values, f"step {step.name!r} parameter")  # a path segment, a filter value, a label
    # a package compiled with mode=auto (KFP's, which kfp.local runs here as compiled) decides it here
    telemetry_values["mode"] = uniform.effective_mode(telemetry_values["mode"])
    ctx = RunContext(**telemetry_values)
    if not distributed.is_rank():  # a rank's records go through the process that launched it
        from components.record import tracking

        tracking.require_cluster_uri(ctx.mode)

    nproc = int(values.get(distributed.NPROC_PARAM, 1))
    distributed.check_nproc(nproc, f"step {step.name!r} parameter {distributed.NPROC_PARAM!r}")
    nodes = int(values.get(gang.NNODES_PARAM, 1))
    if not isinstance(step, FusedStep):
        if nodes > 1 and not distributed.is_rank():  # this pod creates the step's TrainJob (components.trainjob.gang)
            return launch_gang(args.step, step, ctx, inputs, outputs, values, nodes, started=started + injected)
        if nproc > 1 and not distributed.is_rank():  # this process launches the ranks (components.training.distributed)
            return launch_ranks(step, ctx, outputs, argv, nproc, started=started + injected, injected=injected)
        run_step(step, ctx, inputs, outputs, values, started=started + injected, injected=injected)
        return 0
    if nproc > 1 or nodes > 1:
        raise InputError(f"step {step.name!r}: {distributed.NPROC_PARAM}={nproc}, {gang.NNODES_PARAM}={nodes} "
                         "in a fused step; "
                         "run the many-process step unfused (no --fuse)")
    # A fused step: its members one after the other in this process, each with its own record.
    # A later member starts when the one before it handed over; a planted delay applies per member.
    # A member with a warm-up runs in a process parked for it at the start (components.process.warm_ahead).
    paths = {**inputs, **outputs}

    def run_member(n: int, handed_over: float, delay: float) -> None:
        member = step.members[n]
        m_inputs, m_outputs = member_paths(member, paths)
        run_step(member.step, ctx, m_inputs, m_outputs, member_values(member, values, step.params),
                 started=handed_over, injected=delay)

    parked_for = warm_ahead.parked_index()
    if parked_for is not None:  # this process is that member's parked process
        member = step.members[parked_for]
        warm_s = warm_ahead.warm(member.step)
        go = warm_ahead.wait_for_go()
        if go is not None:  # None: the fused step ended before this member's turn
            print(f"warm-ahead: {member.task}'s start-up ran beside the steps before it ({warm_s:.1f} s)", flush=True)
            run_member(parked_for, *go)
        return 0
    parked = warm_ahead.park(step.members, argv)
    try:
        for n, member in enumerate(step.members):
            handed_over = started if n == 0 else time.time()
            startup.pause_full_collections()  # each member starts up as its own process would
            delay = _injected_start_delay(member.step)
            rc = parked[n].go(handed_over + delay, delay) if n in parked else None
            if rc is None:  # not parked, or its parked process is gone: run it here
                run_member(n, handed_over + delay, delay)
            elif rc != 0:
                return rc  # the member's own error is above, in its output (128+N: a signal)
    finally:
        for p in parked.values():
            p.close()
    return 0


def run_step(step: Step, ctx: RunContext, inputs: dict[str, str], outputs: dict[str, str], values: dict[str, Any],
             *, started: float, injected: float = 0.0) -> None:
    """Call one authored step with its artifacts and parameters, recording its telemetry around it."""
    first_out = Path(outputs[next(iter(step.outputs))])
    world = distributed.world_from_env() if distributed.is_rank() else distributed.World()
    launched = world.distributed and distributed.under_our_launcher()
    attempt = (int(os.environ.get(settings.ATTEMPT.name) or 0) if launched  # the launcher counted it
               else telemetry.attempt_number(ctx, step.name, first_out / EVENTS_FILE))
    ctx = replace(ctx, attempt=attempt)  # its records: this attempt's
    events = (gang.rank_events_file(first_out, world.rank) if world.distributed and gang.ranks_write_own_files()
              else first_out / EVENTS_FILE)  # a gang's ranks on many nodes: a file each (components.trainjob.gang)
    tel = reporting.begin(StepTelemetry(ctx, step.name, events, rank=world.rank if world.distributed else None,
                                        on_model_loaded=startup.settle))
    own_ends = world.distributed and world.main and not launched  # no launcher of ours (a TrainJob): rank 0 has them
    # one sampler per node: a single process's, a gang node's first rank's (torchrun's ranks here: the launcher's)
    gpu = _gpu_sampler(step, first_out, node=gpu_metrics.node_of() if world.distributed else None,
                       mine=world.local_rank == 0 and (not launched or gang.ranks_write_own_files()))
    if own_ends:
        tel.step_event("process_started", started)
    tel.event("process_started", started)
    if injected:
        tel.metric("injected_start_delay_s", injected)

    kwargs: dict[str, Any] = dict(values)
    for name, typ in step.inputs.items():
        kwargs[name] = typ(inputs[name])
    for name, typ in step.outputs.items():
        Path(outputs[name]).mkdir(parents=True, exist_ok=True)
        kwargs[name] = typ(outputs[name])
    # the outputs pinned for the whole step, its last records too: a directory on the way swapped for a link is
    # refused (its three levels, <run>/<task>/<output>, real directories when it begins)
    with bounded.pinned_directories(outputs.values(), real_levels=3):
        try:
            telemetry.fail_if_injected(step.name, ctx.attempt)  # LLMPACK_INJECT_FAILURES (tests of retries)
            step.func(**kwargs)
        except BaseException:
            tel.metric(telemetry.FAILED_METRIC, 1.0)  # "finished" below is its time, not its success
            raise
        finally:
            startup.settle()  # a step with no model: its start-up ended with it
            tel.event("finished")
            if own_ends:
                tel.step_event("finished")
            gpu_metrics.finish(gpu, tel, started=started)  # after finished: stopping it is not step time
            if not launched:  # the launcher uploads every rank's records once
                _upload(tel, outputs, gpu_metrics.sampled_series(gpu))
            reporting.end()


def _around_launcher(step: Step, ctx: RunContext, outputs: dict[str, str],
                     launch: Callable[[RunContext, StepTelemetry], int],
                     *, started: float, injected: float = 0.0, on_this_node: bool = False) -> int:
    """Record the step around a process that launches its real work (ranks, a TrainJob); upload every record once.

    ``on_this_node``: the ranks run here (torchrun), so this process samples the node's GPUs."""
    first_out = Path(outputs[next(iter(step.outputs))])
    first_out.mkdir(parents=True, exist_ok=True)
    gpu = _gpu_sampler(step, first_out, node=None, mine=on_this_node)
    ctx = replace(ctx, attempt=telemetry.attempt_number(ctx, step.name, first_out / EVENTS_FILE))
    tel = reporting.begin(StepTelemetry(ctx, step.name, first_out / EVENTS_FILE, on_model_loaded=startup.settle))
    try:
        tel.event("process_started", started)
        if injected:
            tel.metric("injected_start_delay_s", injected)
        rc = launch(ctx, tel)
        if rc != 0:
            tel.metric(telemetry.FAILED_METRIC, 1.0)
        tel.event("finished")
        tel.records = [r for r in telemetry.read_records([first_out / EVENTS_FILE])  # every rank's, this attempt's
                       if r.step == step.name and r.pipeline_run == ctx.pipeline_run and r.attempt == ctx.attempt]
        gpu_metrics.finish(gpu, tel, started=started)  # up to the step's first_step, read from the ranks' records
        # its own samples (torchrun), else a gang's nodes' files, copied back with the outputs
        _upload(tel, outputs, gpu_metrics.sampled_series(gpu) or gpu_metrics.read_series(first_out))
    finally:
        reporting.end()
    return rc


def _gpu_sampler(step: Step, directory: Path, *, node: str | None, mine: bool) -> gpu_metrics.Sampler | None:
    """A GPU step's sampler of this node's GPUs when this process is the node's sampler (``mine``), else None."""
    if not mine or step.execution.resources.gpus <= 0:
        return None
    return gpu_metrics.start(directory, step=step.name, node=node)


def launch_gang(step_ref: str, step: Step, ctx: RunContext, inputs: dict[str, str], outputs: dict[str, str],
                values: dict[str, Any], nodes: int, *, started: float) -> int:
    """This process creates the step's TrainJob of ``nodes`` nodes and waits for it (components.trainjob.gang)."""
    rc = _around_launcher(step, ctx, outputs, started=started, launch=lambda c, tel: gang.launch(
        step_ref, step.name, c, inputs, outputs, values, nodes=nodes, tel=tel))
    if rc != 0:
        raise StepFailed(f"step {step.name!r}: its TrainJob of {nodes} nodes failed; see the line above")
    return 0


def launch_ranks(step: Step, ctx: RunContext, outputs: dict[str, str], argv: Sequence[str], nproc: int,
                 *, started: float, injected: float = 0.0) -> int:
    """This process launches ``nproc`` ranks of ``step`` (torchrun) and records the step around them."""
    rc = _around_launcher(step, ctx, outputs, started=started, injected=injected, on_this_node=True,
                          launch=lambda c, _tel: torchrun.launch(nproc, argv, attempt=c.attempt))
    if rc in (128 + signal.SIGTERM, 128 + signal.SIGINT):
        return rc
    if rc != 0:
        raise StepFailed(f"step {step.name!r}: a rank of {nproc} failed (torchrun exit {rc}); "
                         "see the ranks' output above")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    from components.redaction import install_log_redaction, redact_text

    install_log_redaction()  # every library's log line and warning in this step goes through the one redaction path
    lifeline.at_start()  # the step dies with whatever started it (a killed client leaves no step behind)
    startup.pause_full_collections()  # until the model is loaded (components.process.startup)
    try:
        return run(argv)
    except (InputError, StepFailed) as exc:
        print(redact_text(f"llmpack: error: {exc}"), file=sys.stderr)
        return exc.exit_code
    except Interrupted as exc:  # a gang's launcher cancelled: its TrainJob deleted (components.trainjob.launch)
        print(f"llmpack: {exc}; the step's TrainJob was deleted", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:  # Ctrl-C of a step: one line, not Python's traceback (its context may quote a URI)
        print("llmpack: interrupted", file=sys.stderr, flush=True)
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # and end by the signal, as Python's own handler would
        os.kill(os.getpid(), signal.SIGINT)
        return 130
    except Exception as exc:  # noqa: BLE001 - a crash in a step: show where (redacted: a frame may quote a URI), exit 1
        print(redact_text(traceback.format_exc()).rstrip("\n"), file=sys.stderr)
        # a message of several lines (or a long one): then the one line a client shows, the exception's type and
        # its first line, marked as a crash (``llmpack: error:`` means a deliberate failure, never retried)
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        if len(lines) > 1 or (lines and len(lines[0]) > 300):
            first = lines[0] if len(lines[0]) <= 300 else lines[0][:297] + "..."
            print(redact_text(f"{CRASH_MARK} {type(exc).__name__}: {first}"), file=sys.stderr)
        return 1
    finally:
        startup.settle()  # the exit then has (almost) nothing left to scan
