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

from components import settings
from components.errors import InputError, Interrupted
from llmpack.backends import BACKENDS, ORCHESTRATORS, cluster_paths
from llmpack.doctor.command import doctor as doctor_command
from llmpack.plan.command import plan as plan_command
from llmpack.plan.record import options as plan_options
from llmpack.project.command import project as project_command
from llmpack.run.clean import clean as clean_command
from llmpack.run.submit_command import submit as submit_command
from llmpack.run.sync import sync as sync_command
from llmpack.ui.options import (
    COMPILED_GPU_HELP,
    NO_PROMOTE_HELP,
    compare_cluster_options,
    known_gpu_type,
    parse_params,
    pod_options,
    run_options,
    tls_connection,
    with_promote,
)
from llmpack.ui.pod_options import POD_FLAGS, pod_options_of
from llmpack.ui.terminal import Group, LocalFirstCommand, quiet_library_warnings

DEFAULT_REPORTS = Path("llmpack-report")  # where timestamped reports go when no directory is named
DEBUG = {"on": False}  # --debug: an error's traceback is printed too (redacted), before its one line


def fail(message: str, code: int = 2, exc: BaseException | None = None) -> None:
    """The one error line (every URI, header and secret redacted), after the redacted traceback under --debug."""
    from components.redaction import redact_text

    if exc is not None and DEBUG["on"]:
        print_traceback(exc)
    message = " ".join(redact_text(message).splitlines())  # one line even when a value quoted in it holds a newline
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


