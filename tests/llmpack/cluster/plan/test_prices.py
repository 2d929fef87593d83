"""The price catalogue the plan prices from: every common training GPU on the three large clouds, each row
sourced (its provider's pricing page) and dated, spot columns dated on their own, stale rows flagged,
``--price-file`` first."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from components.record import cost
from llmpack.cluster.plan import prices

GPUS = ("nvidia-h200", "nvidia-h100-80gb", "nvidia-a100-40gb", "nvidia-a100-80gb", "nvidia-l40s", "nvidia-l4",
        "nvidia-a10g", "nvidia-v100", "nvidia-t4")
PAGES = {"aws": "https://aws.amazon.com/", "gcp": "https://cloud.google.com/", "azure": "https://azure.microsoft.com/"}


def test_the_catalogue_covers_the_common_gpus_on_the_three_clouds_each_row_sourced_and_dated() -> None:
    table = cost.shipped_table()
    assert set(GPUS) <= {e["gpu"] for e in table}
    for provider, page in PAGES.items():
        mine = [e for e in table if e["provider"] == provider]
        assert len(mine) >= 5, provider
        for e in mine:
            assert e["url"].startswith(page), e
            assert prices.as_of_date(e["as_of"]) is not None, e
    spot = [e for e in table if "spot_per_gpu_hour" in e]
    assert len(spot) >= 8
    for e in spot:
        assert 0 < e["spot_per_gpu_hour"] < e["per_gpu_hour"], e
        assert prices.as_of_date(e["spot_as_of"]) is not None and e["spot_url"].startswith("https://"), e


def test_a_spot_option_takes_the_spot_column_with_its_own_date_and_page_and_old_rows_are_stale() -> None:
    today = dt.date(2026, 12, 5)
    spot = prices.price_of("nvidia-t4", "spot", provider="aws", today=today)
    od = prices.price_of("nvidia-t4", "on-demand", provider="aws", today=today)
    assert spot.per_gpu_hour < od.per_gpu_hour and spot.url.endswith("/ec2/spot/pricing/")
    assert od.url.endswith("/ec2/pricing/on-demand/")
    assert spot.source == f"aws-pricelist@{spot.as_of}" and spot.stale  # 2025-06 is over 180 days before
    fresh = prices.price_of("nvidia-h100-80gb", "on-demand", today=today)
    assert fresh.source == "aws-pricelist@2026-11-09" and not fresh.stale
    assert prices.price_of("nvidia-h100-80gb", "on-demand", today=dt.date(2027, 6, 1)).stale
    # No spot column: no spot price, never the on-demand figure under a spot label.
    assert prices.price_of("nvidia-h200", "spot", today=today) is None


@pytest.mark.parametrize(("text", "stale"), [("2026-11-20", False), ("2026-06", True), ("2026", True),
                                             ("last spring", True), ("2026-07-01", False)])
def test_staleness_is_by_age_and_an_undated_row_is_stale(text: str, stale: bool) -> None:
    assert prices.is_stale(text, dt.date(2026, 12, 5)) is stale


def test_a_price_file_overrides_the_catalogue(tmp_path: Path) -> None:
    mine = tmp_path / "ours.yaml"
    mine.write_text("prices:\n  - {gpu: nvidia-l4, provider: ours, per_gpu_hour: 0.5, spot_per_gpu_hour: 0.2, "
                    "as_of: 2026-12-01, source: contract, url: 'https://example.invalid/rates'}\n")
    got = prices.price_of("nvidia-l4", "spot", price_file=str(mine), today=dt.date(2026, 12, 5))
    assert (got.per_gpu_hour, got.source, got.url, got.stale) == (0.2, "file:ours.yaml",
                                                                  "https://example.invalid/rates", False)
