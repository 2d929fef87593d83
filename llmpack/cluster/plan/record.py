"""The estimate on the run: ``submit --plan FILE`` and ``compare --cluster --plan FILE`` read the plan
``llmpack cluster plan --out`` (or ``--json``) wrote, take the row of the path and GPU type being run, refuse
(one line, exit 2, nothing submitted) when ``--max-cost`` is below the row's cost upper bound, and
after submitting put the row on the run's record as ``llmpack.plan.*`` tags: the report compares them
with what the run measured (:mod:`llmpack.report.estimate`), ``llmpack cluster plan --calibration`` counts them.

A tag holds ``value,low,high`` (seconds or USD); the headline keys are
:data:`llmpack.cluster.plan.estimate.HEADLINES` and ``cost_usd``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import click

from components import bounded
from components.errors import InputError
from llmpack.report.estimate import PREFIX, parse_triple  # noqa: F401 - the tag format, read back by the report

HEADLINES = ("spin_up_s", "first_step_s", "total_s")
QUANTILES = ("p50", "p90")


def load(path: str) -> dict[str, Any]:
    """The plan JSON at ``path`` (a regular file, size and nesting capped: :mod:`components.bounded`); one
    line when it is unreadable or not a plan."""
    try:
        data = bounded.read_json(path, follow_symlinks=True, allow_nan=True)  # NaN/inf: refused per row, by name
    except OSError as exc:
        raise InputError(f"--plan {path}: cannot read it ({exc.strerror or exc})") from None
    except InputError as exc:
        raise InputError(f"--plan {exc}; write one with llmpack cluster plan --out DIR (its plan.json)") from None
    if not isinstance(data, dict) or not isinstance(data.get("options"), list):
        raise InputError(f"--plan {path}: not a plan (no 'options' list); write one: llmpack cluster plan --out DIR")
    return data


def _interval(e: Any, what: str, where: str) -> tuple[float, float, float]:
    """A plan estimate ``{"value": v, "ci": [low, high]}`` as (v, low, high): finite, >= 0, low <= v <= high;
    else one line naming it."""
    try:
        v, (lo, hi) = e["value"], e["ci"]
        nums = tuple(float(x) for x in (v, lo, hi) if not isinstance(x, (bool, str)))
    except (TypeError, KeyError, ValueError, OverflowError):
        raise InputError(f"{where}: {what} is not {{'value': N, 'ci': [LOW, HIGH]}}; not a plan's estimate") from None
    if len(nums) != 3 or not all(math.isfinite(x) and x >= 0 for x in nums) or not nums[1] <= nums[0] <= nums[2]:
        shown = ", ".join(str(x) for x in (v, lo, hi))[:80]
        raise InputError(f"{where}: {what} ({shown}) is not an interval of finite numbers >= 0 (low <= value <= high)")
    return nums[0], nums[1], nums[2]


def check_row(row: Mapping[str, Any], where: str = "--plan") -> None:
    """Every key the run reads off the row, there and of its type (an edited or truncated plan is one line)."""
    for key in ("path", "gpu_type", "capacity"):
        if not isinstance(row.get(key), str) or not row[key]:
            raise InputError(f"{where}: an option has no {key!r} (a string); not a plan llmpack wrote")
    label = f"{row['path']} {row['gpu_type']} {row['capacity']}"
    for key in ("times_s", "cost_usd"):
        if not isinstance(row.get(key) or {}, dict):
            raise InputError(f"{where}: {label}: {key!r} is not an object")
    for h in HEADLINES:
        per_q = (row.get("times_s") or {}).get(h) or {}
        if not isinstance(per_q, dict):
            raise InputError(f"{where}: {label}: times_s.{h} is not an object")
        for q in QUANTILES:
            if per_q.get(q):
                _interval(per_q[q], f"times_s.{h}.{q}", f"{where}: {label}")
    if total := (row.get("cost_usd") or {}).get("total"):
        _interval(total, "cost_usd.total", f"{where}: {label}")
    borrowed = row.get("borrowed") or []
    if not isinstance(borrowed, (dict, list)) or not all(isinstance(x, str) for x in borrowed):
        raise InputError(f"{where}: {label}: 'borrowed' names something that is not a string")


def row_for(plan: Mapping[str, Any], path: str, gpu_type: str | None, where: str = "--plan") -> dict[str, Any]:
    """The estimated row of ``path`` (and ``gpu_type`` when given): the plan's chosen one among them,
    else the first on-demand, else the first; one line when the plan has none."""
    rows = [r for r in plan["options"] if isinstance(r, dict) and r.get("path") == path and r.get("estimated")
            and (gpu_type is None or r.get("gpu_type") == gpu_type)]
    if not rows:
        gpu = f" on {gpu_type}" if gpu_type else ""
        raise InputError(f"{where}: the plan has no estimate for {path}{gpu}; plan it (llmpack cluster plan --paths "
                         f"{path}{' --gpu-type ' + gpu_type if gpu_type else ''} --out DIR)")
    row = next((r for r in rows if r.get("chosen")), None) or next(
        (r for r in rows if r.get("capacity") == "on-demand"), rows[0])
    check_row(row, where)
    return row


def check_max_cost(row: Mapping[str, Any], max_cost: float | None) -> None:
    """Refuse, in one line, a run whose estimated cost may exceed ``max_cost``."""
    if max_cost is None:
        return
    cost = (row.get("cost_usd") or {}).get("total")
    label = f"{row['path']} {row['gpu_type']} {row['capacity']}"
    if not cost:
        raise InputError(f"--max-cost {max_cost:g}: the plan has no cost for {label} (no price); not submitted")
    value, _, high = _interval(cost, "cost_usd.total", f"--max-cost {max_cost:g}: {label}")
    if not high <= max_cost:  # written so that a NaN could never pass
        raise InputError(f"--max-cost {max_cost:g}: the estimate for {label} is up to ${high:.2f} a run "
                         f"(${value:.2f}, 95% interval upper bound); not submitted")


def _triple(e: Mapping[str, Any]) -> str:
    return f"{float(e['value']):.4g},{float(e['ci'][0]):.4g},{float(e['ci'][1]):.4g}"


def tags_of_row(row: Mapping[str, Any], plan: Mapping[str, Any]) -> dict[str, str]:
    """The row as ``llmpack.plan.*`` tags."""
    tags = {f"{PREFIX}option": f"{row['path']} {row['gpu_type']} {row['capacity']}",
            f"{PREFIX}nodes": str(row.get("nodes")), f"{PREFIX}history_runs": str(plan.get("history_runs", "")),
            f"{PREFIX}chosen": str(bool(row.get("chosen"))).lower()}
    for h in HEADLINES:
        for q in QUANTILES:
            e = (row.get("times_s") or {}).get(h, {}).get(q)
            if e:
                tags[f"{PREFIX}{h}.{q}"] = _triple(e)
    total = (row.get("cost_usd") or {}).get("total")
    if total:
        tags[f"{PREFIX}cost_usd"] = _triple(total)
    if row.get("borrowed"):
        tags[f"{PREFIX}borrowed"] = ",".join(sorted(row["borrowed"]))
    return tags


def set_on_record(tracking_uri: str | None, run_id: str, tags: Mapping[str, str]) -> None:
    """The tags on the run's MLflow record."""
    from components.record import tracking

    tracking.set_tags(tracking.client(tracking_uri), run_id, dict(tags))


