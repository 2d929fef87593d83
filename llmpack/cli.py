"""The ``llmpack`` command line: run, compile, compare, submit, report, timeline.

Exit codes: 0 ok; 1 a run failed; 2 bad input or usage (one line on stderr, no traceback).
Heavy libraries are imported inside the commands so ``llmpack --help`` stays fast.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from components.errors import InputError, Interrupted
from components.redaction import redact_data
from llmpack.backends import BACKENDS, ORCHESTRATORS
from llmpack.compare.command import compare as compare_command
from llmpack.run.clean import clean as clean_command
from llmpack.run.sync import sync as sync_command
from llmpack.ui.options import (
    COMPILED_GPU_HELP,
    NO_PROMOTE_HELP,
    known_gpu_type,
    pod_options,
    run_options,
    with_promote,
)
from llmpack.ui.terminal import Group, quiet_library_warnings

DEBUG = {"on": False}  # --debug: an error's traceback is printed too (redacted), before its one line


def fail(message: str, code: int = 2, exc: BaseException | None = None) -> None:
    """The one error line (every URI, header and secret redacted), after the redacted traceback under --debug."""
    from components.redaction import redact_text

    if exc is not None and DEBUG["on"]:
        print_traceback(exc)
    message = " ".join(redact_text(message).splitlines())  # one line even when a value quoted in it holds a newline
    # a value quoted in it (a dump's name, a store's text) never drives the terminal: escape and bidi bytes as '?'
    message = "".join(c if c.isprintable() else "?" for c in message)
    click.echo(f"llmpack: error: {message}", err=True)
    sys.exit(code)


def print_traceback(exc: BaseException) -> None:
    """``exc``'s traceback on stderr through the one redaction path: a frame's message may quote a URI or token."""
    import traceback

    from components.redaction import redact_text

    click.echo(redact_text("".join(traceback.format_exception(exc))).rstrip("\n"), err=True)


def echo_out(text: str) -> None:
    """A command's result on stdout; stdout on a full disk is one line naming it, not a bare errno."""
    try:
        click.echo(text)
    except OSError as exc:
        raise InputError(f"standard output: cannot write the result ({exc.strerror or exc})") from None


LAB = "llmpack.cluster.cli"  # the lab's `cluster` group: imported by name, only when a cluster command is asked for
LAB_HELP = "The cluster lab: submit, compare, doctor, plan, timeline."
# The spellings from before the lab had its group: they still work, hidden, and say the new one on stderr.
OLD_SPELLINGS = {"submit": ("submit",), "doctor": ("doctor",), "plan": ("plan",), "project": ("plan", "project"),
                 "timeline": ("timeline",)}


def lab() -> click.Group:
    """The ``cluster`` group, imported now (one line naming the extra when the lab cannot be imported)."""
    import importlib

    try:
        return importlib.import_module(LAB).cluster
    except ImportError as exc:
        raise InputError(f"llmpack cluster: cannot import the lab ({exc}); install it with "
                         "pip install 'llmpack[cluster]'") from None


def said_instead(old: str, new: str) -> None:
    click.echo(f"llmpack: `llmpack {old}` is now `llmpack {new}`", err=True)


