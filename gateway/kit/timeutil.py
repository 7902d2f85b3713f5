from __future__ import annotations

import os
import threading
import time
from datetime import UTC, datetime


def utcnow() -> datetime:
    return datetime.now(UTC)


def as_utc(value: datetime | None) -> datetime | None:
    """SQLite returns naive datetimes; everything we store is UTC."""
    if value is None:
        return None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


_lock = threading.Lock()
_last = [0, 0]


def new_id() -> str:
    """A UUIDv7-style id: time-ordered, so ordering by id is ordering by submission.

    Monotonic within a process (a counter in the random bits breaks ties in one ms).
    """
    return new_ids(1)[0]


def new_ids(n: int) -> list[str]:
    """``n`` ids as :func:`new_id` makes them, in order, for one lock and one read of randomness.

    A job set takes its 10,000 task ids at once (gateway/flows/service.py). The 12-bit
    counter allows 4,096 ids per millisecond; past that the ids borrow the next
    millisecond, so they stay strictly increasing.
    """
    noise = os.urandom(8 * n)
    out: list[str] = []
    with _lock:
        now_ms = time.time_ns() // 1_000_000
        for k in range(n):
            if now_ms <= _last[0]:
                _last[1] += 1
                if _last[1] > 0xFFF:
                    _last[0] += 1
                    _last[1] = 0
            else:
                _last[0] = now_ms
                _last[1] = int.from_bytes(os.urandom(2), "big") & 0x3FF
            rand = int.from_bytes(noise[8 * k:8 * k + 8], "big") & ((1 << 62) - 1)
            value = (_last[0] << 80) | (0x7 << 76) | (_last[1] << 64) | (0b10 << 62) | rand
            h = f"{value:032x}"
            out.append(f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}")
    return out
