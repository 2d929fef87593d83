"""``llmpack cluster compare``: every path (in every packaging) submitted to one cluster, its pods watched, measured.

It takes ``llmpack compare``'s options (:func:`llmpack.compare.command.compare_options`) and adds the cluster's:
the paths' endpoints and flags, namespace, kubeconfig, TLS, the pod-spec flags, waiting, billing, OpenCost,
preemptions (:func:`llmpack.cluster.options.compare_cluster_options`) and the plan's (``--plan``,
``--max-cost``). What it does once the runs are in is the local compare's (:func:`llmpack.compare.command.finish`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from components import settings
from components.errors import InputError
from llmpack.backends import cluster_paths
from llmpack.cluster.options import compare_cluster_options
from llmpack.cluster.plan.record import options as plan_options
from llmpack.compare.command import SHORT_HELP, CompareCommand, compare_options, finish, show
from llmpack.ui.terminal import LocalFirstCommand


class ClusterCompareCommand(CompareCommand, LocalFirstCommand):
    """The compare options first, then the cluster's under their own heading; the local-only ones hidden."""

    hidden_options = ("budget", "warmup", "inject_start_delay")



@click.command("compare", cls=ClusterCompareCommand, short_help=SHORT_HELP.replace("several paths", "several paths "
                                                                                    "on one cluster"))
@compare_options
@compare_cluster_options  # --concurrency ... --preempt: what only a cluster reads
@plan_options  # --plan FILE, --max-cost USD: the estimate on each run (docs/plan.md)
def compare(backends: str, repeats: int | None, budget: str | None, margin: str | None, warmup: int | None,
            variants: str | None, baseline: str | None, report_dir: Path | None, force: bool, no_report: bool,
            control_plane: tuple[str, ...], control_plane_file: str | None, inject_start_delay: str | None, wide: bool,
            as_json: bool, params: tuple[str, ...], concurrency: int,
            namespace: str | None, kubeconfig: str | None, context: str | None, wait_timeout: float, poll_s: float,
            scale_down_delay_s: float | None, cache_pvc: str | None, queue: str | None, ca_cert: str | None,
            insecure_skip_tls_verify: bool,
            opencost: str | None = None, preempt: str | None = None, **kwargs: Any) -> None:
    """Run the pipeline through several paths side by side on one cluster and compare them.

    Every path is compiled with the pod-spec flags and submitted (--concurrency at a
    time), its pods watched from before the submission, each run measured and billed
    by its nodes; then the table and the report, as llmpack compare writes them.
    """
    from components import fusion
    from llmpack.cluster.k8s.reconcile import check_opencost_url
    from llmpack.cluster.plan import record as plan_record
    from llmpack.compare import comparison as cmp
    from llmpack.compare import rounds
    from llmpack.compile.pod_options import pod_options_of
    from llmpack.report import check_control_plane, parse_control_plane
    from llmpack.report.target import check_report_target
    from llmpack.run.local import RunOptions
    from llmpack.run.user_pipeline import parse_params
    from llmpack.ui.display import library_logs_to
    from llmpack.ui.options import tls_connection

    own = {o.dest: kwargs.pop(o.dest) for path in cluster_paths().values() for o in path.compare_options}
    plan_file, max_cost = kwargs.pop("plan_file"), kwargs.pop("max_cost")
    pod = pod_options_of(kwargs)  # --image, --model-pvc...: every path compiled with them (llmpack.compile.pod_options)
    for flag in ("--model", "--data"):  # /models/x with no volume: the flag that mounts it
        pod.check_mounted(kwargs[flag[2:]], flag)
    cluster = {"pod": pod, "concurrency": concurrency, "own": own, "namespace": namespace, "kubeconfig": kubeconfig,
               "context": context, "timeout_s": wait_timeout, "poll_s": poll_s,
               "scale_down_delay_s": scale_down_delay_s, "cache_pvc": cache_pvc, "queue": queue, "opencost": opencost,
               "preempt": preempt, "tls": {"ca_cert": ca_cert, "insecure_skip_tls_verify": insecure_skip_tls_verify}}
    if kwargs["pipeline"] is not None:
        raise InputError("--pipeline: local compares only; on a cluster compile it (llmpack compile --pipeline "
                         "MODULE:NAME) and submit the artifacts")
    if opencost is not None:
        check_opencost_url(opencost)  # before anything slow is imported
    tls_connection(ca_cert, insecure_skip_tls_verify)
    # Every input is checked here, before the first run is submitted.
    names = cmp.parse_backends(backends)
    if repeats is not None:
        cmp.check_repeats(repeats)
    else:
        repeats = 1  # a cluster compare runs fixed rounds (each costs GPU-hours)
    if budget is not None:
        raise InputError("--budget: only for a local compare without --repeats (it bounds the rounds until decided)")
    margins = cmp.parse_margins(margin)
    if warmup is not None:
        cmp.check_warmup(warmup)
        if warmup:
            raise InputError("--warmup: local runs only (on a cluster, warm nodes with llmpack compile --prepull)")
    fusion.check_mode(kwargs["fuse"])
    modes = cmp.parse_variants(variants) or [kwargs["fuse"]]  # the packagings compared: --variants, else --fuse
    labels = [fusion.path_label(b, f) for f in modes for b in names]
    gpu_type, shape = kwargs.get("gpu_type"), None
    if plan_file is not None:  # the committed artifacts' GPU type and size, unless the flags compile others
        from llmpack.compile.artifacts import shipped_artifact

        shipped = str(shipped_artifact(names[0]))
        gpu_type = gpu_type or plan_record.submitted_gpu_type(shipped)
        base_nodes, base_gpus, _, default_steps = plan_record.artifact_shape(shipped, {})
        nodes = kwargs.get("nodes") or base_nodes or 1
        per_node = kwargs.get("gpus") or (base_gpus or 0) // (base_nodes or 1)
        shape = (nodes, nodes * per_node, kwargs.get("max_steps") or default_steps, default_steps)
    planned = plan_record.before_compare(plan_file, max_cost, labels=labels, gpu_type=gpu_type, cluster=True,
                                         shape=shape)  # --max-cost refuses before the first run
    costs = parse_control_plane(control_plane, control_plane_file)
    check_control_plane(costs, names)
    cmp.check_baseline(baseline, labels)
    if not no_report:
        check_report_target(report_dir, "--report", force=force)
    delays = rounds.parse_start_delays(inject_start_delay, names)
    output_dir = Path(kwargs["output_dir"])
    RunOptions(params=parse_params(params, kwargs["pipeline"]), **kwargs)  # the run options, checked as locally

    with library_logs_to(output_dir / "llmpack-client.log"):
        result = cmp.with_baseline(_compare_cluster(names, modes, repeats, params, cluster, kwargs,
                                                    inject_start_delay), baseline, margins)
        plan_record.after_compare(planned, result)
        finish(result, delays=delays, report_dir=report_dir, costs=costs, force=force, no_report=no_report)
    show(result, as_json=as_json, wide=wide)


def _compare_cluster(names: list[str], modes: list[str], repeats: int, params: tuple[str, ...],
                     cluster: dict[str, Any], kwargs: dict[str, Any],
                     inject_start_delay: float | None) -> dict[str, Any]:
    """Submit every path (in every packaging of ``modes``) to one cluster, watch its pods, measure."""
    from llmpack.cluster.compare.cluster import compare_cluster
    from llmpack.run.user_pipeline import parse_params
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
