"""``llmpack cluster``: the lab's commands in one group: submit, compare, doctor, plan (and ``plan project``), timeline.

:mod:`llmpack.cli` loads this module only when a cluster command is asked for, by name, so the pack's commands
import nothing of the lab. Each command's work is in its room, imported when it runs.
"""

from __future__ import annotations

import json
from typing import Any

import click

from components.redaction import redact_data
from llmpack.cluster.compare.command import compare
from llmpack.cluster.doctor.command import doctor
from llmpack.cluster.plan.command import plan as plan_command
from llmpack.cluster.plan.project.command import project
from llmpack.cluster.submit_command import submit
from llmpack.ui.terminal import Group, command

SHORT_HELP = "Cluster commands: submit, compare, doctor, plan, timeline (pip install 'llmpack[cluster]')."


@click.group("cluster", cls=Group, short_help=SHORT_HELP)
def cluster() -> None:
    """What runs against a Kubernetes cluster (the lab beside the pack): submit the compiled pipeline,
    compare the paths on one cluster, check a cluster before a first run, plan and project spin-up and
    cost, read pod timelines from kubectl dumps.

    \b
      llmpack cluster doctor                   ready for a first run?
      llmpack cluster submit argo --host URL   one run, one orchestrator
      llmpack cluster compare --backends kfp,argo --kfp-host URL --argo-host URL
      llmpack cluster plan --paths argo --gpu-type h100,a100
      llmpack cluster plan project --nodes 2,4,8
    """


class PlanGroup(Group):
    """``llmpack cluster plan``: the plan itself when no subcommand is named, ``plan project`` the projection."""

    def format_usage(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        formatter.write_usage(ctx.command_path, "[OPTIONS] | project [OPTIONS]")


def _plan(**kwargs: Any) -> Any:
    if click.get_current_context().invoked_subcommand is None:
        return plan_command.callback(**kwargs)  # type: ignore[misc]
    return None


plan = PlanGroup("plan", params=plan_command.params, callback=_plan, invoke_without_command=True,
                 help=plan_command.help, short_help=plan_command.short_help)
plan.add_command(project)


@command("timeline", short_help="Pod phases (queue, pull, start) from kubectl dumps, offline.")
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
    from llmpack.cli import echo_out
    from llmpack.cluster.k8s.timeline import format_table, timeline_from_files

    runs = parse_pairs(run_ids, "--run-id", "RUN_ID=PIPELINE_RUN")
    rows = timeline_from_files(pods, nodes=nodes, events=events, run_group=run_group, runs=runs or None)
    echo_out(json.dumps(redact_data(rows), indent=2, sort_keys=True) if as_json else format_table(rows))


cluster.add_command(submit)  # one subcommand per cluster backend: llmpack.cluster.submit_command
cluster.add_command(compare)
cluster.add_command(doctor)  # before a first cluster run: docs/first-run-on-a-cluster.md
cluster.add_command(plan)  # estimates before submitting (docs/plan.md); plan project: docs/plan.md
cluster.add_command(timeline)
