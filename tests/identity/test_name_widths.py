"""Every name a token or a request may carry fits the column that stores it (issue #28).

Postgres enforces column widths (SQLite does not): a value wider than its column is a
``StringDataRightTruncation`` at the first write, a 500 for the caller or, in a dispatch
round, an outage for everyone (tests/dispatch/test_long_pool_name.py).
"""

from __future__ import annotations

SPEC = {"name": "wide", "account": "team-a", "command": ["true"], "workers": 1, "gpus_per_worker": 1,
        "memory_per_worker": "1Gi", "time_limit": "5m"}


def test_a_255_character_subject_submits_and_a_longer_one_is_a_401_not_a_500(gw):
    ok = gw.issuer.mint(user="alice", groups=["team-a"], extra={"sub": "s" * 255})
    r = gw.client.post("/v1/jobs", json=SPEC, headers={"Authorization": f"Bearer {ok}"})
    assert r.status_code == 202, r.text

    too_long = gw.issuer.mint(user="alice", groups=["team-a"], extra={"sub": "s" * 256})
    r = gw.client.post("/v1/jobs", json=SPEC, headers={"Authorization": f"Bearer {too_long}"})
    assert r.status_code == 401, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert "longer than 255" in r.text
    with gw.session() as s:
        from sqlalchemy import func, select

        from gateway.models.jobs import Job

        assert s.scalar(select(func.count()).select_from(Job)) == 1  # only the first one
