"""GPU prices and the cost formulas of docs/telemetry-and-cost.md.

Price per GPU-hour, first found wins: the ``--price-per-gpu-hour`` flag, the
``LLMPACK_PRICE_PER_GPU_HOUR`` env var, a user price YAML (``--price-file`` or
``LLMPACK_PRICE_FILE``, same format as ``components/record/prices.yaml``), the shipped table.
An unknown GPU type with no price is reported as unknown, never guessed. A spot node (its
capacity type read from the node's labels, :func:`llmpack.cluster.k8s.objects.capacity_type`) is priced
from a row's ``spot_per_gpu_hour`` when the row has one, else on-demand; :func:`cost_tags` says which.

``cost_usd = gpu_count x billed seconds x price / 3600``, billed from container start
(local: process start) to finish, plus node provisioning time when a node was brought up;
summed over every attempt of a retried step (:func:`cost_metrics`).
On a cluster, :func:`bill_nodes` bills GPU nodes instead, the way clouds bill them (node
Ready to removal, or last pod + the autoscaler's scale-down delay; see ``llmpack.cluster.compare.cluster``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from components import settings, yamltext
from components.errors import InputError
from components.record.telemetry import TRAIN_STEP, StepTimes

SHIPPED_TABLE = Path(__file__).with_name("prices.yaml")
# A row's text columns: each one value, kept as text (a YAML date stays as written).
TEXT_COLUMNS = ("as_of", "source", "provider", "url", "spot_as_of", "spot_url")


@dataclass(frozen=True, kw_only=True)
class Price:
    gpu_type: str
    per_gpu_hour: float
    source: str  # "flag", "env", "file:<path>", or "<source>@<as_of>" from the shipped table
    provider: str = ""
    as_of: str = ""
    capacity_type: str = ""  # the node's ("spot", "on-demand", "unknown"); "" when no node was asked about
    spot: bool = False  # priced from the row's spot_per_gpu_hour column


def parse_price(text: Any, where: str) -> float:
    """A price from a flag, env var or file: a finite number >= 0, else a one-line error."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise InputError(f"{where}: price {yamltext.excerpt(text)} is not a number") from None
    if math.isnan(value) or math.isinf(value) or value < 0:
        raise InputError(f"{where}: price {yamltext.excerpt(text)} must be a finite number >= 0")
    return value


