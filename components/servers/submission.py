"""What every cluster submission settles, whichever orchestrator it goes to.

``llmpack cluster submit kfp|argo|mlflow`` (:mod:`kfp_pipelines.submit`, :mod:`argo_workflows.submit`,
:mod:`mlflow_projects.submit`) submits the *committed compiled artifact* (or one the user
names), never a re-authored copy, with the run's parameters: the user's (``model``, ``data``,
``max_steps``, ``seed``...), checked here against the pipeline object, and the telemetry ones
(``submitted_at``, ``run_group``, ``pipeline_run``, ``orchestrator``, ``mode="cluster"``).
``submitted_at`` is ``time.time()`` taken by the client just before the request that starts the
run (:func:`run_context`).

Also here: the run ids (DNS-1123 labels, generated when not given), the per-run Kubernetes labels,
the cost tags (docs/telemetry-and-cost.md) of the pipeline as compiled, and the pipeline run's MLflow record.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from components.dsl import Pipeline, is_dns1123_label
from components.errors import InputError
from components.labels import PIPELINE_RUN_LABEL as PIPELINE_RUN_LABEL  # the submitters read them here
from components.labels import RUN_GROUP_LABEL as RUN_GROUP_LABEL
from components.params import TELEMETRY_PARAMS
from components.record import cost, telemetry, tracking

MODE = "cluster"


def new_id(prefix: str) -> str:
    """A DNS-1123-safe id: prefix, UTC time, random suffix."""
    return f"{prefix}-{datetime.now(timezone.utc).strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


def check_id(value: str, flag: str) -> str:
    """``value`` when it is a DNS-1123 label, else an :class:`InputError` naming ``flag``."""
    if not is_dns1123_label(value):
        raise InputError(f"{flag} {value!r}: must be a DNS-1123 label (lower-case letters, digits, '-'; at most 63)")
    return value


def run_ids(orchestrator: str, run_group: str | None, pipeline_run: str | None) -> tuple[str, str]:
    """``(run_group, pipeline_run)``: the given ones checked, the missing ones new."""
    group = check_id(run_group, "--run-group") if run_group else new_id("rg")
    run = check_id(pipeline_run, "--pipeline-run") if pipeline_run else new_id(orchestrator)
    return group, run


def shipped_pipeline() -> Pipeline:
    """The pipeline object the committed compiled artifacts were compiled from."""
    from components.finetune_pipeline import build

    return build()


def user_parameters(pipe: Pipeline, params: Mapping[str, Any] | None) -> dict[str, Any]:
    """The user's pipeline parameters through the pipeline's one gate (strings from a command line are coerced)."""
    for key in params or {}:
        if key in TELEMETRY_PARAMS:
            raise InputError(f"parameter {key!r} is set by `llmpack cluster submit` (--run-group, --pipeline-run), "
                             "not by --param")
    return pipe.bind(params or {})


def declared_values(params: Mapping[str, Any] | None, declared: Mapping[str, type], where: str) -> dict[str, Any]:
    """The user's values for a compiled file of their own (``--package``, ``--workflow``): its pipeline is not
    the shipped one, so each name is checked against the parameters the file declares (``declared``: name ->
    the Python type the file gives it), and a value typed as the file declares it."""
    import difflib

    from components.binding import coerce

    out: dict[str, Any] = {}
    for key, value in (params or {}).items():
        if key in TELEMETRY_PARAMS:
            raise InputError(f"parameter {key!r} is set by `llmpack cluster submit` (--run-group, --pipeline-run), "
                             "not by --param")
        if key not in declared:
            near = difflib.get_close_matches(key, list(declared), n=1)
            raise InputError(f"{where}: the compiled pipeline has no parameter {key!r}"
                             + (f"; did you mean {near[0]!r}?" if near else "")
                             + f" (known: {', '.join(n for n in declared if n not in TELEMETRY_PARAMS)})")
        typ = declared[key]
        out[key] = coerce(value, typ, f"{where}: parameter {key!r}") if isinstance(value, str) else value
    return out


def cost_tags(pipe: Pipeline, price_per_gpu_hour: str | None, price_file: str | None,
              compiled: Any = None) -> dict[str, str]:
    """The cost tags (docs/telemetry-and-cost.md) for the pipeline as compiled.

    ``compiled``: the submitted artifact's document when it is not the shipped pipeline's (a pipeline of
    one's own, ``compile --pipeline``): its GPUs and name are the artifact's own (:func:`compiled_facts`),
    never the shipped pipeline's. An unknown price is reported as unknown.
    """
    from components.record.close import billed_uses

    found = compiled_facts(compiled) if compiled is not None else None
    if found is not None:
        uses, name = found
        pipe_name = name or pipe.name
    else:  # a TrainJob gang's finetune holds its nodes x GPUs, as the summarizing task bills it
        uses, pipe_name = billed_uses(pipe), pipe.name
    gpu_types = sorted({u.gpu_type for u in uses if u.gpus > 0 and u.gpu_type})
    if len(gpu_types) > 1:
        raise InputError(f"the pipeline mixes GPU types {gpu_types}; cost needs one")
    price = cost.resolve_price(gpu_types[0], flag=price_per_gpu_hour, price_file=price_file) if gpu_types else None
    return {**cost.cost_tags(uses, price), "llmpack.pipeline": pipe_name}


_USES_ARG = re.compile(r"--uses=(\[[^\]]*\])")
PIPELINE_LABEL = "llmpack.io/pipeline"


def compiled_facts(doc: Any) -> tuple[list[cost.GpuUse], str | None] | None:
    """What a compiled artifact bills and is named: the GPU uses its summarizing task takes (``--uses=[...]``,
    the argument every compiled close task has, or the ``uses`` of an MLflow project's ``pipeline.json``) and
    its ``llmpack.io/pipeline`` label (or ``pipeline`` name); None when it holds no ``--uses``."""
    from components.record.close import parse_uses

    uses: list[cost.GpuUse] | None = None
    name: str | None = None
    stack = [doc]
    while stack and (uses is None or name is None):
        item = stack.pop()
        if isinstance(item, Mapping):
            if uses is None and isinstance(item.get("uses"), list) and isinstance(item.get("tasks"), list):
                uses = parse_uses(json.dumps(item["uses"]))
            label = item.get(PIPELINE_LABEL)
            if name is None and isinstance(label, str) and "{{" not in label:
                name = label
            if name is None and isinstance(item.get("pipeline"), str) and isinstance(item.get("tasks"), list):
                name = item["pipeline"]  # an MLflow project's pipeline.json
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, str) and uses is None and (m := _USES_ARG.search(item)):
            uses = parse_uses(m.group(1))
    return None if uses is None else (uses, name)


def run_context(orchestrator: str, run_group: str, pipeline_run: str) -> telemetry.RunContext:
    """The run's context, ``submitted_at`` taken now: call it just before the request that starts the run."""
    return telemetry.RunContext(run_group=run_group, pipeline_run=pipeline_run, orchestrator=orchestrator, mode=MODE,
                                submitted_at=time.time())


def telemetry_values(ctx: telemetry.RunContext) -> dict[str, Any]:
    """The telemetry pipeline parameters of the run (and the first fields of its summary)."""
    return {
        "submitted_at": ctx.submitted_at,
        "run_group": ctx.run_group,
        "pipeline_run": ctx.pipeline_run,
        "orchestrator": ctx.orchestrator,
        "mode": ctx.mode,
    }


def connect_tracking(uri: str) -> Any:
    """An MLflow client whose store answers; an unreachable tracking URI is bad input (exit 2)."""
    if uri.strip().lower().startswith("file:"):  # MLflow 3 refuses file stores: never suggest one
        raise InputError(f"MLflow tracking URI {tracking.redact_uri(uri)}: MLflow 3 no longer opens a file store "
                         "(mlruns); use sqlite:///PATH or an http(s):// tracking server")
    try:
        mc = tracking.client(uri)  # an unsupported scheme fails here, before any request
    except Exception as exc:  # noqa: BLE001 - MLflow's many store errors: one line for the user
        raise InputError(f"MLflow tracking URI {tracking.redact_uri(uri)}: "
                         f"MLflow cannot open it ({type(exc).__name__}); "
                         "use http(s)://, sqlite:///PATH or databricks") from None
    try:
        tracking.experiment_id(mc)
    except Exception as exc:  # noqa: BLE001 - one line for the user
        raise InputError(f"MLflow tracking URI {tracking.redact_uri(uri)} "
                         f"does not answer ({type(exc).__name__})") from None
    return mc


def optional_tracking(tracking_uri: str | None, env: Mapping[str, str]) -> tuple[str | None, Any]:
    """``(uri, client)`` when ``tracking_uri`` or ``MLFLOW_TRACKING_URI`` names a store that answers.

    Else ``(None, None)``.
    """
    uri = tracking_uri or env.get("MLFLOW_TRACKING_URI")
    return (uri, connect_tracking(uri)) if uri else (None, None)


def open_record(mc: Any, ctx: telemetry.RunContext, tags: Mapping[str, str]) -> tuple[str, str]:
    """The pipeline run's MLflow record (created with its tags); returns (run id, experiment id)."""
    run_id = tracking.open_pipeline_run(mc, ctx, dict(tags))
    return run_id, mc.get_run(run_id).info.experiment_id


def record_fields(mc: Any, uri: str | None, ctx: telemetry.RunContext, tags: Mapping[str, str]) -> dict[str, Any]:
    """Open the record when there is a tracking store; the summary fields that name it (none without a store)."""
    if mc is None:
        return {}
    run_id, experiment_id = open_record(mc, ctx, tags)
    return {"mlflow_run_id": run_id, "mlflow_experiment_id": experiment_id, "tracking_uri": tracking.tracking_uri(uri)}