class OneLineErrors(Group):
    """Usage errors and InputError become one line on stderr with exit code 2; library warnings are not shown.

    The front door: the pack's commands, and ``cluster``, the lab's group, loaded by name only when asked
    for; the old spellings of the lab's commands are hidden aliases that say the new one first.
    """

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), "cluster"])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name == "cluster":
            return lab()
        if cmd_name in OLD_SPELLINGS:
            said_instead(cmd_name, " ".join(("cluster", *OLD_SPELLINGS[cmd_name])))
            found: Any = lab()
            for part in OLD_SPELLINGS[cmd_name]:
                found = found.get_command(ctx, part)
            return found
        return super().get_command(ctx, cmd_name)

    def resolve_command(self, ctx: click.Context, args: list[str]) -> tuple[str | None, click.Command | None,
                                                                            list[str]]:
        if args[:1] == ["compare"] and "--cluster" in args[1:]:  # the old `compare --cluster`
            said_instead("compare --cluster", "cluster compare")
            return "compare", lab().get_command(ctx, "compare"), [a for a in args[1:] if a != "--cluster"]
        return super().resolve_command(ctx, args)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The commands and their short help; ``cluster``'s without importing the lab."""
        rows = []
        for name in self.list_commands(ctx):
            command = None if name == "cluster" else Group.get_command(self, ctx, name)
            if command is None or not command.hidden:
                rows.append((name, LAB_HELP if command is None else command.get_short_help_str(limit=10_000)))
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def main(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        kwargs["standalone_mode"] = False
        from components.redaction import install_log_redaction

        install_log_redaction()  # urllib3's retry lines, MLflow's logs, every warning: through the one redaction path
        _bound_mlflow_retries()
        quiet_library_warnings()
        _raise_on_sigterm()
        try:
            rv = super().main(*args, **kwargs)
        except (KeyboardInterrupt, Interrupted) as exc:
            _interrupted(exc)
        except click.exceptions.NoArgsIsHelpError as exc:  # pragma: no cover - plain `llmpack`
            click.echo(exc.ctx.get_help() if exc.ctx else str(exc))
            sys.exit(0)
        except click.UsageError as exc:
            message = exc.format_message().replace("\n", " ")
            if isinstance(exc, click.NoSuchOption) and exc.option_name == "--debug":  # llmpack's own, not a command's
                message += " (--debug goes before the command: llmpack --debug run ...)"
            fail(message, exc=exc)
        except click.exceptions.Abort as exc:
            if isinstance(exc.__cause__, KeyboardInterrupt):  # click turns Ctrl-C into Abort
                _interrupted(exc.__cause__)
            fail("aborted", 1)
        except InputError as exc:
            fail(str(exc), exc=exc)
        except OSError as exc:  # a path we could not read or write: one line, not a traceback
            fail(f"{exc.filename or ''}: {exc.strerror or exc}".lstrip(": "), exc=exc)
        except Exception as exc:  # noqa: BLE001 - a bug: its traceback, but through the redaction path, exit 1
            print_traceback(exc)
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)


def _raise_on_sigterm() -> None:
    """SIGTERM unwinds like Ctrl-C does (records closed KILLED, children ended), then exits 143."""
    import signal

    def handler(signum: int, _frame: Any) -> None:
        raise Interrupted(signum)

    signal.signal(signal.SIGTERM, handler)


def _interrupted(exc: BaseException) -> None:
    """One line naming what was kept and how to remove it; exit 130 (SIGINT) or 143 (SIGTERM)."""
    kept = exc.kept if isinstance(exc, Interrupted) else [a for a in exc.args if isinstance(a, str)]
    code = exc.exit_code if isinstance(exc, Interrupted) else 130
    where = "".join(f"; {kept_hint(Path(path))}" for path in kept)
    notes = "".join(f"; {note}" for note in getattr(exc, "__notes__", []))  # what goes on elsewhere (a cluster run)
    from components.redaction import redact_text

    click.echo(redact_text(f"llmpack: interrupted{where}{notes}"), err=True)
    sys.exit(code)


def kept_hint(kept: Path) -> str:
    """What an interrupted run left in ``kept`` (its ``.failed`` directory), and the commands that act on it now."""
    import shlex

    from llmpack.run.clean import clean_now_command, unsent

    quoted = shlex.quote(str(kept))
    if unsent(kept):  # the store did not answer: the directory holds the only copy of the records
        return (f"kept {kept} with the run's records, not sent (send them with: llmpack sync {quoted}; "
                f"then remove it with: rm -rf {quoted}, or {clean_now_command(kept.parent)})")
    return (f"the run's MLflow record ended KILLED; kept {kept} (remove with: rm -rf {quoted}, or "
            f"{clean_now_command(kept.parent)}, which removes every failed run there)")


def _bound_mlflow_retries() -> None:
    """MLflow's own HTTP retries in this process bounded by ``LLMPACK_TRACKING_MAX_WAIT_S`` (a report, sync or
    compare against an unreachable store took minutes: urllib3's 7 retries of 120 s requests); the user's own
    MLFLOW_HTTP_REQUEST_* settings kept. A bad setting is left for the command to refuse in its own line."""
    import os

    from components.errors import InputError
    from components.record.retries import mlflow_http_env, upload_retry

    try:
        os.environ.update(mlflow_http_env(upload_retry(), os.environ))
    except InputError:
        pass