def finite_cost(_ctx: Any, _param: Any, value: float | None) -> float | None:
    """``--max-cost``: a finite amount (``inf`` passed every estimate, ``nan`` was refused with an odd line)."""
    if value is not None and not math.isfinite(value):
        raise click.BadParameter(f"{value}: not a finite amount of USD")
    return value


def options(func: Callable[..., Any]) -> Callable[..., Any]:
    """``--plan FILE`` and ``--max-cost USD`` (submit, compare --cluster)."""
    func = click.option("--max-cost", type=click.FloatRange(min=0, min_open=True), default=None, metavar="USD",
                        callback=finite_cost,
                        help="With --plan: refuse to submit when the estimate's cost upper bound exceeds this.")(func)
    return click.option("--plan", "plan_file", default=None, metavar="FILE",
                        help="A plan.json of `llmpack cluster plan --out`: record its estimate on the run (and "
                             "check --max-cost).")(func)


def _compiled(artifact: str) -> Any:
    """The compiled artifact's documents: a file's YAML (KFP package, Argo Workflow), a directory's
    ``pipeline.json`` (MLflow project; None without one)."""

    from components import yamltext

    where = Path(artifact)
    try:
        if where.is_dir():
            found = where / "pipeline.json"
            return yamltext.load_file(found, f"{artifact}: pipeline.json") if found.is_file() else None
        return list(yamltext.load_file(where, artifact, documents=True))
    except OSError as exc:
        raise InputError(f"{artifact}: cannot read it ({exc.strerror or exc})") from None