def _load_table(path: Path) -> list[dict[str, Any]]:
    """A price YAML's entries, each checked; anything else is one line naming the file (and line or entry)."""
    if path.exists() and not path.is_file() and not path.is_dir():  # a pipe: every step re-reads the file
        raise InputError(f"{path}: not a regular file (a pipe or device?); save the prices to a file first")
    try:
        text = yamltext.read_bytes(path, str(path)).decode("utf-8")
    except OSError as exc:
        raise InputError(f"{path}: cannot read price file ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise InputError(f"{path}: not UTF-8 text; expected a price YAML like components/record/prices.yaml") from None
    data = yamltext.safe_load(text, str(path))
    entries = data.get("prices") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise InputError(f"{path}: expected a top-level 'prices:' list")
    out = []
    for i, entry in enumerate(entries):
        where = f"{path}: prices[{i}]"
        if not isinstance(entry, dict) or "gpu" not in entry or "per_gpu_hour" not in entry:
            raise InputError(f"{where} needs 'gpu' and 'per_gpu_hour'")
        if not isinstance(entry["gpu"], str) or not entry["gpu"].strip():
            raise InputError(f"{where}.gpu: {yamltext.excerpt(entry['gpu'])} is not a GPU type name")
        for key in TEXT_COLUMNS:
            if isinstance(entry.get(key), (dict, list)):
                raise InputError(f"{where}.{key}: expected a single value, got a {type(entry[key]).__name__}")
        if isinstance(entry["per_gpu_hour"], bool):  # YAML's yes/true would otherwise be a price of 1
            raise InputError(f"{where}.per_gpu_hour: price {yamltext.excerpt(entry['per_gpu_hour'])} is not a number")
        entry = {k: (str(v) if k in (*TEXT_COLUMNS, "gpu") else v) for k, v in entry.items()}
        entry["per_gpu_hour"] = parse_price(entry["per_gpu_hour"], f"{where}.per_gpu_hour")
        if entry.get("spot_per_gpu_hour") is not None:
            if isinstance(entry["spot_per_gpu_hour"], bool):
                raise InputError(f"{where}.spot_per_gpu_hour: "
                                 f"price {yamltext.excerpt(entry['spot_per_gpu_hour'])} is not a number")
            entry["spot_per_gpu_hour"] = parse_price(entry["spot_per_gpu_hour"], f"{where}.spot_per_gpu_hour")
        out.append(entry)
    return out


@lru_cache(maxsize=1)
def shipped_table() -> tuple[dict[str, Any], ...]:
    return tuple(_load_table(SHIPPED_TABLE))


def known_gpu_types() -> list[str]:
    return sorted({e["gpu"] for e in shipped_table()})


def _pick(entries: list[dict[str, Any]] | tuple[dict[str, Any], ...], gpu_type: str,
          provider: str | None) -> dict[str, Any] | None:
    matches = [e for e in entries if e["gpu"] == gpu_type]
    if provider:
        matches = [e for e in matches if e.get("provider") == provider] or []
    return matches[0] if matches else None


def resolve_price(
    gpu_type: str | None,
    *,
    flag: Any = None,
    price_file: str | None = None,
    provider: str | None = None,
    env: dict[str, str] | None = None,
    capacity_type: str = "",
) -> Price | None:
    """The price per GPU-hour for ``gpu_type``, or None when it is unknown.

    ``capacity_type`` (the node's: ``spot``, ``on-demand``, ``unknown``; "" off a cluster): a spot
    node takes the row's ``spot_per_gpu_hour`` where the chosen row has one (the flag and env var
    are the price whatever the node).
    """
    env = dict(os.environ) if env is None else env
    if not gpu_type:
        return None
    if flag is not None:
        return Price(gpu_type=gpu_type, per_gpu_hour=parse_price(flag, "--price-per-gpu-hour"), source="flag",
                     capacity_type=capacity_type)
    if env.get(settings.PRICE_PER_GPU_HOUR.name):
        return Price(gpu_type=gpu_type,
                     per_gpu_hour=parse_price(env[settings.PRICE_PER_GPU_HOUR.name], settings.PRICE_PER_GPU_HOUR.name),
                     source="env", capacity_type=capacity_type)
    user_file = price_file or env.get(settings.PRICE_FILE.name)
    user_table = _load_table(Path(user_file)) if user_file else []
    if not provider and env.get(settings.PRICE_PROVIDER.name):
        provider = env[settings.PRICE_PROVIDER.name]
        known = sorted({e.get("provider", "") for e in (*user_table, *shipped_table())} - {""})
        if provider not in known:
            raise InputError(f"{settings.PRICE_PROVIDER.name}={provider!r}: no price list from that provider "
                             f"(known: {', '.join(known)})")
    if user_file:
        entry = _pick(user_table, gpu_type, provider)
        if entry:
            return _entry_price(gpu_type, entry, source=f"file:{Path(user_file).name}", capacity_type=capacity_type)
    entry = _pick(shipped_table(), gpu_type, provider)
    if entry:
        return _entry_price(gpu_type, entry, source=f"{entry['source']}@{entry['as_of']}", capacity_type=capacity_type)
    return None


def _entry_price(gpu_type: str, entry: Mapping[str, Any], *, source: str, capacity_type: str = "") -> Price:
    """The price a table row gives ``gpu_type``, credited to ``source``.

    Its spot column for a spot node that has one.
    """
    spot = capacity_type == "spot" and entry.get("spot_per_gpu_hour") is not None
    as_of = entry.get("spot_as_of", entry.get("as_of", "")) if spot else entry.get("as_of", "")
    if spot and source.endswith(f"@{entry.get('as_of')}"):  # a shipped row's spot figure has its own date
        source = source.rsplit("@", 1)[0] + f"@{as_of}"
    return Price(gpu_type=gpu_type, per_gpu_hour=entry["spot_per_gpu_hour" if spot else "per_gpu_hour"],
                 source=source, provider=entry.get("provider", ""),
                 as_of=as_of, capacity_type=capacity_type, spot=spot)


def price_column(price: Price) -> str:
    """Which price a node's GPUs got: ``spot`` or ``on-demand`` (a table or file row), or ``flag``/``env``."""
    if price.source in ("flag", "env"):
        return price.source
    return "spot" if price.spot else "on-demand"


@dataclass(frozen=True, kw_only=True)
class GpuUse:
    """How many GPUs a step holds; its timings come from telemetry."""

    step: str
    gpus: int
    cpu: float = 1.0
    gpu_type: str | None = None


def billed_seconds(times: StepTimes) -> float | None:
    """Container start (local: process start) to finish, plus provisioning when a node came up."""
    start, end = times.start, times.events.get("finished")
    if start is None or end is None:
        return None
    billed = end - start
    created, node_ready = times.events.get("pod_created"), times.events.get("node_ready")
    if created is not None and node_ready is not None and node_ready > created:
        billed += node_ready - created
    return billed


@dataclass(frozen=True, kw_only=True)
class AttemptBill:
    """One retried attempt of a step (not the last one) and what its GPUs cost."""

    step: str
    attempt: int
    billed_s: float | None  # container (local: process) start to finish; None when it left no finish
    gpu_hours: float
    cost_usd: float | None
    started_at: float | None = None  # its first event and its last (epoch seconds): the report's timeline draws it
    ended_at: float | None = None


def retried_attempts(steps: Mapping[str, StepTimes], uses: list[GpuUse], price: Price | None) -> list[AttemptBill]:
    """Every attempt that was retried (all but each step's last), GPU steps priced, in step then attempt order."""
    gpus = {u.step: u.gpus for u in uses}
    out = []
    for name, st in steps.items():
        for a in st.retried:
            billed = billed_seconds(a)
            hours = max(0, gpus.get(name, 0)) * (billed or 0.0) / 3600.0
            seen = list(a.events.values())
            out.append(AttemptBill(step=name, attempt=a.attempt, billed_s=billed, gpu_hours=hours,
                                   cost_usd=None if price is None else hours * price.per_gpu_hour,
                                   started_at=min(seen, default=None), ended_at=max(seen, default=None)))
    return out


def cost_metrics(
    steps: dict[str, StepTimes],
    uses: list[GpuUse],
    price: Price | None,
    *,
    wall_s: float | None = None,
) -> dict[str, float | None]:
    """gpu_hours, cost_usd, usd_per_1m_tokens and goodput for one pipeline run, every attempt billed.

    A retried step's earlier attempts held their GPUs too: they are in ``gpu_hours`` and
    ``cost_usd``, and in goodput's denominator (:func:`goodput`; ``wall_s``: the run's
    ``total_s``). ``retries`` counts the retried attempts of all steps; ``retry_gpu_hours`` and
    ``retry_cost_usd`` are their share of the bill.
    """
    gpu_seconds = 0.0
    for use in uses:
        if use.gpus <= 0 or use.step not in steps:
            continue
        for attempt in steps[use.step].all_attempts:
            billed = billed_seconds(attempt)
            if billed is not None:
                gpu_seconds += use.gpus * billed
    retried = retried_attempts(steps, uses, price)
    retry_hours = sum(a.gpu_hours for a in retried)
    train_gpus = next((u.gpus for u in uses if u.step == TRAIN_STEP), 0)
    held_gpus = max((u.gpus for u in uses), default=0)
    return bill_metrics(gpu_seconds=gpu_seconds, train=steps.get(TRAIN_STEP), train_gpus=train_gpus, price=price,
                        retries=len(retried), retry_gpu_hours=retry_hours, wall_s=wall_s, held_gpus=held_gpus)


def goodput(*, train_gpu_s: float | None, billed_gpu_s: float, held_gpus: int = 0,
            wall_s: float | None = None) -> float | None:
    """Training GPU-seconds over the GPU-seconds the run held: its GPUs from submit to end
    (``held_gpus x wall_s``), or the billed GPU-seconds where those are more (a node's scale-down
    tail, GPU steps side by side).

    For the same training, more wall time or more billed time can only lower it. Dividing by the
    billed GPU-seconds alone (as before) left out the wait before the first GPU step and the
    gaps between steps, which are not billed: the slowest path, whose spin-up was longest and
    whose training ran slowest, had the best goodput.
    """
    held = max(0, held_gpus) * wall_s if wall_s is not None and wall_s > 0 else 0.0
    denominator = max(billed_gpu_s, held)
    if train_gpu_s is None or denominator <= 0:
        return None
    return train_gpu_s / denominator


def bill_metrics(*, gpu_seconds: float, train: StepTimes | None, train_gpus: int, price: Price | None, retries: int,
                 retry_gpu_hours: float, wall_s: float | None = None, held_gpus: int = 0) -> dict[str, float | None]:
    """The cost metrics of a run from its billed GPU-seconds: one formula for local runs and cluster pods alike.

    ``wall_s`` (the run's ``total_s``) and ``held_gpus`` (the largest GPU count of a GPU step)
    give goodput's held GPU-seconds (:func:`goodput`); without them it divides by the billed ones.
    """
    train_s = train.metrics.get("train_s") if train else None
    tokens = train.metrics.get("train_tokens") if train else None
    cost = None if price is None else gpu_seconds * price.per_gpu_hour / 3600.0
    return {
        "gpu_hours": gpu_seconds / 3600.0,
        "cost_usd": cost,
        "usd_per_1m_tokens": None if cost is None or not tokens else cost / tokens * 1e6,
        "goodput": goodput(train_gpu_s=None if train_s is None else train_s * train_gpus, billed_gpu_s=gpu_seconds,
                           held_gpus=max(held_gpus, train_gpus), wall_s=wall_s),
        "retries": float(retries),
        "retry_gpu_hours": retry_gpu_hours,
        "retry_cost_usd": None if price is None else retry_gpu_hours * price.per_gpu_hour,
    }


def cpu_to_gpu_ratio(uses: list[GpuUse]) -> float | None:
    """CPU cores requested per GPU on the training step (a common GPU-node sizing figure)."""
    train = next((u for u in uses if u.step == TRAIN_STEP), None)
    if train is None or train.gpus <= 0:
        return None
    return train.cpu / train.gpus


# A price tag's word (docs/glossary.md "n/a"): a run no step of which asks for a GPU has nothing to price, which is
# not the same as a GPU step whose price was not found (UNKNOWN_PRICE).
NOT_PRICED, UNKNOWN_PRICE = "n/a", "unknown"
PRICE_TAGS = ("llmpack.price_per_gpu_hour", "llmpack.price_source")


def price_tag(tags: Mapping[str, Any], key: str) -> str:
    """A price tag as shown: :data:`NOT_PRICED` for a run without a GPU step (a record written before that word
    says ``unknown``), else the tag (``unknown`` when absent)."""
    if key in PRICE_TAGS and str(tags.get("llmpack.gpu_count", "")) == "0":
        return NOT_PRICED
    return str(tags.get(key, UNKNOWN_PRICE))


def cost_tags(uses: list[GpuUse], price: Price | None) -> dict[str, str]:
    gpu_uses = [u for u in uses if u.gpus > 0]
    ratio = cpu_to_gpu_ratio(uses)
    spec_type = next((u.gpu_type for u in gpu_uses if u.gpu_type), None)
    missing = UNKNOWN_PRICE if gpu_uses else NOT_PRICED  # a GPU step unpriced, or no GPU step to price
    return {
        "llmpack.gpu_type": price.gpu_type if price else (spec_type or ("unknown" if gpu_uses else "none")),
        "llmpack.gpu_count": str(max((u.gpus for u in gpu_uses), default=0)),
        "llmpack.price_per_gpu_hour": missing if price is None else f"{price.per_gpu_hour:g}",
        "llmpack.price_source": missing if price is None else price.source,
        "llmpack.cpu_to_gpu_ratio": NOT_PRICED if ratio is None else f"{ratio:g}",
        **({"llmpack.capacity_type": price.capacity_type, "llmpack.price_column": price_column(price)}
           if price is not None and price.capacity_type else {}),
    }


# Dense bf16 peaks (TFLOP/s) for MFU, matched against torch.cuda.get_device_name().
PEAK_TFLOPS = (("H200", 989.0), ("H100 PCIe", 756.0), ("H100", 989.0), ("A100", 312.0))


def peak_flops(device_name: str) -> float | None:
    for marker, tflops in PEAK_TFLOPS:
        if marker.lower() in device_name.lower():
            return tflops * 1e12
    return None


# --------------------------------------------------------------------------- node billing (clusters)

DEFAULT_SCALE_DOWN_DELAY_S = 600.0  # cluster-autoscaler --scale-down-unneeded-time, Karpenter consolidation alike


@dataclass(frozen=True, kw_only=True)
class NodeSpan:
    """A GPU node as the pod watcher saw it (UTC epoch seconds; None where unknown).

    ``removed``: when the node went away (its ``deletionTimestamp``, the cluster-autoscaler's
    ``ToBeDeletedByClusterAutoscaler`` taint, or when a re-read first found it gone); None when
    the watcher did not see it go.
    """

    name: str
    gpus: int
    created: float | None
    ready: float | None
    removed: float | None = None


@dataclass(frozen=True, kw_only=True)
class PodSpan:
    """One GPU pod of a pipeline run, on ``node``."""

    run: str
    node: str
    gpus: int
    created: float | None
    scheduled: float | None
    started: float | None
    finished: float | None


@dataclass(frozen=True, kw_only=True)
class NodeBill:
    """A run's share of its nodes: GPU-seconds billed, and the (share-weighted) GPUs whose
    scale-down delay is in it (so a report can re-bill another delay linearly)."""

    gpu_seconds: float
    tail_gpus: float
    nodes: tuple[str, ...]


def _node_window(node: NodeSpan, pods: list[PodSpan], scale_down_delay_s: float) -> tuple[float, bool] | None:
    """Seconds the node is billed for these pods, and whether the scale-down delay is in them."""
    created = [p.created for p in pods if p.created is not None]
    provisioned = node.created is not None and bool(created) and node.created > min(created)
    if provisioned:
        start = node.ready if node.ready is not None else node.created
    else:  # already running: ours from the first bind (the scheduler's PodScheduled), else container start
        binds = [p.scheduled if p.scheduled is not None else p.started for p in pods]
        start = min((b for b in binds if b is not None), default=None)
    ends = [t for p in pods for t in (p.finished, p.started, p.scheduled) if t is not None]
    if start is None or not ends:
        return None
    last = max(ends)
    if node.removed is not None:
        return max(0.0, max(node.removed, last) - start), False
    return max(0.0, last + scale_down_delay_s - start), True


def bill_nodes(
    nodes: Mapping[str, NodeSpan],
    pods: Iterable[PodSpan],
    *,
    scale_down_delay_s: float = DEFAULT_SCALE_DOWN_DELAY_S,
) -> dict[str, NodeBill]:
    """Per run: GPU-seconds of the nodes its GPU pods ran on, billed the way clouds bill nodes.

    Per node: from Ready (a node created after the first of these pods was brought up for
    them), or from the first pod's scheduling (a node that was already running), to its
    removal, or, when the removal was not seen, to the last pod's finish plus
    ``scale_down_delay_s`` (the autoscaler keeps an empty node that long); times the node's
    GPU count. A node several runs used is shared in proportion to their pod GPU-seconds
    (GPUs x container start to finish; equally when none is known). Pods on a node not in
    ``nodes`` are not billed here (the caller falls back to container time).
    """
    by_node: dict[str, list[PodSpan]] = {}
    for pod in pods:
        if pod.gpus > 0 and pod.node in nodes:
            by_node.setdefault(pod.node, []).append(pod)
    seconds: dict[str, float] = {}
    tails: dict[str, float] = {}
    used: dict[str, list[str]] = {}
    for name, mine in sorted(by_node.items()):
        node = nodes[name]
        window = _node_window(node, mine, scale_down_delay_s)
        if window is None:
            continue
        billed_s, tail = window
        weight: dict[str, float] = {}
        for p in mine:
            held = p.finished - p.started if p.finished is not None and p.started is not None else 0.0
            weight[p.run] = weight.get(p.run, 0.0) + p.gpus * max(0.0, held)
        total = sum(weight.values())
        for run, w in weight.items():
            share = w / total if total > 0 else 1.0 / len(weight)
            seconds[run] = seconds.get(run, 0.0) + share * node.gpus * billed_s
            tails[run] = tails.get(run, 0.0) + (share * node.gpus if tail else 0.0)
            used.setdefault(run, []).append(name)
    return {run: NodeBill(gpu_seconds=seconds[run], tail_gpus=tails[run], nodes=tuple(used[run])) for run in seconds}