@click.group(cls=OneLineErrors, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="llmpack")
@click.option("--debug", is_flag=True,
              help="On an error, print its traceback too (a failed step's: the end of its log); URIs, tokens "
                   "and passwords redacted.")
def main(debug: bool) -> None:
    """llmpack: one LLM fine-tuning pipeline, compiled to Kubeflow Pipelines, Argo Workflows and
    MLflow Projects, run side by side and measured the same way.

    \b
    Quick start (tiny model, built-in data, no GPU, no network):
      llmpack compare                 all four paths locally, a table and a report
      llmpack run --backend kfp       one path
      llmpack compile --out build/    the three native artifacts
    """
    import atexit
    import gc

    DEBUG["on"] = debug
    atexit.register(gc.freeze)  # exit without a last full collection over the libraries (components.process.startup)


@main.command(short_help="Run the pipeline once through one backend, on this machine.")
@click.option("--backend", default="direct", show_default=True, help=" | ".join(BACKENDS))
@click.option("--local/--cluster", "local", default=True, hidden=True,  # --cluster: says which command submits
              help="Run on this machine (default); a cluster run is `llmpack cluster submit`.")
@run_options
@click.option("--no-promote", "no_promote", is_flag=True, help=NO_PROMOTE_HELP)
@click.option("--seeds", type=click.IntRange(min=1), default=1, show_default=True,
              help="Run N times (seeds --seed..--seed+N-1): mean and 95% interval over them; the gate on the interval.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON summary on stdout; progress goes to stderr.")
def run(backend: str, local: bool, as_json: bool, params: tuple[str, ...], no_promote: bool, seeds: int,
        **kwargs: Any) -> None:
    """Run the fine-tuning pipeline once through one backend on this machine."""
    from llmpack.run.local import RunOptions, prepare
    from llmpack.run.show import measured_only, run_with_progress, summary_table
    from llmpack.run.user_pipeline import OWN_FLAGS, run_values
    from llmpack.ui.display import library_logs_to
    from llmpack.ui.options import typed_values
    from llmpack.ui.outcome import outcome_line, promotion_phrase

    if not local:
        raise InputError(f"--cluster: use `llmpack cluster submit {'|'.join(ORCHESTRATORS)}` or "
                         "`llmpack cluster compare`")
    # the pipeline's own signature gives every value the user did not type (docs/your-pipeline.md)
    values = run_values(kwargs["pipeline"], typed_values(OWN_FLAGS, kwargs), with_promote(params, no_promote))
    opts = RunOptions(backend=backend, **{**kwargs, **values})
    prepare(opts)  # bad input fails here, in a second, not after MLflow's 4-second import below
    if seeds > 1:  # llmpack/run/seeds.py: one run per seed, then the spread and the gate over it
        from llmpack.run.seeds import run_command
        from llmpack.run.user_pipeline import load_pipeline

        if not any(t.step.name == "evaluate" for t in load_pipeline(kwargs["pipeline"]).tasks.values()):
            raise InputError("--seeds: the pipeline has no evaluate step; the spread over seeds is of its "
                             "evaluation (base -> tuned): run each seed with --seed N")

        with library_logs_to(Path(opts.output_dir) / "llmpack-client.log"):
            sys.exit(run_command(opts, seeds, as_json=as_json, echo=click.echo))
    with library_logs_to(Path(opts.output_dir) / "llmpack-client.log"):  # MLflow's INFO lines: not the terminal
        summary = run_with_progress(opts)
    if phrase := promotion_phrase(summary):
        summary["promotion"] = phrase
    if as_json:
        click.echo(json.dumps(redact_data(measured_only(summary)), sort_keys=True))
    else:
        summary_table([summary])
        line = outcome_line(summary)  # the last line: base -> tuned on the task; the registry's decision
        if line:
            click.echo(line)
    if summary["status"] != "succeeded":
        from llmpack.run.show import failed_step_log, print_log_tail

        log = failed_step_log(summary)  # where its traceback is: the line names it, --debug prints its end
        if log is not None and DEBUG["on"]:
            print_log_tail(log)
        fail(f"{summary['orchestrator']}: {summary['error']}" + (f" (its log: {log})" if log else ""), code=1)


