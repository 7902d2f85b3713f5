from __future__ import annotations

import os
import threading
import time
from datetime import datetime, timezone


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def as_utc(value: datetime | None) -> datetime | None:
    """SQLite returns naive datetimes; everything we store is UTC."""
    if value is None:
        return None
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)


_lock = threading.Lock()
_last = [0, 0]


def new_id() -> str:
    """A UUIDv7-style id: time-ordered, so ordering by id is ordering by submission.

    Monotonic within a process (a counter in the random bits breaks ties in one ms).
    """
    with _lock:
        ms = time.time_ns() // 1_000_000
        if ms <= _last[0]:
            ms = _last[0]
            _last[1] += 1
        else:
            _last[0] = ms
            _last[1] = int.from_bytes(os.urandom(2), "big") & 0x3FF
        seq = _last[1] & 0xFFF
    rand = int.from_bytes(os.urandom(8), "big") & ((1 << 62) - 1)
    value = (ms << 80) | (0x7 << 76) | (seq << 64) | (0b10 << 62) | rand
    h = f"{value:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
