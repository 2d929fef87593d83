"""``llmpack compare``: every local path side by side, until decided or in fixed rounds, then a table and a report.

:func:`compare_options` are the options it shares with ``llmpack cluster compare`` (the lab's, which adds the
cluster, pod and plan options), :func:`finish` what both do once the runs are in: the recommendation, the
report, the table or JSON, and exit 1 when a run failed.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from components.errors import InputError
from components.redaction import redact_data
from llmpack.backends import BACKENDS
from llmpack.ui.options import run_options
from llmpack.ui.terminal import Command

SHORT_HELP = "Run the pipeline through several paths and compare them."


class CompareCommand(Command):
    """A compare command: the options named in ``hidden_options`` are accepted but not listed (``--help`` stays
    short), and an unknown option names the command that has it."""

    hidden_options: tuple[str, ...] = ("nodes", "inject_start_delay")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:
            if param.name in self.hidden_options and isinstance(param, click.Option):
                param.hidden = True

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.NoSuchOption as exc:
            raise click.UsageError(f"{exc.format_message()} (the cluster, pod and plan options are "
                                   "`llmpack cluster compare`'s)", ctx) from None


def compare_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """The options of ``compare`` and ``cluster compare``, in the order ``--help`` lists them."""
    options = [
        click.option("--backends", default=",".join(BACKENDS), show_default=True,
                     help="Comma-separated paths to compare."),
        click.option("--repeats", type=int, default=None,
                     help="Fixed rounds of the whole pipeline per path (interleaved), every headline judged after the "
                          "last. Default: one full round, then start-up rounds until spin-up and time to first step "
                          "are decided (--budget); on a cluster: 1."),
        click.option("--budget", "budget", default=None, metavar="DURATION",
                     help="Local compare without --repeats: stop starting rounds after this long (270, 4.5m, 1h; "
                          "default 285s, raised up to twice that when round 1 shows a slow machine, and said so)."),
        click.option("--margin", "margin", default=None, metavar="SPEC",
                     help="Equivalence margin: 25% (of the baseline's median; the default, at least 0.5 s for "
                          "times), 1s, $0.001, or per headline: spinup=0.5s,ttfs=10%,total=2s,cost=10%."),
        click.option("--warmup", type=int, default=None,
                     help="With --repeats: full runs per path before measuring, not counted (default: 1 with "
                          "--repeats > 1, else 0). Without --repeats a compare runs one warm-up of the baseline."),
        run_options,
        click.option("--variants", default=None, metavar="default,fuse-gpu,fuse-all",
                     help="Run each path in these packagings side by side (labelled argo, argo+fuse-gpu...); see "
                          "--fuse. On a cluster each is compiled (llmpack compile --fuse) and submitted."),
        click.option("--baseline", default=None,
                     help="The path the others are judged against (default: direct locally, or a single backend's "
                          "default packaging with --variants; none on a cluster)."),
        click.option("--report", "report_dir", type=click.Path(path_type=Path), default=None,
                     help="Write the report (report.md, report.html, report.json, PNG charts) into exactly DIR; "
                          "refused before any run if DIR holds a report, unless --force. Default: a new "
                          "llmpack-report/<UTC time>-<run group>/, with llmpack-report/latest pointing at it."),
        click.option("--force", is_flag=True, help="Replace the report in --report DIR."),
        click.option("--no-report", is_flag=True, help="Skip writing the report."),
        click.option("--control-plane-cost", "control_plane", multiple=True, metavar="ORCH=USD",
                     help="Monthly control-plane cost per orchestrator, for the break-even (repeatable; kfp, argo, "
                          "mlflow)."),
        click.option("--control-plane-costs", "control_plane_file", default=None,
                     help="YAML of monthly control-plane costs."),
        click.option("--inject-start-delay", default=None, metavar="SECONDS|PATH=SECONDS[,...]",
                     help="Fault injection: delay the finetune step's process start on every path (2) or on some "
                          "(argo=3); a known difference the verdicts must find."),
        click.option("--wide", is_flag=True,
                     help="Every column in the table (p50/p90/p99 and costs); the default fits 80 columns."),
        click.option("--json", "as_json", is_flag=True,
                     help="Print one JSON object on stdout; progress goes to stderr."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


ARGV_TAG = "llmpack.compare_argv"  # the compare's own flags (redacted), read back by `llmpack report`


def argv_tag(argv: list[str]) -> dict[str, str]:
    """``{ARGV_TAG: JSON}`` of ``argv`` redacted (a URI's credentials, known secrets), or {} when too long to tag."""
    import json

    from components.redaction import redact_text

    text = json.dumps([redact_text(a) for a in argv])
    return {ARGV_TAG: text} if len(text) <= 4000 else {}


def compare_argv(argv: list[str]) -> list[str]:
    """The flags after ``compare`` on the command line (none when it was called otherwise, as in a test)."""
    return argv[argv.index("compare") + 1:] if "compare" in argv[1:] else []


def finish(result: dict[str, Any], *, delays: dict[str, float], report_dir: Path | None, costs: dict[str, float],
           force: bool, no_report: bool) -> None:
    """What every compare adds once its runs are in: the injected delays, the user's flags, the recommendation,
    and the report (its path on stderr)."""
    from llmpack.compare.recommend import recommend
    from llmpack.report.target import write_report_to

    if delays:
        result["injected_start_delay_s"] = delays
    result["argv"] = compare_argv(sys.argv)  # the recommendation's command repeats the user's own flags
    result["recommendation"] = recommend(result).as_dict()
    if not no_report:
        written = write_report_to(result, report_dir, costs, force=force)
        click.echo("report:", err=True)
        click.echo(str(written), err=True)  # whole, on its own line: a path to copy


def show(result: dict[str, Any], *, as_json: bool, wide: bool) -> None:
    """The result on stdout (the table, or one JSON object); exit 1 when a run failed."""
    from llmpack.compare.table import compare_table

    if as_json:
        click.echo(json.dumps(redact_data(result), sort_keys=True, default=str))
    else:
        compare_table(result, wide=wide)
    if result["failed"]:
        sys.exit(1)


@click.command(cls=CompareCommand, short_help=SHORT_HELP)
@compare_options
@click.option("--local", "local", is_flag=True, hidden=True, help="The default (kept for old command lines).")
def compare(backends: str, repeats: int | None, budget: str | None, margin: str | None, warmup: int | None,
            variants: str | None, baseline: str | None, report_dir: Path | None, force: bool, no_report: bool,
            control_plane: tuple[str, ...], control_plane_file: str | None, inject_start_delay: str | None, wide: bool,
            as_json: bool, params: tuple[str, ...], local: bool, **kwargs: Any) -> None:
    """Run the pipeline through several paths side by side and compare them.

    With no arguments: the tiny model on built-in data through direct, kfp, argo
    and mlflow, locally and one at a time: one round of the whole pipeline, then
    start-up rounds (through finetune's first step) until every path's spin-up
    and time to first step are decided against direct, or --budget runs out.
    Decided: the interval of the difference excludes 0 (faster/slower), or lies
    inside the --margin (equivalent); the error rate is 5% across every look.
    Then a table and a report in ./llmpack-report/<time>-<run group>/
    (./llmpack-report/latest points at the newest). On a cluster: llmpack cluster compare.
    """
    from rich.text import Text

    from components import fusion
    from llmpack.compare import comparison as cmp
    from llmpack.compare import rounds, until_decided
    from llmpack.report import check_control_plane, parse_control_plane
    from llmpack.report.target import check_report_target
    from llmpack.run.local import RunOptions, prepare
    from llmpack.run.show import run_with_progress
    from llmpack.run.user_pipeline import OWN_FLAGS, run_values
    from llmpack.ui.display import err, library_logs_to, print_unbroken
    from llmpack.ui.options import typed_values
    from llmpack.ui.progress import note

    # Every input is checked here, before the first run starts.
    names = cmp.parse_backends(backends)
    if repeats is not None:
        cmp.check_repeats(repeats)
    if budget is not None and repeats is not None:
        raise InputError("--budget: only for a local compare without --repeats (it bounds the rounds until decided)")
    budget_s = until_decided.parse_budget(budget)
    margins = cmp.parse_margins(margin)
    if warmup is not None and repeats is None:
        raise InputError("--warmup: only with --repeats (a compare until decided warms up by itself)")
    if warmup is not None:
        cmp.check_warmup(warmup)
    fusion.check_mode(kwargs["fuse"])
    modes = cmp.parse_variants(variants) or [kwargs["fuse"]]  # the packagings compared: --variants, else --fuse
    labels = [fusion.path_label(b, f) for f in modes for b in names]
    if len(labels) < 2:  # one path, one packaging: nothing to compare it with
        raise InputError(f"--backends {','.join(names)}: a compare needs two paths (or --variants of one); one "
                         "path runs with llmpack run (--seeds N for its spread)")
    costs = parse_control_plane(control_plane, control_plane_file)
    check_control_plane(costs, names)
    base = baseline if baseline is not None else cmp.default_baseline(labels)
    cmp.check_baseline(base, labels)
    if not no_report:
        check_report_target(report_dir, "--report", force=force)
    delays = rounds.parse_start_delays(inject_start_delay, names)
    output_dir = Path(kwargs["output_dir"])
    # the pipeline's own signature gives every value the user did not type (docs/your-pipeline.md)
    opts = RunOptions(**{**kwargs, **run_values(kwargs["pipeline"], typed_values(OWN_FLAGS, kwargs), params)})
    prepare(opts)  # data, model, price: refused before MLflow's slow import (compare() checks every path again)
    if variants:  # each packaging fusable, said as typed (trial 8: a `--fuse gpu` line for `--variants fuse-gpu`)
        from llmpack.run.user_pipeline import load_pipeline

        pipe = load_pipeline(kwargs["pipeline"])
        for mode in modes:
            try:
                fusion.fuse(pipe, mode)
            except InputError as exc:
                raise InputError(str(exc).replace(f"--fuse {mode}:", f"--variants fuse-{mode}:", 1)
                                 .replace("drop --fuse", f"drop fuse-{mode} from --variants")) from None
    if margin and kwargs.get("pipeline") and "ttfs=" in margin.replace(" ", ""):
        from components.record.telemetry import TRAIN_STEP
        from llmpack.run.user_pipeline import load_pipeline

        if TRAIN_STEP not in load_pipeline(kwargs["pipeline"]).tasks:  # no first step to measure, so none to judge
            raise InputError(f"--margin {margin}: ttfs (time to first step) is not measured for a pipeline without "
                             "a finetune step; give margins for spinup, total or cost")

    def started(run_group: str) -> None:
        print_unbroken(err, "run group ", Text(run_group, style="bold"),
                       f" (rebuild its report: llmpack report --run-group {run_group})")

    flags = argv_tag(compare_argv(sys.argv))  # on every run: a report rebuilt from MLflow repeats them (trial 9)

    def run_one(o: RunOptions, label: str, **kw: Any) -> dict[str, Any]:
        kw["tags"] = {**(kw.get("tags") or {}), **flags}
        return run_with_progress(o, label, env=rounds.start_delay_env(delays, o.backend), **kw)

    with library_logs_to(output_dir / "llmpack-client.log"):
        if repeats is None:
            result = until_decided.compare(opts, names, baseline=base, on_start=started, variants=modes,
                                           run_one=run_one, budget_s=budget_s, margins=margins,
                                           say=lambda line: note(line, err), adapt=budget is None)
        else:
            result = rounds.compare(opts, names, repeats, baseline=base, on_start=started, variants=modes,
                                    warmup=warmup, margins=margins, run_one=run_one, say=lambda line: note(line, err))
        finish(result, delays=delays, report_dir=report_dir, costs=costs, force=force, no_report=no_report)
        from llmpack.compare.outcome import record_outcome

        record_outcome(result, opts.tracking_uri)  # how it ended, on its runs: `llmpack report` rebuilds the same
    show(result, as_json=as_json, wide=wide)