@main.command(short_help="Compile the pipeline to KFP, Argo and MLflow artifacts.")
# The default is llmpack.compile.artifacts.DEFAULT_OUT, spelled out so that `llmpack --help` imports nothing more.
@click.option("--out", "out", type=click.Path(path_type=Path), default=Path("build/llmpack"), show_default=True,
              help="Directory to write kfp_pipelines/finetune.yaml, argo_workflows/finetune.yaml, "
                   "mlflow_projects/finetune*/ into. `--out .` in the repository root rewrites the committed "
                   "(golden) copies.")
@pod_options(namespace=True)
@click.option("--fuse", default="none", show_default=True, metavar="none|gpu|all",
              help="Fewer pods, same steps: gpu = finetune+evaluate in one pod, all = every step in one pod.")
@click.option("--prepull", is_flag=True,
              help="Also write prepull/llmpack-prepull-daemonset.yaml: pulls the step image onto every GPU node ahead "
                   "of a run (kubectl apply -f it once).")
@click.option("--cache-pvc", "cache_pvc", default=None, metavar="NAME",
              help="Mount PersistentVolumeClaim NAME as the Hugging Face cache (HF_HOME) on every step that loads a "
                   "model, tokenizer or dataset, so later runs skip the download. The PVC must exist in the namespace.")
@click.option("--gpus", type=int, default=None, help="GPUs of the finetune pod (per node); above 1 it runs torchrun "
              "with one rank per GPU (DDP).")
@click.option("--nodes", type=int, default=None, help="Nodes for finetune; above 1 its pod creates a Kubeflow Trainer "
              "TrainJob of that many GPU pods (also written to OUT/trainjob/); needs --cache-pvc (ReadWriteMany).")
@click.option("--queue", default=None, metavar="NAME",
              help="Kueue LocalQueue for the finetune TrainJob (with --nodes).")
@click.option("--gpu-type", default=None, metavar="TYPE", callback=known_gpu_type, help=COMPILED_GPU_HELP)
@click.option("--pipeline", default=None, metavar="MODULE:NAME",
              help="Your own pipeline (a @pipeline function or a Pipeline), e.g. examples.custom_step:with_report, "
                   "imported from the current directory.")
def compile(out: Path, fuse: str, prepull: bool,  # noqa: A001 - the command's name
            cache_pvc: str | None, gpus: int | None, nodes: int | None, queue: str | None,
            gpu_type: str | None, pipeline: str | None, **pod: Any) -> None:
    """Compile the pipeline to KFP v2 IR, an Argo Workflow (Hera) and MLflow Projects.

    \b
    Run it in the repository root and type the native commands there too: the
    MLflow Kubernetes config names its job template relative to that directory.
      llmpack compile --image ghcr.io/YOUR_ORG/llmpack:0.1.0   into build/llmpack/
      llmpack compile --out .                  regenerate the committed copies
      llmpack compile --fuse gpu --out build/fuse-gpu
                                               finetune and evaluate in one pod
      llmpack compile --prepull                then kubectl apply -f the DaemonSet
      llmpack compile --cache-pvc hf-models    weights cached on PVC hf-models
      llmpack compile --gpus 4 --out build/4gpu
                                               finetune: 4 torchrun ranks, 1 pod
      llmpack compile --nodes 2 --gpus 4 --cache-pvc shared --out build/2x4
                                               finetune: a TrainJob, 2 nodes x 4
      llmpack compile --gpu-type a100 --out build/a100
                                               A100 80GB nodes, labels and price
      llmpack compile --model-pvc models --data-pvc data --hf-token-secret hf
                                               /models, /data read-only; HF_TOKEN
      llmpack compile --pipeline examples.custom_step:with_report
                                               your own pipeline (on every path)
    """
    from llmpack.compile.artifacts import checkpoint_note, compile_all, compile_warnings
    from llmpack.compile.pod_options import pod_options_of
    from llmpack.run.user_pipeline import load_pipeline

    pipe = load_pipeline(pipeline) if pipeline else None
    for path in compile_all(out, pipe, fuse=fuse, prepull=prepull, cache_pvc=cache_pvc, gpus=gpus, nodes=nodes,
                            queue=queue, gpu_type=gpu_type, pod=(options := pod_options_of(pod))):
        echo_out(str(path))
    for warning in compile_warnings(options, nodes=nodes, gpus=gpus):
        click.echo(warning, err=True)
    if note := checkpoint_note(options, pipe):
        click.echo(note, err=True)


