"""``llmpack cluster submit <orchestrator>``: the compiled pipeline to a cluster, through each one's own client.

One subcommand per cluster backend of the registry (:mod:`llmpack.backends`), built when asked
for, so listing them imports no backend. The run it starts closes its own record on the cluster;
:mod:`llmpack.cli` registers the group.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from components.errors import InputError, Interrupted
from components.finetune_pipeline import MAX_STEPS
from components.redaction import redact_data
from llmpack.backends import ORCHESTRATORS
from llmpack.cluster.options import submit_options
from llmpack.compile.artifacts import shipped_artifact
from llmpack.compile.pod_options import pod_options_of
from llmpack.run.user_pipeline import OWN_FLAGS, load_pipeline, parse_params, raw_params
from llmpack.ui.options import tls_connection, with_promote
from llmpack.ui.terminal import Command, Group


class SubmitCommands(Group):
    """``llmpack cluster submit <name>``: one subcommand per cluster backend of the registry, built when asked for.

    Each backend declares its own options (``ClusterBackend.submit_options``); :func:`submit_options`
    adds the shared ones. Listing the names imports no backend, so ``--help`` stays fast.
    """

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(ORCHESTRATORS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        from llmpack.backends import cluster_submitter

        if cmd_name not in ORCHESTRATORS:
            return None
        backend = cluster_submitter(cmd_name)

        def command(**kw: Any) -> None:
            _submit(cmd_name, **kw)

        from llmpack.cluster.plan import record as plan_record

        func: Callable[..., Any] = plan_record.options(submit_options(command))  # --plan, --max-cost
        for option in reversed(backend.submit_options()):
            func = option(func)
        return click.command(cmd_name, cls=Command, help=backend.submit_help)(func)


@click.group(cls=SubmitCommands, short_help="Submit the compiled pipeline to a cluster.")
def submit() -> None:
    """Submit the compiled pipeline to a cluster through each orchestrator's own client.

    Tokens come from the environment, never flags: KFP_TOKEN or KF_PIPELINES_SA_TOKEN_PATH,
    ARGO_TOKEN, and your kubeconfig for the MLflow Job. They are never printed or logged.

    The run closes its own MLflow record on the cluster (KFP exit handler, Argo onExit, MLflow
    main), as it does when started with `kfp run create`, `argo submit`, Hera's
    Workflow.create() or `mlflow run`; submitting here adds the exact submit time. Hera users:
    `from argo_workflows.pipeline import finetune_workflow`, then .create().
    """


def _submit(orchestrator: str, *, model: str | None, data: str | None, max_steps: int | None,
            seed: int | None, params: tuple[str, ...], no_promote: bool, wait: bool, wait_timeout: float, as_json: bool,
            ca_cert: str | None, insecure_skip_tls_verify: bool, **kw: Any) -> None:
    from llmpack.backends import cluster_submitter

    backend = cluster_submitter(orchestrator)
    tls = tls_connection(ca_cert, insecure_skip_tls_verify)
    fields = backend.connection_fields()
    conn = backend.connect({**{k: v for k, v in kw.items() if k in fields}, **tls})
    kw = {k: v for k, v in kw.items() if k not in fields}

    typed = {"model": model, "data": data, "max_steps": max_steps, "seed": seed}
    own = backend.cluster_path.artifact_option if backend.cluster_path else None  # --package, --workflow, --project
    if own and kw.get(own):  # a compiled artifact of one's own pipeline (compile --pipeline): the backend
        # checks each value against the parameters that artifact declares
        if max_steps is not None and not 1 <= max_steps <= MAX_STEPS:  # the pack's bound, whatever the file declares
            raise InputError(f"--max-steps {max_steps}: must be a positive number of steps, at most {MAX_STEPS:,}")
        values: dict[str, Any] = {**raw_params(with_promote(params, no_promote)),
                                  **{k: v for k, v in typed.items() if v is not None}}
    else:
        pipe = load_pipeline(None)  # the compiled artifacts' pipeline: its one gate, one wording (as run's)
        values = {**parse_params(with_promote(params, no_promote), pipe),
                  **pipe.bind(typed, flag="--param", flags=OWN_FLAGS)}
    from llmpack.cluster.plan import record as plan_record
    from llmpack.compile.artifacts import compiled_for_submit

    plan_file, max_cost = kw.pop("plan_file", None), kw.pop("max_cost", None)
    pod = pod_options_of(kw)  # --image, --model-pvc...: compiled first, as --gpu-type
    with compiled_for_submit(orchestrator, kw.pop("gpu_type", None), kw, pod=pod, values=values) as artifact, \
            contextlib.ExitStack() as stack:
        # the compiled artifact replaces an unset option; --max-cost checks the estimate of the GPU type it asks
        # for, and refuses here, before anything is sent
        shipped = shipped_artifact(orchestrator)
        named = artifact.get(own or "") or kw.get(own or "")
        if named and Path(str(named)).resolve() == shipped.resolve():  # the install's own committed artifact: that
            named, artifact = None, {**artifact, own: str(shipped)}  # one is sent, never the typed link read again
        if plan_file is not None and named:  # what --plan reads is what is sent: a private copy that verified
            from llmpack.compile import signatures

            named = str(stack.enter_context(signatures.verified(str(named))))
            artifact = {**artifact, own: named}
        planned = plan_record.before_submit(plan_file, max_cost, orchestrator, str(named or shipped), values,
                                            shipped=not named)
        run = backend.submit(conn, params=values, **{**kw, **artifact})
    summary = run.summary
    try:  # from here on the run exists on the cluster: a failure names it and how to remove it
        plan_record.after_submit(planned, summary)
        for warning in summary.get("warnings", []):
            click.echo(f"llmpack: warning: {warning}", err=True)
        if wait:
            run.wait(wait_timeout)
    except (KeyboardInterrupt, Interrupted) as exc:  # stop waiting; the run is the cluster's
        exc.add_note(run.still_running())  # as with argo submit --wait
        raise
    except Exception as exc:  # noqa: BLE001 - one line: what failed, what it left, the command that removes it
        from llmpack.cli import fail

        fail(f"{orchestrator}: {exc if isinstance(exc, InputError) else f'{type(exc).__name__}: {exc}'}; "
             f"{run.left_behind()}", 1, exc)
    if as_json:
        click.echo(json.dumps(redact_data(summary), sort_keys=True, default=str))  # round 24: URIs whole
    else:
        click.echo(f"{orchestrator}: submitted {summary['pipeline_run']} (run group {summary['run_group']}, "
                   f"server id {summary.get('server_id')})")
        if wait:
            click.echo(f"{orchestrator}: {summary['result']['status']}")
    if wait and summary["result"]["status"] != "succeeded":
        if summary["result"]["status"] == "timeout":  # still running: say so, why it waits, and how to remove it
            if summary["result"].get("waiting_on"):
                click.echo(f"llmpack: still waiting: {summary['result']['waiting_on']}", err=True)
            click.echo(f"llmpack: {run.still_running()}", err=True)
        else:
            click.echo(f"llmpack: {run.left_behind()}", err=True)
        sys.exit(1)
