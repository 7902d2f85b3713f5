"""Advance reservations through the admin API (issue #31): make, list, delete; bad input is a
problem naming the field and changes nothing. What one does to jobs: tests/dispatch/test_plan_round.py
(in-memory pool) and tests/dispatch/test_holds_real.py (real Slurm and Kueue)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import delete, func, select

from gateway.models.pools import AdvanceReservation, Pool

POOL = "slurm-resv"


@pytest.fixture
def pool_row(gw):
    with gw.session() as s, s.begin():
        if s.get(Pool, POOL) is None:
            s.add(Pool(name=POOL, kind="slurm", gpu_types=["h100"], configured=True))
    yield
    with gw.session() as s, s.begin():
        s.execute(delete(AdvanceReservation))
        s.delete(s.get(Pool, POOL))


def at(hours: float) -> str:
    return (datetime.now(UTC) + timedelta(hours=hours)).isoformat()


def count(gw) -> int:
    with gw.session() as s:
        return s.scalar(select(func.count()).select_from(AdvanceReservation))


GOOD = {"account": "team-a", "pool": POOL, "nodes": 2, "reason": "conference deadline"}


def test_an_admin_makes_lists_and_deletes_a_reservation(gw, pool_row):
    admin = gw.headers("root", admin=True)
    r = gw.client.post("/v1/admin/reservations", headers=admin, json={**GOOD, "start": at(24), "end": at(72)})
    assert r.status_code == 201, r.text
    made = r.json()
    assert (made["account"], made["pool"], made["nodes"], made["gpus"], made["active"]) == (
        "team-a", POOL, 2, None, False)
    assert made["words"].startswith(f"2 nodes of {POOL} are reserved for team-a from ")
    assert made["words"].endswith("(conference deadline)") and made["created_by"]
    assert made["shortfall"]  # no dispatcher here: the pool cannot be checked, and it says so
    listed = gw.client.get("/v1/admin/reservations", headers=admin).json()
    assert [x["id"] for x in listed] == [made["id"]]
    assert gw.client.delete(f"/v1/admin/reservations/{made['id']}", headers=admin).status_code == 204
    assert gw.client.get("/v1/admin/reservations", headers=admin).json() == []
    assert gw.client.delete(f"/v1/admin/reservations/{made['id']}", headers=admin).status_code == 404


@pytest.mark.parametrize("change, field", [
    ({"nodes": None}, "body.gpus"),
    ({"gpus": 8}, "body.gpus"),
    ({"nodes": 0}, "body.nodes"),
    ({"account": "nobody-here"}, "body.account"),
    ({"pool": None}, "body.pool"),
    ({"gpu_type": "h100"}, "body.pool"),
    ({"pool": None, "gpu_type": "no-such-gpu"}, "body.gpu_type"),
    ({"end": at(-1)}, "body.end"),
    ({"start": at(5), "end": at(4)}, "body.end"),
    ({"reason": " "}, "body.reason"),
    ({"colour": "red"}, "body.colour"),
])
def test_bad_reservations_are_problems_naming_the_field_and_change_nothing(gw, pool_row, change, field):
    body = {**GOOD, "start": at(1), "end": at(2), **change}
    body = {k: v for k, v in body.items() if v is not None}
    r = gw.client.post("/v1/admin/reservations", json=body, headers=gw.headers("root", admin=True))
    assert r.status_code == 422 and r.headers["content-type"].startswith("application/problem+json"), r.text
    assert field in [e["field"] for e in r.json()["errors"]], r.json()
    assert count(gw) == 0


def test_an_unknown_pool_is_not_found_and_only_admins_reserve(gw, pool_row):
    r = gw.client.post("/v1/admin/reservations", headers=gw.headers("root", admin=True),
                       json={**GOOD, "pool": "nosuch", "start": at(1), "end": at(2)})
    assert r.status_code == 404
    r = gw.client.post("/v1/admin/reservations", headers=gw.headers(),
                       json={**GOOD, "start": at(1), "end": at(2)})
    assert r.status_code == 403 and count(gw) == 0
    assert gw.client.get("/v1/admin/reservations", headers=gw.headers()).status_code == 403