@main.command(short_help="Rebuild a comparison report from MLflow alone.")
@click.option("--run-group", required=True, help="The run group to report (llmpack.run_group tag; compare prints it).")
@click.option("--out", "out", type=click.Path(path_type=Path), default=None,
              help="Write the report into exactly OUT (an existing report there only with --force). "
                   "Default: a new llmpack-report/<UTC time>-<run group>/, with llmpack-report/latest pointing at it.")
@click.option("--force", is_flag=True, help="Replace the report in --out OUT.")
@click.option("--tracking-uri", default=None,
              help="MLflow tracking URI (default: MLFLOW_TRACKING_URI, else sqlite:///mlflow.db).")
@click.option("--baseline", default=None, help="The path the others are judged against (default: direct when present).")
@click.option("--control-plane-cost", "control_plane", multiple=True, metavar="ORCH=USD",
              help="Monthly control-plane cost per orchestrator, for the break-even (repeatable; kfp, argo, mlflow).")
@click.option("--control-plane-costs", "control_plane_file", default=None, help="YAML of monthly control-plane costs.")
@click.option("--scale-down-delay-s", "scale_down_delay_s", type=float, default=None,
              help="Re-bill cluster runs as if the autoscaler kept an empty GPU node this many seconds "
                   "(default: the delay they were billed with).")
def report(run_group: str, out: Path | None, force: bool, tracking_uri: str | None, baseline: str | None,
           control_plane: tuple[str, ...], control_plane_file: str | None, scale_down_delay_s: float | None) -> None:
    """Rebuild a comparison report from MLflow alone (cluster runs logged from anywhere)."""
    from components.record import tracking
    from components.servers.submission import check_id, connect_tracking
    from llmpack.compare import comparison as cmp
    from llmpack.compare.rebuilt import rebuilt_comparison
    from llmpack.report import check_control_plane, parse_control_plane, runs_from_mlflow
    from llmpack.report.rebill import check_scale_down_delay, rebill
    from llmpack.report.run_group_lookup import run_group_absent
    from llmpack.report.target import check_report_target, write_report_to
    from llmpack.ui.display import library_logs_to

    costs = parse_control_plane(control_plane, control_plane_file)
    check_report_target(out, "--out", force=force)
    if scale_down_delay_s is not None:
        check_scale_down_delay(scale_down_delay_s, "--scale-down-delay-s")
    check_id(run_group, "--run-group")
    uri = tracking.tracking_uri(tracking_uri)
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///"):]).is_file():  # absent, a FIFO, a device
        raise InputError(f"MLflow tracking URI {tracking.redact_uri(uri)}: no such database (or not a regular file)")
    if run_group_absent(uri, run_group):  # a mistyped ID, answered by sqlite3 before MLflow's seconds of set-up
        raise InputError(f"run group {run_group!r}: no llmpack runs in MLflow at {tracking.redact_uri(uri)}")
    with library_logs_to(None):
        quiet_library_warnings()  # library_logs_to shows every warning once; the libraries' own are not news
        runs = runs_from_mlflow(connect_tracking(uri), run_group)
        if scale_down_delay_s is not None:
            rebill(runs, scale_down_delay_s)
        check_control_plane(costs, list(dict.fromkeys(r["orchestrator"] for r in runs)))
        names = list(dict.fromkeys(cmp.path_of(r) for r in runs))
        result = rebuilt_comparison(run_group, names, runs, baseline=baseline)  # report.json's keys as compare's
        click.echo(str(write_report_to(result, out, costs, force=force)))


# Tracking outages and housekeeping: `llmpack sync RUN_DIR`, `llmpack clean` (docs/cli.md).
main.add_command(compare_command)
main.add_command(sync_command)
main.add_command(clean_command)

if __name__ == "__main__":  # pragma: no cover
    main()