def submitted_gpu_type(artifact: str) -> str | None:
    """The GPU type the compiled artifact about to be submitted asks for; None when it asks for no GPU or does
    not say. The row --max-cost checks is this type's, never another one the plan chose."""
    from components.servers.submission import compiled_facts

    doc = _compiled(artifact)
    facts = compiled_facts(doc) if doc is not None else None
    types = sorted({u.gpu_type for u in facts[0] if u.gpus > 0 and u.gpu_type}) if facts else []
    if facts and any(u.gpus > 0 and not u.gpu_type for u in facts[0]):  # round 29: any row's type would do
        raise InputError(f"--plan: {artifact} has GPU steps of no GPU type: no row of the plan prices them "
                         "(compile with --gpu-type); not submitted")
    if len(types) > 1:
        raise InputError(f"{artifact}: the pipeline mixes GPU types {types}; --plan needs one")
    return types[0] if types else None


def _defaults(doc: Any) -> dict[str, Any]:
    """The compiled parameters' defaults: an MLflow project's ``params``, an Argo Workflow's arguments, a KFP
    package's root inputs."""
    docs = doc if isinstance(doc, list) else [doc]
    for d in docs:
        if not isinstance(d, dict):
            continue
        if isinstance(d.get("params"), list):
            return {p.get("name"): p.get("default") for p in d["params"] if isinstance(p, dict)}
        args = ((d.get("spec") or {}).get("arguments") or {}).get("parameters") if d.get("kind") else None
        if isinstance(args, list):
            return {p.get("name"): p.get("value") for p in args if isinstance(p, dict)}
        inputs = (((d.get("root") or {}).get("inputDefinitions") or {}).get("parameters"))
        if isinstance(inputs, dict):
            return {k: v.get("defaultValue") for k, v in inputs.items() if isinstance(v, dict)}
    return {}


def _project_defaults(artifact: str) -> dict[str, Any]:
    """An MLflow project's ``main`` entry point's parameter defaults, from its ``MLproject``: where ``mlflow run``
    takes them from (round 26: a ``pipeline.json`` left as compiled hid an MLproject's 64 nodes); {} for a file."""

    from components import yamltext

    found = Path(artifact) / "MLproject"
    if not Path(artifact).is_dir() or not found.exists():
        return {}
    try:
        project = yamltext.load_file(found, f"{artifact}: MLproject")
    except OSError as exc:
        raise InputError(f"{artifact}: cannot read its MLproject ({exc.strerror or exc})") from None
    main = ((project or {}).get("entry_points") or {}).get("main") if isinstance(project, dict) else None
    params = main.get("parameters") if isinstance(main, dict) else None
    if not isinstance(params, dict):
        return {}
    return {k: v.get("default") if isinstance(v, dict) else v for k, v in params.items()}


def _whole(value: Any, what: str) -> int | None:
    """A count (nodes, steps) as a whole number >= 1; None when not given; one line otherwise (``inf``, ``2.9``,
    ``true``, a 400-digit number: round 25)."""
    if value is None or value == "":
        return None
    try:
        if isinstance(value, bool):
            raise ValueError
        number = float(value)
        if not (math.isfinite(number) and number.is_integer() and 1 <= number <= 10**9):
            raise ValueError
        return int(number)
    except (TypeError, ValueError, OverflowError):
        raise InputError(f"--plan: {what} {str(value)[:40]!r} is not a whole number from 1 to 10^9; "
                         "not submitted") from None


