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


@pytest.mark.parametrize("bad", ["abc", "nan", "-1", "inf", ""])
def test_bad_price_is_one_clear_error(bad: str) -> None:
    with pytest.raises(InputError, match="--price-per-gpu-hour: price"):
        cost.resolve_price("nvidia-l4", flag=bad, env={})


def _steps(**events: dict[str, float]) -> dict[str, StepTimes]:
    return {name: StepTimes(step=name, events=ev, metrics={}) for name, ev in events.items()}


def test_cost_formula_local_bills_process_start_to_finish() -> None:
    steps = _steps(finetune={"process_started": 100.0, "finished": 460.0}, evaluate={"process_started": 470.0, "finished": 500.0})
    steps["finetune"].metrics.update(train_s=300.0, train_tokens=2_000_000)
    uses = [cost.GpuUse(step="finetune", gpus=2, cpu=16), cost.GpuUse(step="evaluate", gpus=1), cost.GpuUse(step="register", gpus=0)]
    price = cost.Price(gpu_type="nvidia-h100-80gb", per_gpu_hour=6.0, source="test")
    m = cost.cost_metrics(steps, uses, price)
    gpu_seconds = 2 * 360 + 1 * 30
    assert m["gpu_hours"] == pytest.approx(gpu_seconds / 3600)
    assert m["cost_usd"] == pytest.approx(gpu_seconds * 6.0 / 3600)
    assert m["usd_per_1m_tokens"] == pytest.approx(m["cost_usd"] / 2.0)
    assert m["goodput"] == pytest.approx(300 * 2 / gpu_seconds)
    assert cost.cpu_to_gpu_ratio(uses) == 8.0


def test_cluster_billing_adds_node_provisioning() -> None:
    steps = _steps(finetune={"pod_created": 0.0, "node_ready": 90.0, "container_started": 120.0, "process_started": 121.0, "finished": 720.0})
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
