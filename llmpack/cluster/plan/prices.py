"""The price of an option: the catalogue's row for its GPU type and capacity, and whether it is stale.

Prices come from :func:`components.record.cost.resolve_price` (the flag, ``--price-file``, the
shipped ``components/record/prices.yaml``), so the plan prices a GPU as the report later bills it.
A spot option takes the row's ``spot_per_gpu_hour``; a row without one gives the spot option no
price (never the on-demand figure under a spot label). A row whose ``as_of`` is older than
``stale_days`` before today is flagged stale: list prices move, spot prices more.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from typing import Any

from llmpack.cluster.plan.history import SPOT

STALE_DAYS = 180


@dataclass(frozen=True, kw_only=True)
class PriceRow:
    """An option's price per GPU-hour and where it came from."""

    per_gpu_hour: float
    source: str           # "flag", "file:<name>", or "<source>@<as_of>"
    url: str = ""
    as_of: str = ""
    stale: bool = False


def as_of_date(text: str) -> dt.date | None:
    """``2026-11-09``, ``2026-11`` (its first day) or ``2026`` (1 January); None when it is none of those."""
    m = re.fullmatch(r"\s*(\d{4})(?:-(\d{1,2}))?(?:-(\d{1,2}))?\s*", text or "")
    if not m:
        return None
    try:
        return dt.date(int(m.group(1)), int(m.group(2) or 1), int(m.group(3) or 1))
    except ValueError:
        return None


def is_stale(as_of: str, today: dt.date, stale_days: int = STALE_DAYS) -> bool:
    """Older than ``stale_days``, or no readable date at all (an undated price is no fresher)."""
    when = as_of_date(as_of)
    return when is None or (today - when).days > stale_days


def _row(gpu_type: str, provider: str, price_file: str | None) -> dict[str, Any]:
    """The catalogue row that priced the option (the price file's first, as the lookup reads them)."""
    from pathlib import Path

    from components.record import cost

    table = cost._load_table(Path(price_file)) if price_file else []
    for entry in (*table, *cost.shipped_table()):
        if entry["gpu"] == gpu_type and entry.get("provider", "") == provider:
            return entry
    return {}


def price_of(gpu_type: str, capacity: str, *, flag: Any = None, price_file: str | None = None,
             provider: str | None = None, today: dt.date, stale_days: int = STALE_DAYS) -> PriceRow | None:
    """The option's price, or None: no row for the GPU type, or a spot option whose row has no spot column.

    A spot figure is dated and sourced by the row's ``spot_as_of`` / ``spot_url`` where it has them."""
    from components.record import cost

    price = cost.resolve_price(gpu_type, flag=flag, price_file=price_file, provider=provider,
                               capacity_type=capacity)
    if price is None:
        return None
    if price.source == "flag":
        return PriceRow(per_gpu_hour=price.per_gpu_hour, source="flag")
    if capacity == SPOT and not price.spot:
        return None
    row = _row(gpu_type, price.provider, price_file)
    url = str(row.get("spot_url" if price.spot and "spot_url" in row else "url", ""))
    as_of = price.as_of
    return PriceRow(per_gpu_hour=price.per_gpu_hour, source=price.source, as_of=as_of, url=url,
                    stale=is_stale(as_of, today, stale_days))
