"""The options of the lab's commands, declared once: ``cluster submit``'s and ``cluster compare``'s.

The pod-spec flags and TLS are the pack's (:mod:`llmpack.ui.options`: ``compile`` takes them too); what is
here only a cluster reads. Parsing is checking: a bad value is a one-line
:class:`~components.errors.InputError` naming the flag.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from llmpack.ui.options import NO_PROMOTE_HELP, TLS_OPTIONS, known_gpu_type, pod_options

SUBMIT_GPU_HELP = ("Compile for this GPU type first and submit that (as `llmpack compile --gpu-type`); not with "
                   "a compiled file of your own (kfp's --package, argo's --workflow).")


def compare_path_options(*, endpoint: bool) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The cluster paths' own ``compare --cluster`` flags (:attr:`components.backend.ClusterPath.compare_options`):
    the servers' endpoints, or the others; in registry order, their values in ``**kwargs`` by their ``dest``."""
    from llmpack.backends import cluster_paths

    options = [o for path in cluster_paths().values() for o in path.compare_options if o.endpoint == endpoint]

    def apply(func: Callable[..., Any]) -> Callable[..., Any]:
        for option in reversed(options):
            func = click.option(option.flag, option.dest, default=None, help=option.help)(func)
        return func

    return apply


def submit_options(func: Callable[..., Any]) -> Callable[..., Any]:
    options = [
        click.option("--model", default=None, help="Model (a path inside the image/volume, or an HF id)."),
        click.option("--data", default=None,
                     help="Data (a path inside the image/volume, builtin, or an HF dataset id)."),
        click.option("--max-steps", type=int, default=None,
                     help="Optimizer steps for finetune (default: the compiled file's; the shipped one's: 120)."),
        click.option("--seed", type=int, default=None,
                     help="Random seed (default: the compiled file's; the shipped one's: 0)."),
        click.option("--param", "params", multiple=True, metavar="NAME=VALUE", help="Any other pipeline parameter."),
        click.option("--no-promote", "no_promote", is_flag=True, help=NO_PROMOTE_HELP),
        click.option("--run-group", default=None, help="Join an existing run group (default: a new one)."),
        click.option("--tracking-uri", default=None, help="MLflow tracking server for the run record."),
        click.option("--price-per-gpu-hour", default=None, help="Override the price (USD per GPU-hour) on the record."),
        click.option("--price-file", default=None, help="A price YAML like components/record/prices.yaml."),
        click.option("--gpu-type", default=None, metavar="TYPE", callback=known_gpu_type, help=SUBMIT_GPU_HELP),
        click.option("--namespace", default=None,
                     help="kfp: the KFP namespace (default kubeflow); argo: the Workflow's (default ARGO_NAMESPACE, "
                          "else llmpack); mlflow: the Job's (default: its template's)."),
        *TLS_OPTIONS,
        click.option("--wait/--no-wait", default=False, help="Wait for the run to finish."),
        click.option("--timeout", "wait_timeout", type=float, default=24 * 3600.0, show_default=True,
                     help="Seconds to wait with --wait."),
        click.option("--json", "as_json", is_flag=True, help="Print the submission summary as JSON."),
    ]
    for option in reversed(options):
        func = option(func)
    return pod_options()(func)  # --image, --model-pvc...: the artifact is compiled with them first


def compare_cluster_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """The flags only ``compare --cluster`` reads, in the order ``--help`` lists them: the paths' endpoints,
    namespace and kubeconfig, TLS, the paths' other flags, the pod-spec flags, then waiting, billing, faults."""
    options = [
        click.option("--concurrency", type=int, default=1, show_default=True,
                     help="Submissions in flight at once."),
        compare_path_options(endpoint=True),
        click.option("--namespace", default=None,
                     help="Namespace for Argo workflows and the MLflow Job (default llmpack)."),
        click.option("--kubeconfig", default=None,
                     help="Kubeconfig for the pod watcher and the MLflow Job."),
        click.option("--context", default=None, help="Kubeconfig context."),
        *TLS_OPTIONS,
        compare_path_options(endpoint=False),
        pod_options(),
        click.option("--timeout", "wait_timeout", type=float, default=24 * 3600.0, show_default=True,
                     help="Seconds to wait per run."),
        click.option("--poll", "poll_s", type=float, default=10.0, show_default=True,
                     help="Status poll interval, seconds."),
        click.option("--scale-down-delay-s", "scale_down_delay_s", type=float, default=None,
                     help="Seconds the autoscaler keeps an empty GPU node (default 600); billed after a "
                          "node's last pod when its removal was not seen."),
        click.option("--cache-pvc", "cache_pvc", default=None, metavar="NAME",
                     help="With --nodes N: the ReadWriteMany PVC the finetune TrainJob's node pods and its "
                          "launcher share (default llmpack-shared); also the Hugging Face cache, as llmpack compile "
                          "--cache-pvc."),
        click.option("--queue", default=None, metavar="NAME",
                     help="With --nodes N: the Kueue LocalQueue of the finetune TrainJob; its Workload's "
                          "quota wait and admission checks are measured."),
        click.option("--opencost", default=None, metavar="URL",
                     help="OpenCost's API (http://localhost:9003): its GPU-hours and cost for each run's "
                          "pods shown beside ours, the difference explained."),
        click.option("--preempt", default=None, metavar="STEP@WHEN",
                     help="The preemptions every path runs under (finetune@30s, or "
                          "finetune@rate=0.5/h[,seed=N]); the report shows each path's time to recover and waste "
                          "(docs/preemption.md)."),
    ]
    for option in reversed(options):
        func = option(func)
    return func
