"""Price lookup order and the cost formulas of docs/telemetry-and-cost.md."""

from __future__ import annotations

from pathlib import Path

import pytest

from components import settings
from components.errors import InputError
from components.record import cost
from components.record.telemetry import StepTimes


def test_shipped_table_entries_all_carry_source_and_as_of() -> None:
    table = cost.shipped_table()
    assert len(table) >= 10
    for entry in table:
        assert entry["source"] and entry["as_of"], entry


def test_lookup_order_flag_env_file_table(tmp_path: Path) -> None:
    prices = tmp_path / "prices.yaml"
    prices.write_text("prices:\n  - {gpu: nvidia-h100-80gb, per_gpu_hour: 2.5, source: contract, as_of: 2026-11}\n")
    env = {settings.PRICE_PER_GPU_HOUR.name: "4.0", settings.PRICE_FILE.name: str(prices)}
    assert cost.resolve_price("nvidia-h100-80gb", flag="9", env=env).source == "flag"
    got = cost.resolve_price("nvidia-h100-80gb", env=env)
    assert (got.per_gpu_hour, got.source) == (4.0, "env")
    got = cost.resolve_price("nvidia-h100-80gb", env={settings.PRICE_FILE.name: str(prices)})
    assert (got.per_gpu_hour, got.source) == (2.5, "file:prices.yaml")
    got = cost.resolve_price("nvidia-h100-80gb", env={})
    assert (got.per_gpu_hour, got.source) == (6.88, "aws-pricelist@2026-11-09")
    got = cost.resolve_price("nvidia-h100-80gb", env={settings.PRICE_PROVIDER.name: "lambda"})
    assert got.per_gpu_hour == 3.99


def test_unknown_gpu_is_unknown_never_guessed() -> None:
    assert cost.resolve_price("acme-x1000", env={}) is None
    tags = cost.cost_tags([cost.GpuUse(step="finetune", gpus=1)], None)
    assert tags["llmpack.price_per_gpu_hour"] == "unknown"


def test_a_run_without_a_gpu_step_has_one_word_for_its_price_everywhere() -> None:
    """Issue 52 (leftover 3): a run with no GPU step was tagged price ``unknown`` while show_record.py printed
    ``n/a``: one word (docs/glossary.md "n/a (price)"), in the tags and wherever they are shown."""
    from llmpack.report.facts import report_facts
    from llmpack.ui import glossary

    tags = cost.cost_tags([cost.GpuUse(step="prepare-data", gpus=0)], None)
    assert (tags["llmpack.price_per_gpu_hour"], tags["llmpack.price_source"]) == (cost.NOT_PRICED, cost.NOT_PRICED)
    assert cost.NOT_PRICED == "n/a" and "n/a" in glossary.define("not_priced")
    older = {**tags, "llmpack.price_per_gpu_hour": "unknown", "llmpack.price_source": "unknown"}  # a record before
    for t in (tags, older):
        facts = report_facts({"runs": [{"status": "succeeded", "mode": "local", "tags": t}]})
        assert (facts["price_per_gpu_hour"], facts["price_source"]) == ("n/a", "n/a")
    assert cost.price_tag({"llmpack.gpu_count": "1"}, "llmpack.price_per_gpu_hour") == "unknown"


@pytest.mark.parametrize("bad", ["abc", "nan", "-1", "inf", ""])
def test_bad_price_is_one_clear_error(bad: str) -> None:
    with pytest.raises(InputError, match="--price-per-gpu-hour: price"):
        cost.resolve_price("nvidia-l4", flag=bad, env={})


def _steps(**events: dict[str, float]) -> dict[str, StepTimes]:
    return {name: StepTimes(step=name, events=ev, metrics={}) for name, ev in events.items()}


def test_cost_formula_local_bills_process_start_to_finish() -> None:
    steps = _steps(finetune={"process_started": 100.0, "finished": 460.0},
                   evaluate={"process_started": 470.0, "finished": 500.0})
    steps["finetune"].metrics.update(train_s=300.0, train_tokens=2_000_000)
    uses = [cost.GpuUse(step="finetune", gpus=2, cpu=16), cost.GpuUse(step="evaluate", gpus=1),
            cost.GpuUse(step="register", gpus=0)]
    price = cost.Price(gpu_type="nvidia-h100-80gb", per_gpu_hour=6.0, source="test")
    m = cost.cost_metrics(steps, uses, price)
    gpu_seconds = 2 * 360 + 1 * 30
    assert m["gpu_hours"] == pytest.approx(gpu_seconds / 3600)
    assert m["cost_usd"] == pytest.approx(gpu_seconds * 6.0 / 3600)
    assert m["usd_per_1m_tokens"] == pytest.approx(m["cost_usd"] / 2.0)
    assert m["goodput"] == pytest.approx(300 * 2 / gpu_seconds)  # no wall time given: the billed GPU-seconds
    assert cost.cpu_to_gpu_ratio(uses) == 8.0


