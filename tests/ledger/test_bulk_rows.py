"""gateway/kit/bulk.py: rows written in one statement read back exactly as given.

The dispatch round writes its claims, events, reservations and ledger entries through it
(one JSON document per statement on Postgres, executemany on SQLite). Both dialects.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import select

from gateway.kit import bulk
from gateway.kit.db import transaction


def _as_utc(v):
    return v if v is None or v.tzinfo else v.replace(tzinfo=UTC)


def test_inserted_rows_read_back_as_given(factory):
    from gateway.models.ledger import LedgerEntry

    at = datetime(2026, 11, 2, 12, 0, 0, 123456, tzinfo=UTC)
    rows = [
        dict(at=at, account_name="a", kind="reserve", job_id="j1", pool="p", gpu_type=None, username="u",
             gpus=8, committed_gpu_seconds=2**40, gpu_seconds=0, billing_weight=0.1 + 0.2, actor="system:x",
             reason='quotes " and \\ backslash, {braces}, commas, and ünïcödé ✓', data={"nested": [1, None, "x"]}),
        dict(at=at + timedelta(seconds=1), account_name="b", kind="release", job_id=None, pool=None,
             gpu_type="h100", username=None, gpus=-8, committed_gpu_seconds=-1, gpu_seconds=7, billing_weight=2,
             actor="system:x", reason="", data=None),
    ]
    with transaction(factory) as s:
        bulk.insert_rows(s.connection(), LedgerEntry.__table__, rows)
    with transaction(factory) as s:
        got = [{c: getattr(e, c) for c in rows[0]} for e in s.scalars(select(LedgerEntry).order_by(LedgerEntry.id))]
    for g in got:
        g["at"] = _as_utc(g["at"])
    assert got == rows
    assert isinstance(got[1]["billing_weight"], float)
