"""The ``llmpack`` command line: run, compile, compare, submit, report, timeline.

Exit codes: 0 ok; 1 a run failed; 2 bad input or usage (one line on stderr, no traceback).
Heavy libraries are imported inside the commands so ``llmpack --help`` stays fast.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from components.errors import InputError

GPU_HELP = "GPU type for the GPU steps' cost and placement (e.g. nvidia-h100-80gb)."


def fail(message: str, code: int = 2) -> None:
    click.echo(f"llmpack: error: {message}", err=True)
    sys.exit(code)


class OneLineErrors(click.Group):
    """Usage errors and InputError become one line on stderr with exit code 2."""

    def main(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        kwargs["standalone_mode"] = False
        try:
            rv = super().main(*args, **kwargs)
        except click.exceptions.NoArgsIsHelpError as exc:  # pragma: no cover - plain `llmpack`
            click.echo(exc.ctx.get_help() if exc.ctx else str(exc))
            sys.exit(0)
        except click.UsageError as exc:
            fail(exc.format_message().replace("\n", " "))
        except click.exceptions.Abort:
            fail("aborted", 1)
        except InputError as exc:
            fail(str(exc))
        sys.exit(rv if isinstance(rv, int) else 0)


def run_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """Options shared by ``run`` and ``compare``."""
    options = [
        click.option("--model", default="tiny", show_default=True, help="tiny (built in), a local HF model directory, or an HF id."),
        click.option("--data", default="builtin", show_default=True, help="builtin, a JSONL file (prompt/response or messages), or an HF dataset id."),
        click.option("--max-steps", type=int, default=60, show_default=True, help="Optimizer steps for finetune."),
        click.option("--seed", type=int, default=0, show_default=True),
        click.option("--output-dir", type=click.Path(path_type=Path), default=Path("llmpack-runs"), show_default=True,
                     help="Where each run's directory is written (atomically)."),
        click.option("--tracking-uri", default=None, help="MLflow tracking URI (default: MLFLOW_TRACKING_URI, else sqlite:///mlflow.db)."),
        click.option("--gpu-type", default=None, help=GPU_HELP),
        click.option("--gpus", type=int, default=None, help="GPUs per GPU step (default: the step spec's)."),
        click.option("--price-per-gpu-hour", default=None, help="Override the price (USD per GPU-hour)."),
        click.option("--price-file", default=None, type=str, help="A price YAML like components/prices.yaml."),
        click.option("--param", "params", multiple=True, metavar="NAME=VALUE", help="Any other pipeline parameter, e.g. --param lr=0.001."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def parse_params(items: tuple[str, ...]) -> dict[str, Any]:
    from components.pipeline import build
    from components.runtime import coerce

    known = build().params
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise InputError(f"--param {item!r}: expected NAME=VALUE")
        if key not in known:
            raise InputError(f"--param {key!r}: unknown pipeline parameter (known: {', '.join(known)})")
        out[key] = coerce(value, known[key].type, f"--param {key}")
    return out


@click.group(cls=OneLineErrors, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="llmpack")
def main() -> None:
    """llmpack: one LLM fine-tuning pipeline, compiled to Kubeflow Pipelines, Argo Workflows and
    MLflow Projects, run side by side and measured the same way.

    \b
    Quick start (tiny model, built-in data, no GPU, no network):
      llmpack compare                 all four paths locally, a table and a report
      llmpack run --backend kfp       one path
      llmpack compile --out build/    the three native artifacts
    """


@main.command()
@click.option("--backend", default="direct", show_default=True, help="direct | kfp | argo | mlflow")
@click.option("--local/--cluster", "local", default=True, help="Run on this machine (default) or submit to a cluster (see `llmpack submit`).")
@run_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON summary on stdout; progress goes to stderr.")
def run(backend: str, local: bool, as_json: bool, params: tuple[str, ...], **kwargs: Any) -> None:
    """Run the fine-tuning pipeline once through one backend on this machine."""
    from llmpack.display import run_with_progress, summary_table
    from llmpack.runs import RunOptions

    if not local:
        raise InputError("--cluster: use `llmpack submit kfp|argo|mlflow` or `llmpack compare --cluster`")
    opts = RunOptions(backend=backend, params=parse_params(params), **kwargs)
    summary = run_with_progress(opts)
    if as_json:
        click.echo(json.dumps(summary, sort_keys=True))
    else:
        summary_table([summary])
    if summary["status"] != "succeeded":
        click.echo(f"llmpack: error: {summary['orchestrator']}: {summary['error']}", err=True)
        sys.exit(1)


@main.command()
@click.option("--out", "out", type=click.Path(path_type=Path), default=Path("."), show_default=True,
              help="Directory to write kfp_pipelines/finetune.yaml, argo_workflows/finetune.yaml, mlflow_projects/finetune*/ into.")
def compile(out: Path) -> None:  # noqa: A001 - the command's name
    """Compile the pipeline to KFP v2 IR, an Argo Workflow (Hera) and MLflow Projects."""
    from llmpack.compile import compile_all

    for path in compile_all(out):
        click.echo(str(path))


if __name__ == "__main__":  # pragma: no cover
    main()