def test_cluster_billing_adds_node_provisioning() -> None:
    steps = _steps(finetune={"pod_created": 0.0, "node_ready": 90.0, "container_started": 120.0,
                             "process_started": 121.0, "finished": 720.0})
    assert cost.billed_seconds(steps["finetune"]) == pytest.approx(600 + 90)


def test_unknown_price_gives_no_cost_but_still_gpu_hours() -> None:
    steps = _steps(finetune={"process_started": 0.0, "finished": 3600.0})
    m = cost.cost_metrics(steps, [cost.GpuUse(step="finetune", gpus=1)], None)
    assert m["gpu_hours"] == 1.0 and m["cost_usd"] is None


def test_peak_flops_by_device_name() -> None:
    assert cost.peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert cost.peak_flops("NVIDIA H100 PCIe") == 756e12
    assert cost.peak_flops("NVIDIA A100-SXM4-80GB") == 312e12
    assert cost.peak_flops("cpu") is None


def _goodput_of(*, submit_gap_s: float, startup_s: float, gap_between_s: float) -> float:
    """One run's goodput through the whole derivation (components.record.close.summarize): the same
    training (train_s 30 s on 2 GPUs), with ``submit_gap_s`` of unbilled wait before finetune's process,
    ``startup_s`` of billed start-up in it, and ``gap_between_s`` between finetune and evaluate."""
    from components.record import close
    from components.record.telemetry import RunContext, make_record

    t0 = 1_700_000_000.0
    ctx = RunContext(run_group="g", pipeline_run="r", orchestrator="direct", mode="local", submitted_at=t0)
    start = t0 + submit_gap_s
    first = start + startup_s
    done = first + 30.0
    ev_start = done + gap_between_s
    records = [make_record(ctx, "event", "finetune", "process_started", start, 0),
               make_record(ctx, "event", "finetune", "model_loaded", first - 0.5, 0),
               make_record(ctx, "event", "finetune", "first_step", first, 0),
               make_record(ctx, "event", "finetune", "finished", done, 0),
               make_record(ctx, "metric", "finetune", "train_s", 30.0, 0),
               make_record(ctx, "event", "evaluate", "process_started", ev_start, 0),
               make_record(ctx, "event", "evaluate", "finished", ev_start + 5.0, 0)]
    uses = [cost.GpuUse(step="finetune", gpus=2), cost.GpuUse(step="evaluate", gpus=1)]
    price = cost.Price(gpu_type="nvidia-h100-80gb", per_gpu_hour=6.0, source="test")
    metrics, _ = close.summarize(ctx=ctx, records=records, uses=uses, price=price, finished_at=ev_start + 6.0)
    assert metrics["goodput"] is not None and 0 < metrics["goodput"] <= 1
    return metrics["goodput"]


@pytest.mark.parametrize("more", ["submit_gap_s", "startup_s", "gap_between_s"])
def test_goodput_a_slower_path_never_looks_better(more: str) -> None:
    """Same training; more wall time before, inside or between the GPU steps: goodput can only fall.

    Dividing by billed GPU-seconds alone let an unbilled spin-up (the MLflow path's 7 s) vanish:
    the slowest, dearest path had the best goodput.
    """
    base = {"submit_gap_s": 1.0, "startup_s": 2.0, "gap_between_s": 0.5}
    fast = _goodput_of(**base)
    slow = _goodput_of(**{**base, more: base[more] + 10.0})
    assert slow < fast, (more, slow, fast)


def test_goodput_divides_by_the_gpus_held_from_submit_to_end_or_the_billed_if_more() -> None:
    billed = 2 * 40.0 + 1 * 5.0
    assert cost.goodput(train_gpu_s=60.0, billed_gpu_s=billed, held_gpus=2, wall_s=100.0) == pytest.approx(60 / 200)
    # node tail
    assert cost.goodput(train_gpu_s=60.0, billed_gpu_s=900.0, held_gpus=2, wall_s=100.0) == pytest.approx(60 / 900)
    # no submit time
    assert cost.goodput(train_gpu_s=60.0, billed_gpu_s=billed, wall_s=None) == pytest.approx(60 / billed)
    assert cost.goodput(train_gpu_s=None, billed_gpu_s=billed, held_gpus=2, wall_s=100.0) is None
    assert cost.goodput(train_gpu_s=0.0, billed_gpu_s=0.0, held_gpus=0, wall_s=100.0) is None