class OneLineErrors(Group):
    """Usage errors and InputError become one line on stderr with exit code 2; library warnings are not shown."""

    def main(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        kwargs["standalone_mode"] = False
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
            fail(exc.format_message().replace("\n", " "), exc=exc)
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


@click.group(cls=OneLineErrors, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="llmpack")
@click.option("--debug", is_flag=True,
              help="On an error, print its traceback too (URIs, tokens and passwords redacted).")
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
@click.option("--local/--cluster", "local", default=True,
              help="Run on this machine (default) or submit to a cluster (see `llmpack submit`).")
@run_options
@click.option("--no-promote", "no_promote", is_flag=True, help=NO_PROMOTE_HELP)
@click.option("--seeds", type=click.IntRange(min=1), default=1, show_default=True,
              help="Run N times (seeds --seed..--seed+N-1): mean and 95% interval over them; the gate on the interval.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON summary on stdout; progress goes to stderr.")
def run(backend: str, local: bool, as_json: bool, params: tuple[str, ...], no_promote: bool, seeds: int,
        **kwargs: Any) -> None:
    """Run the fine-tuning pipeline once through one backend on this machine."""
    from llmpack.run.local import RunOptions, prepare
    from llmpack.ui.display import library_logs_to, run_with_progress, summary_table
    from llmpack.ui.outcome import outcome_line, promotion_phrase

    if not local:
        raise InputError(f"--cluster: use `llmpack submit {'|'.join(ORCHESTRATORS)}` or `llmpack compare --cluster`")
    opts = RunOptions(backend=backend, params=parse_params(with_promote(params, no_promote), kwargs["pipeline"]),
                      **kwargs)
    prepare(opts)  # bad input fails here, in a second, not after MLflow's 4-second import below
    if seeds > 1:  # llmpack/run/seeds.py: one run per seed, then the spread and the gate over it
        from llmpack.run.seeds import run_command

        with library_logs_to(Path(opts.output_dir) / "llmpack-client.log"):
            sys.exit(run_command(opts, seeds, as_json=as_json, echo=click.echo))
    with library_logs_to(Path(opts.output_dir) / "llmpack-client.log"):  # MLflow's INFO lines: not the terminal
        summary = run_with_progress(opts)
    if phrase := promotion_phrase(summary):
        summary["promotion"] = phrase
    if as_json:
        click.echo(json.dumps(summary, sort_keys=True))
    else:
        summary_table([summary])
        line = outcome_line(summary)  # the last line: base -> tuned on the task; the registry's decision
        if line:
            click.echo(line)
    if summary["status"] != "succeeded":
        click.echo(f"llmpack: error: {summary['orchestrator']}: {summary['error']}", err=True)
        sys.exit(1)


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
    from llmpack.run.user_pipeline import load_pipeline

    pipe = load_pipeline(pipeline) if pipeline else None
    for path in compile_all(out, pipe, fuse=fuse, prepull=prepull, cache_pvc=cache_pvc, gpus=gpus, nodes=nodes,
                            queue=queue, gpu_type=gpu_type, pod=(options := pod_options_of(pod))):
        echo_out(str(path))
    for warning in compile_warnings(options, nodes=nodes, gpus=gpus):
        click.echo(warning, err=True)
    if note := checkpoint_note(options):
        click.echo(note, err=True)


@main.command(cls=LocalFirstCommand, short_help="Run the pipeline through several paths and compare them.")
@click.option("--backends", default=",".join(BACKENDS), show_default=True, help="Comma-separated paths to compare.")
@click.option("--repeats", type=int, default=None,
              help="Fixed rounds of the whole pipeline per path (interleaved), every headline judged after the "
                   "last. Default: one full round, then start-up rounds until spin-up and time to first step "
                   "are decided (--budget); on a cluster: 1.")
@click.option("--budget", "budget", default=None, metavar="DURATION",
              help="Local compare without --repeats: stop starting rounds after this long (270, 4.5m, 1h; "
                   "default 285s, raised up to twice that when round 1 shows a slow machine, and said so).")
@click.option("--margin", "margin", default=None, metavar="SPEC",
              help="Equivalence margin: 25% (of the baseline's median; the default, at least 0.5 s for "
                   "times), 1s, $0.001, or per headline: spinup=0.5s,ttfs=10%,total=2s,cost=10%.")
@click.option("--warmup", type=int, default=None,
              help="With --repeats: full runs per path before measuring, not counted (default: 1 with "
                   "--repeats > 1, else 0).")
@click.option("--local/--cluster", "local", default=True, help="Local paths (default) or a cluster (see README).")
@run_options
@click.option("--variants", default=None, metavar="default,fuse-gpu,fuse-all",
              help="Run each path in these packagings side by side (labelled argo, argo+fuse-gpu...); see --fuse. "
                   "With --cluster each is compiled (llmpack compile --fuse) and submitted.")
@click.option("--baseline", default=None,
              help="The path the others are judged against (default: direct locally, or a single backend's default "
                   "packaging with --variants; none on a cluster).")
@click.option("--report", "report_dir", type=click.Path(path_type=Path), default=None,
              help="Write the report (report.md, report.html, report.json, PNG charts) into exactly DIR; "
                   "refused before any run if DIR holds a report, unless --force. Default: a new "
                   "llmpack-report/<UTC time>-<run group>/, with llmpack-report/latest pointing at it.")
@click.option("--force", is_flag=True, help="Replace the report in --report DIR.")
@click.option("--no-report", is_flag=True, help="Skip writing the report.")
@click.option("--control-plane-cost", "control_plane", multiple=True, metavar="ORCH=USD",
              help="Monthly control-plane cost per orchestrator, for the break-even (repeatable; kfp, argo, mlflow).")
@click.option("--control-plane-costs", "control_plane_file", default=None, help="YAML of monthly control-plane costs.")
@click.option("--inject-start-delay", default=None, metavar="SECONDS|PATH=SECONDS[,...]",
              help="Fault injection: delay the finetune step's process start on every path (2) or on some (argo=3); "
                   "a known difference the verdicts must find.")
@click.option("--wide", is_flag=True,
              help="Every column in the table (p50/p90/p99 and costs); the default fits 80 columns.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object on stdout; progress goes to stderr.")
@compare_cluster_options  # --concurrency ... --preempt: what only --cluster reads
@plan_options  # --plan FILE, --max-cost USD: the estimate on each run (docs/plan.md)
def compare(backends: str, repeats: int | None, budget: str | None, margin: str | None, warmup: int | None, local: bool,
            variants: str | None, baseline: str | None, report_dir: Path | None, force: bool, no_report: bool,
            control_plane: tuple[str, ...], control_plane_file: str | None, inject_start_delay: str | None, wide: bool,
            as_json: bool, params: tuple[str, ...], concurrency: int,
            namespace: str | None, kubeconfig: str | None, context: str | None, wait_timeout: float, poll_s: float,
            scale_down_delay_s: float | None, cache_pvc: str | None, queue: str | None, ca_cert: str | None,
            insecure_skip_tls_verify: bool,
            opencost: str | None = None, preempt: str | None = None, **kwargs: Any) -> None:
    """Run the pipeline through several paths side by side and compare them.

    With no arguments: the tiny model on built-in data through direct, kfp, argo
    and mlflow, locally and one at a time: one round of the whole pipeline, then
    start-up rounds (through finetune's first step) until every path's spin-up
    and time to first step are decided against direct, or --budget runs out.
    Decided: the interval of the difference excludes 0 (faster/slower), or lies
    inside the --margin (equivalent); the error rate is 5% across every look.
    Then a table and a report in ./llmpack-report/<time>-<run group>/
    (./llmpack-report/latest points at the newest).
    """
    from components import fusion
    from llmpack.compare import comparison as cmp
    from llmpack.compare import until_decided
    from llmpack.report import check_control_plane, parse_control_plane
    from llmpack.run.local import RunOptions, prepare
    from llmpack.ui.display import compare_table, err, library_logs_to, run_with_progress
    from llmpack.ui.progress import note

    own = {o.dest: kwargs.pop(o.dest) for path in cluster_paths().values() for o in path.compare_options}
    plan_file, max_cost = kwargs.pop("plan_file"), kwargs.pop("max_cost")
    pod = pod_options_of(kwargs)  # --image, --model-pvc...: every path compiled with them (llmpack.ui.pod_options)
    if local and pod.compiles:
        raise InputError(f"{POD_FLAGS}: only with --cluster")
    for flag in ("--model", "--data") if not local else ():  # /models/x with no volume: the flag that mounts it
        pod.check_mounted(kwargs[flag[2:]], flag)
    cluster = {"pod": pod, "concurrency": concurrency, "own": own, "namespace": namespace, "kubeconfig": kubeconfig,
               "context": context, "timeout_s": wait_timeout, "poll_s": poll_s,
               "scale_down_delay_s": scale_down_delay_s, "cache_pvc": cache_pvc, "queue": queue, "opencost": opencost,
               "preempt": preempt, "tls": {"ca_cert": ca_cert, "insecure_skip_tls_verify": insecure_skip_tls_verify}}
    if not local and kwargs["pipeline"] is not None:
        raise InputError("--pipeline: local compares only; on a cluster compile it (llmpack compile --pipeline "
                         "MODULE:NAME) and submit the artifacts")
    if local and queue is not None:
        raise InputError("--queue: only with --cluster --nodes N "
                         "(compile local artifacts with llmpack compile --queue)")
    if local and cache_pvc is not None:
        raise InputError("--cache-pvc: only with --cluster --nodes N (compile local artifacts with llmpack compile)")
    if local and scale_down_delay_s is not None:
        raise InputError("--scale-down-delay-s: only with --cluster (local runs bill no nodes)")
    if local and opencost is not None:
        raise InputError("--opencost: only with --cluster (OpenCost prices a cluster's pods)")
    if opencost is not None:
        from llmpack.k8s.reconcile import check_opencost_url

        check_opencost_url(opencost)  # before anything slow is imported
    if local and preempt is not None:
        raise InputError("--preempt: only with --cluster (a preemption takes a pod away)")
    if local and (ca_cert or insecure_skip_tls_verify):
        raise InputError("--ca-cert / --insecure-skip-tls-verify: only with --cluster (local runs talk to no server)")
    if not local:
        tls_connection(ca_cert, insecure_skip_tls_verify)
    # Every input is checked here, before the first run starts.
    names = cmp.parse_backends(backends)
    if repeats is not None:
        cmp.check_repeats(repeats)
    elif not local:
        repeats = 1  # a cluster compare runs fixed rounds (each costs GPU-hours)
    if budget is not None and (repeats is not None or not local):
        raise InputError("--budget: only for a local compare without --repeats (it bounds the rounds until decided)")
    budget_s = until_decided.parse_budget(budget)
    margins = cmp.parse_margins(margin)
    if warmup is not None and repeats is None:
        raise InputError("--warmup: only with --repeats (a compare until decided warms up by itself)")
    if warmup is not None:
        cmp.check_warmup(warmup)
        if warmup and not local:
            raise InputError("--warmup: local runs only (on a cluster, warm nodes with llmpack compile --prepull)")
    fusion.check_mode(kwargs["fuse"])
    modes = cmp.parse_variants(variants) or [kwargs["fuse"]]  # the packagings compared: --variants, else --fuse
    labels = [fusion.path_label(b, f) for f in modes for b in names]
    from llmpack.plan import record as plan_record

    planned = plan_record.before_compare(plan_file, max_cost, labels=labels, gpu_type=kwargs.get("gpu_type"),
                                         cluster=not local)  # --max-cost refuses before the first run
    costs = parse_control_plane(control_plane, control_plane_file)
    check_control_plane(costs, names)
    base = (baseline if baseline is not None else cmp.default_baseline(labels)) if local else baseline
    cmp.check_baseline(base, labels)
    if not no_report:
        check_report_target(report_dir, "--report", force=force)
    delays = cmp.parse_start_delays(inject_start_delay, names)
    output_dir = Path(kwargs["output_dir"])
    opts = RunOptions(params=parse_params(params, kwargs["pipeline"]), **kwargs)
    if local:
        prepare(opts)  # data, model, price: refused before MLflow's slow import (compare() checks every path again)

    def started(run_group: str) -> None:
        err.print(f"run group [bold]{run_group}[/] (rebuild its report: llmpack report --run-group {run_group})")

    with library_logs_to(output_dir / "llmpack-client.log"):
        if not local:
            result = cmp.with_baseline(_compare_cluster(names, modes, repeats, params, cluster, kwargs,
                                                        inject_start_delay), base, margins)
            plan_record.after_compare(planned, result)
        else:
            def run_one(o: RunOptions, label: str, **kw: Any) -> dict[str, Any]:
                return run_with_progress(o, label, env=cmp.start_delay_env(delays, o.backend), **kw)

            if repeats is None:
                result = until_decided.compare(opts, names, baseline=base, on_start=started, variants=modes,
                                               run_one=run_one, budget_s=budget_s, margins=margins,
                                               say=lambda line: note(line, err), adapt=budget is None)
            else:
                result = cmp.compare(opts, names, repeats, baseline=base, on_start=started, variants=modes,
                                     warmup=warmup, margins=margins, run_one=run_one)
        if delays:
            result["injected_start_delay_s"] = delays
        result["argv"] = _compare_argv(sys.argv)  # the recommendation's command repeats the user's own flags
        from llmpack.compare.recommend import recommend

        result["recommendation"] = recommend(result).as_dict()
        if not no_report:
            written = _write_report(result, report_dir, costs, force=force)
            click.echo("report:", err=True)
            click.echo(str(written), err=True)  # whole, on its own line: a path to copy
    if as_json:
        click.echo(json.dumps(result, sort_keys=True, default=str))
    else:
        compare_table(result, wide=wide)
    if result["failed"]:
        sys.exit(1)


def _compare_argv(argv: list[str]) -> list[str]:
    """The flags after ``compare`` on the command line (none when it was called otherwise, as in a test)."""
    return argv[argv.index("compare") + 1:] if "compare" in argv[1:] else []


def _write_report(result: dict[str, Any], target: Path | None, costs: dict[str, float], *, force: bool) -> Path:
    """Into ``target`` exactly (replacing a report only with ``force``), or else a new timestamped
    directory under :data:`DEFAULT_REPORTS` with ``latest`` pointed at it. Returns report.html."""
    from llmpack.report import link_latest, new_report_dir, write_report

    if target is not None:
        return write_report(result, target, costs, replace=force) / "report.html"
    out = write_report(result, new_report_dir(DEFAULT_REPORTS, result["run_group"]), costs)
    link_latest(DEFAULT_REPORTS, out)
    return out / "report.html"


def check_report_target(target: Path | None, flag: str, *, force: bool) -> None:
    """Before any run: the report can be written, and no existing report would be replaced without ``--force``."""
    from llmpack.report import check_report_parent

    if target is None:
        check_report_parent(DEFAULT_REPORTS, flag)
        return
    check_report_parent(target, flag)
    if target.is_dir() and any(target.iterdir()):
        if not (target / "report.json").exists():
            raise InputError(f"{flag} {target}: not empty and not an llmpack report; choose another directory")
        if not force:
            raise InputError(f"{flag} {target}: holds a report already; pass --force to replace it, "
                             "or choose another directory")


def _compare_cluster(names: list[str], modes: list[str], repeats: int, params: tuple[str, ...],
                     cluster: dict[str, Any], kwargs: dict[str, Any],
                     inject_start_delay: float | None) -> dict[str, Any]:
    """``compare --cluster``: submit every path (in every packaging of ``modes``) to one cluster, watch its pods,
    measure."""
    from llmpack.compare.cluster import compare_cluster
    from llmpack.ui.display import err

    if "direct" in names:
        raise InputError("--cluster: 'direct' has no cluster path; use --backends kfp,argo,mlflow")
    for flag, value in (("--nproc-per-node", kwargs.get("nproc_per_node")),
                        ("--inject-start-delay", inject_start_delay)):
        if value is not None:
            raise InputError(f"{flag}: not with --cluster "
                             "(the compiled artifacts fix the GPU spec; the node's GPU prices the run)")
    if cluster.get("cache_pvc") is not None and (kwargs.get("nodes") or 1) <= 1:
        raise InputError("--cache-pvc: with --cluster only for --nodes 2 or more (the TrainJob's shared volume)")
    # --gpus G / --nodes N: every path is compiled for them (llmpack compile --gpus G --nodes N) and submitted.
    values = dict(parse_params(params))
    for key in ("model", "data", "max_steps", "seed"):
        values[key] = kwargs[key]
    tls = cluster["tls"]
    shared = {k: cluster[k] for k in ("namespace", "kubeconfig", "context")}
    paths = {name: {**{o.key: cluster["own"][o.dest] for o in path.compare_options},
                    **{k: shared[k] for k in path.shared_options if shared[k]}, **tls}
             for name, path in cluster_paths().items()}  # each path's submit options, as it declares them

    def progress(label: str, message: str, elapsed: float) -> None:
        err.print(f"[bold]{label}[/] · {message} · {elapsed:5.1f}s")

    return compare_cluster(
        backends=names, repeats=repeats, concurrency=cluster["concurrency"], params=values,
        run_group=kwargs.get("run_group"),
        **paths,
        k8s={"kubeconfig": cluster["kubeconfig"], "context": cluster["context"],
             "host": settings.K8S_HOST.get(), "token": settings.K8S_TOKEN.get(),
             "ca_cert": tls["ca_cert"], "verify_ssl": not tls["insecure_skip_tls_verify"]},
        tracking_uri=kwargs.get("tracking_uri"), price_per_gpu_hour=kwargs.get("price_per_gpu_hour"),
        price_file=kwargs.get("price_file"), timeout_s=cluster["timeout_s"], poll_s=cluster["poll_s"],
        progress=progress,
        **({} if cluster["scale_down_delay_s"] is None else {"scale_down_delay_s": cluster["scale_down_delay_s"]}),
        gpus=kwargs.get("gpus"), nodes=kwargs.get("nodes"), cache_pvc=cluster.get("cache_pvc"),
        queue=cluster.get("queue"), gpu_type=kwargs.get("gpu_type"), variants=modes, pod=cluster["pod"],
        opencost=cluster.get("opencost"), preempt=cluster.get("preempt"),
    )


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
    from llmpack.report import check_control_plane, parse_control_plane, runs_from_mlflow
    from llmpack.report.run_group_lookup import run_group_absent
    from llmpack.ui.display import library_logs_to

    costs = parse_control_plane(control_plane, control_plane_file)
    check_report_target(out, "--out", force=force)
    if scale_down_delay_s is not None:
        from llmpack.k8s.billing import check_scale_down_delay

        check_scale_down_delay(scale_down_delay_s, "--scale-down-delay-s")
    check_id(run_group, "--run-group")
    uri = tracking.tracking_uri(tracking_uri)
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///"):]).exists():
        raise InputError(f"MLflow tracking URI {tracking.redact_uri(uri)}: no such database")
    if run_group_absent(uri, run_group):  # a mistyped ID, answered by sqlite3 before MLflow's seconds of set-up
        raise InputError(f"run group {run_group!r}: no llmpack runs in MLflow at {tracking.redact_uri(uri)}")
    with library_logs_to(None):
        quiet_library_warnings()  # library_logs_to shows every warning once; the libraries' own are not news
        runs = runs_from_mlflow(connect_tracking(uri), run_group)
        if scale_down_delay_s is not None:
            from llmpack.k8s.billing import rebill

            rebill(runs, scale_down_delay_s)
        check_control_plane(costs, list(dict.fromkeys(r["orchestrator"] for r in runs)))
        names = list(dict.fromkeys(cmp.path_of(r) for r in runs))
        result = cmp.comparison(run_group, names, runs, **({"baseline": baseline} if baseline else {}))
        click.echo(str(_write_report(result, out, costs, force=force)))


@main.command(short_help="Pod phases (queue, pull, start) from kubectl dumps, offline.")
@click.option("--pods", required=True, type=str, help="`kubectl get pods -o json` dump.")
@click.option("--nodes", default=None, type=str,
              help="`kubectl get nodes -o json` dump (for provisioning and GPU product).")
@click.option("--events", default=None, type=str, help="`kubectl get events -o json` dump (for image pull times).")
@click.option("--run-group", default=None, help="Keep only this run group's pods.")
@click.option("--run-id", "--kfp-run", "run_ids", multiple=True, metavar="RUN_ID=PIPELINE_RUN",
              help="Attribute an orchestrator run's pods by its own run id (pods that carry no llmpack run "
                   "labels: KFP's; --kfp-run is the same).")
@click.option("--json", "as_json", is_flag=True, help="One JSON list, one object per pod.")
def timeline(pods: str, nodes: str | None, events: str | None, run_group: str | None, run_ids: tuple[str, ...],
             as_json: bool) -> None:
    """Pod-level phases (queue, provision, image pull, container start) from kubectl dumps, offline."""
    from components.commands import parse_pairs
    from llmpack.k8s.timeline import format_table, timeline_from_files

    runs = parse_pairs(run_ids, "--run-id", "RUN_ID=PIPELINE_RUN")
    rows = timeline_from_files(pods, nodes=nodes, events=events, run_group=run_group, runs=runs or None)
    echo_out(json.dumps(rows, indent=2, sort_keys=True) if as_json else format_table(rows))


# Tracking outages and housekeeping: `llmpack sync RUN_DIR`, `llmpack clean` (docs/cli.md).
main.add_command(submit_command)  # one subcommand per cluster backend: llmpack.run.submit_command
main.add_command(sync_command)
main.add_command(clean_command)
main.add_command(doctor_command)  # before a first cluster run: docs/first-run-on-a-cluster.md
main.add_command(plan_command)  # estimates before submitting: docs/plan.md
main.add_command(project_command)  # scale projection: docs/projection.md

if __name__ == "__main__":  # pragma: no cover
    main()