def _gang_spec(values: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """The ``trainjob`` parameter's gang spec (given, else compiled), parsed; {} when none."""
    text = values.get("trainjob", defaults.get("trainjob"))
    try:
        spec = json.loads(text) if isinstance(text, str) and text.strip() else {}
    except (ValueError, RecursionError):
        raise InputError("--plan: the trainjob parameter is not a gang spec (JSON); not submitted") from None
    if not isinstance(spec, dict):
        return {}
    if spec.get("gpu_type") is not None and not isinstance(spec["gpu_type"], str):  # round 26: a list crashed
        raise InputError("--plan: the trainjob parameter's gpu_type is not a name; not submitted")
    return spec


def artifact_shape(artifact: str, values: Mapping[str, Any]) -> tuple[int, int, int | None, int | None]:
    """(nodes, GPUs in all, max_steps, the compiled max_steps) of ``artifact`` run with ``values``: the gang spec
    (``trainjob``) or the closing task's ``--uses`` for the GPUs a node, ``nnodes`` for the nodes. A file that does
    not say what its training step holds is one line: a run of unknown size is never checked as fitting."""
    from components.record.telemetry import TRAIN_STEP
    from components.servers.submission import compiled_facts

    doc = _compiled(artifact)
    facts = compiled_facts(doc) if doc is not None else None
    train = next((u for u in facts[0] if u.step == TRAIN_STEP and u.gpus > 0), None) if facts else None
    if train is None:
        raise InputError(f"--plan: {artifact} does not say what its training step holds (no finetune GPUs in its "
                         "closing task's --uses or pipeline.json): the plan cannot be checked against it; not "
                         "submitted")
    defaults = {**_defaults(doc), **_project_defaults(artifact)}
    compiled_steps = _whole(defaults.get("max_steps"), "max_steps")
    steps = _whole(values.get("max_steps"), "max_steps") or compiled_steps
    compiled_nodes = _whole(defaults.get("nnodes"), "nnodes") or 1
    nodes = _whole(values.get("nnodes"), "nnodes") or compiled_nodes
    per_node = _gang_spec(values, defaults).get("gpus_per_node")
    if not (isinstance(per_node, int) and not isinstance(per_node, bool) and per_node >= 1):
        per_node = max(1, train.gpus // compiled_nodes)
    return nodes, nodes * per_node, steps, compiled_steps


def check_shape(plan: Mapping[str, Any], row: Mapping[str, Any], nodes: int, gpus: int,
                steps: int | None, default_steps: int | None) -> None:
    """Refuse, in one line, a run whose size is not the row's: its nodes and GPUs, and its ``max_steps`` (the
    plan's ``--max-steps``, else ``default_steps``: the measured runs' training stands for the default).
    Round 24: a 2-node row's cost passed a run of 64 nodes, or of 10M steps."""
    label = f"{row['path']} {row['gpu_type']} {row['capacity']}"
    if (nodes, gpus) != (row.get("nodes"), row.get("gpus")):
        raise InputError(f"--plan: the estimate for {label} is for {row.get('nodes')} node(s), {row.get('gpus')} "
                         f"GPU(s); this run is {nodes} node(s), {gpus} GPU(s); plan it (llmpack cluster plan "
                         f"--paths {row['path']} --gpu-type {row['gpu_type']} --nodes {nodes} --out DIR); "
                         "not submitted")
    planned = _whole((plan.get("inputs") or {}).get("max_steps"), "max_steps")
    if steps is not None and steps != (planned or default_steps):
        said = f"{planned:,} steps (its --max-steps)" if planned else "the measured runs' training"
        raise InputError(f"--plan: the estimate for {label} is for {said}; this run is {steps:,} steps; plan it "
                         f"(llmpack cluster plan --max-steps {steps} --out DIR); not submitted")


# Values a run may be given beside --plan without being another run than the one estimated: they change neither
# the steps, nor what a step does, nor the model (round 30: grad_accum=100000 passed a row measured at 1).
COST_NEUTRAL = frozenset({"seed", "lr", "weight_decay", "warmup_steps", "min_improvement", "model_name", "promote",
                          "gate_metric", "skip_bad_rows"})


def _same(given: Any, compiled: Any) -> bool:
    """The same value as written (a model path's case matters), a boolean in any case, or the same number."""
    if str(given) == str(compiled) or str(given).lower() == str(compiled).lower() in ("true", "false"):
        return True
    try:
        return float(given) == float(compiled)
    except (TypeError, ValueError, OverflowError):
        return False


def check_values(artifact: str, values: Mapping[str, Any]) -> None:
    """Refuse, in one line, a value given at submit that makes another run than the compiled defaults the estimate
    stands for: any but :data:`COST_NEUTRAL` ones, ``max_steps`` and ``nnodes`` (checked against the row by
    :func:`check_shape`). Round 30: per-step work (``grad_accum``, ``seq_len``, ``batch_size``), another model or
    data, or an own pipeline's step count under another name passed unchecked."""
    defaults = {**_defaults(_compiled(artifact)), **_project_defaults(artifact)}
    for key, value in values.items():
        if key in COST_NEUTRAL or key in ("max_steps", "nnodes") or _same(value, defaults.get(key)):
            continue
        raise InputError(f"--plan: {key}={str(value)[:40]} is not the compiled {key} ({str(defaults.get(key))[:40]}) "
                         "the estimate stands for: another run than the one estimated (submit without --plan); "
                         "not submitted")


def fuse_of(artifact: str) -> str:
    """How the compiled artifact's steps are packaged: its closing task's ``--fuse=`` (an MLflow project's
    ``pipeline.json`` ``fuse``); ``none`` when unfused."""
    from components.fusion import check_mode

    doc = _compiled(artifact)
    if isinstance(doc, dict) and isinstance(doc.get("fuse"), str):
        return check_mode(doc["fuse"])
    found = re.search(r"--fuse=(none|gpu|all)\b", json.dumps(doc))
    return found.group(1) if found else "none"


def before_submit(plan_file: str | None, max_cost: float | None, path: str, artifact: str,
                  values: Mapping[str, Any] | None = None, *,
                  shipped: bool = False) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(plan, row) for ``artifact``, the compiled file about to be submitted on ``path`` with ``values``, refused
    here by --max-cost; None without --plan. The file must be one the user's ``llmpack compile`` signed and nobody
    changed since (:func:`llmpack.compile.signatures.verify`), or the install's own committed artifact
    (``shipped``). The row is the one of its path (fused or not) and GPU type, and the run must be the row's size
    (:func:`check_shape`)."""
    from components.fusion import path_label
    from llmpack.compile import signatures

    if plan_file is None:
        if max_cost is not None:
            raise InputError("--max-cost: only with --plan FILE (the estimate it is checked against)")
        return None
    plan = load(plan_file)
    if not shipped:
        signatures.verify(artifact)  # first: what is read below is what llmpack compile wrote (rounds 26 to 29)
    check_values(artifact, values or {})
    shape = artifact_shape(artifact, values or {})  # a file that does not say its size is refused
    gpu_type = _gang_spec(values or {}, _defaults(_compiled(artifact))).get("gpu_type") or submitted_gpu_type(artifact)
    row = row_for(plan, path_label(path, fuse_of(artifact)), gpu_type)
    check_shape(plan, row, *shape)
    check_max_cost(row, max_cost)
    return plan, row


def after_submit(planned: tuple[dict[str, Any], dict[str, Any]] | None, summary: Mapping[str, Any]) -> None:
    """The estimate on the submitted run's record (when it has one: a tracking store was given)."""
    if planned is None or not summary.get("mlflow_run_id"):
        return
    set_on_record(summary.get("tracking_uri"), str(summary["mlflow_run_id"]), tags_of_row(planned[1], planned[0]))


def before_compare(plan_file: str | None, max_cost: float | None, *, labels: list[str], gpu_type: str | None,
                   cluster: bool, shape: tuple[int | None, int | None, int | None, int | None] | None = None,
                   ) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """compare --cluster --plan: each path label's (plan, row), every one checked against --max-cost (and the
    runs' ``shape``, :func:`check_shape`'s arguments) before the first run is submitted; {} without --plan."""
    if plan_file is None:
        if max_cost is not None:
            raise InputError("--max-cost: only with --plan FILE (the estimate it is checked against)")
        return {}
    if not cluster:
        raise InputError("--plan: only with --cluster (a local run has no cluster estimate)")
    plan = load(plan_file)
    planned = {}
    for label in labels:
        row = row_for(plan, label, gpu_type)
        if shape is not None:
            check_shape(plan, row, *shape)
        check_max_cost(row, max_cost)
        planned[label] = (plan, row)
    return planned


def after_compare(planned: Mapping[str, tuple[dict[str, Any], dict[str, Any]]], result: dict[str, Any]) -> None:
    """Each run's estimate on its record, in MLflow and in ``result`` (the report written next reads it)."""
    from components.fusion import path_label

    for run in result.get("runs", []):
        label = path_label(str(run.get("orchestrator")), str(run.get("fuse") or "none"))
        if label not in planned:
            continue
        tags = tags_of_row(planned[label][1], planned[label][0])
        run.setdefault("tags", {}).update(tags)
        artifacts = run.get("artifacts") or {}
        if artifacts.get("mlflow_run_id"):
            set_on_record(artifacts.get("tracking_uri"), str(artifacts["mlflow_run_id"]), tags)
