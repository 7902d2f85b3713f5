"""Prices of a GPU-hour per pool and GPU type, and the one rounding rule of statements.

Money is ``Decimal``, never float: a price comes from the pools file as written (``2.35``
stays 2.35, not 2.34999...), and a line's cost is

    cost = round_half_up(charged GPU-seconds x price per GPU-hour / 3600, to the cent)

rounded ONCE per line; a statement's total is the sum of its rounded lines, so the total
printed is always the sum of the lines printed (docs/ledger.md, "Statements").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from decimal import ROUND_HALF_UP, Decimal

CENT = Decimal("0.01")
HOUR_PLACES = Decimal("0.0001")
DEFAULT = "default"  # the key of a pool's price for GPU types it does not name
MAX_PRICE = Decimal(1_000_000)


@dataclasses.dataclass(frozen=True)
class PriceList:
    """``pools``: pool -> GPU type (lower case, or ``default``) -> price per GPU-hour;
    ``currency``: shown beside costs ("" = none)."""

    currency: str = ""
    pools: Mapping[str, Mapping[str, Decimal]] = dataclasses.field(default_factory=dict)

    def price(self, pool: str | None, gpu_type: str | None) -> Decimal | None:
        """The price per GPU-hour of ``gpu_type`` in ``pool``: its own, else the pool's
        ``default``, else None (unpriced)."""
        table = self.pools.get(pool or "")
        if not table:
            return None
        own = table.get((gpu_type or "").lower()) if gpu_type else None
        return own if own is not None else table.get(DEFAULT)


def cost(gpu_seconds: int, price: Decimal | None) -> Decimal | None:
    """A line's cost, rounded half up to the cent once (None when unpriced)."""
    if price is None:
        return None
    return (Decimal(gpu_seconds) * price / Decimal(3600)).quantize(CENT, rounding=ROUND_HALF_UP)


def gpu_hours(gpu_seconds: int) -> Decimal:
    """GPU-seconds as GPU-hours to four places (display; the exact figure is the GPU-seconds)."""
    return (Decimal(gpu_seconds) / Decimal(3600)).quantize(HOUR_PLACES, rounding=ROUND_HALF_UP)


def parse_price(value: object) -> Decimal | None:
    """A price as written in the pools file (int, float or string), or None when it is not a
    finite number in [0, MAX_PRICE] with at most 6 decimal places."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        d = Decimal(str(value).strip())
    except ArithmeticError:
        return None
    if not d.is_finite() or d < 0 or d > MAX_PRICE or d.as_tuple().exponent < -6:  # type: ignore[operator]
        return None
    return d
