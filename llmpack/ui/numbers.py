"""How numbers are written: money in one format for every command and the report, other figures at a
precision a reader can take in (3 significant figures, never more decimals than the value carries).

``money`` is the format ``llmpack.compare.comparison.quantity`` gives dollars (3 significant figures below
$1, cents above); ``llmpack run``'s summary, compare's table and the report all write dollars
with it.
"""

from __future__ import annotations

import math


def money(usd: float | None, *, signed: bool = False) -> str:
    """``$0.0124``, ``$1.50``, ``$1,234.56``; ``-`` for no figure."""
    if usd is None or (isinstance(usd, float) and math.isnan(usd)):
        return "-"
    sign = "+" if signed and usd > 0 else "-" if usd < 0 else ""
    v = abs(usd)
    if v >= 1:
        return f"{sign}${v:,.2f}"
    if v == 0:
        return f"{sign}$0"
    decimals = max(2, 2 - math.floor(math.log10(v)))  # 3 significant figures, never 9.15e-05
    # Trailing zeros kept: $0.200 beside $0.294 reads as one precision ($0.2 would look rounder than it is).
    text = f"{v:.{decimals}f}"
    return f"{sign}${v:.2f}" if float(text) >= 1 else f"{sign}${text}"  # $0.9996 rounds to $1.00, not $1.000


def figure(value: float | int | None) -> str:
    """A measured figure at 3 significant figures, at most 2 decimals, grouped thousands:
    ``0.0262``, ``1.23``, ``12.3``, ``950``, ``5,626``; integers as they are; ``-`` for none."""
    if value is None:
        return "-"
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer() and abs(value) >= 1000):
        return f"{value:,.0f}"
    if math.isnan(value) or math.isinf(value):
        return str(value)
    v = abs(value)
    if v == 0:
        return "0"
    if v >= 100:
        return f"{value:,.0f}"
    if v >= 1:
        return f"{value:.{2 - int(math.floor(math.log10(v)))}f}"
    return f"{value:.3g}"
