"""Maintenance windows through the admin API (issue #31): make, list, delete; bad input is a
problem naming the field and changes nothing. What a window does to jobs is tested against
real Slurm clusters in tests/dispatch/test_windows_slurm.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import delete, func, select

from gateway.models.pools import Pool, PoolWindow

POOL = "slurm-maint"


@pytest.fixture
def pool_row(gw):
    with gw.session() as s, s.begin():
        if s.get(Pool, POOL) is None:
            s.add(Pool(name=POOL, kind="slurm", gpu_types=[], configured=True))
    yield
    with gw.session() as s, s.begin():
        s.execute(delete(PoolWindow).where(PoolWindow.pool == POOL))
        s.delete(s.get(Pool, POOL))


def at(hours: float) -> str:
    return (datetime.now(UTC) + timedelta(hours=hours)).isoformat()


def count(gw) -> int:
    with gw.session() as s:
        return s.scalar(select(func.count()).select_from(PoolWindow))


def test_an_admin_makes_lists_and_deletes_a_window(gw, pool_row):
    admin = gw.headers("root", admin=True)
    r = gw.client.post(f"/v1/admin/pools/{POOL}/windows", headers=admin,
                       json={"start": at(4), "end": at(8), "reason": "kernel upgrade"})
    assert r.status_code == 201, r.text
    made = r.json()
    assert (made["pool"], made["source"], made["maintenance"], made["nodes"], made["active"]) == (
        POOL, "gateway", True, [], False)
    assert made["words"].startswith(f"{POOL} is in maintenance from ") and made["words"].endswith("(kernel upgrade)")
    some = gw.client.post(f"/v1/admin/pools/{POOL}/windows", headers=admin,
                          json={"start": at(-1), "end": at(1), "reason": "replace a GPU", "nodes": ["gpu-017"]}).json()
    assert some["active"] and some["nodes"] == ["gpu-017"] and "1 node of" in some["words"]
    listed = gw.client.get(f"/v1/admin/pools/{POOL}/windows", headers=admin).json()
    assert [w["id"] for w in listed] == [some["id"], made["id"]]  # by start
    assert gw.client.delete(f"/v1/admin/pools/{POOL}/windows/{made['id']}", headers=admin).status_code == 204
    assert [w["id"] for w in gw.client.get(f"/v1/admin/pools/{POOL}/windows", headers=admin).json()] == [some["id"]]
    r = gw.client.delete(f"/v1/admin/pools/{POOL}/windows/{made['id']}", headers=admin)
    assert r.status_code == 404 and r.headers["content-type"].startswith("application/problem+json")


def test_a_window_that_has_ended_is_no_longer_listed(gw, pool_row):
    admin = gw.headers("root", admin=True)
    made = gw.client.post(f"/v1/admin/pools/{POOL}/windows", headers=admin,
                          json={"start": at(-2), "end": at(0.0003), "reason": "short"}).json()
    with gw.session() as s, s.begin():  # let it end without waiting
        s.get(PoolWindow, made["id"]).ends_at = datetime.now(UTC) - timedelta(seconds=1)
    assert gw.client.get(f"/v1/admin/pools/{POOL}/windows", headers=admin).json() == []


@pytest.mark.parametrize("body, field", [
    ({"start": at(2), "end": at(1), "reason": "x"}, "body.end"),
    ({"start": at(-3), "end": at(-2), "reason": "x"}, "body.end"),
    ({"start": at(1), "end": at(24 * 400), "reason": "x"}, "body.end"),
    ({"start": "2026-12-08T06:00:00", "end": at(1000), "reason": "x"}, "body.start"),
    ({"start": at(1), "end": at(2), "reason": "   "}, "body.reason"),
    ({"start": at(1), "end": at(2), "reason": "a\nb"}, "body.reason"),
    ({"start": at(1), "end": at(2), "reason": "x" * 201}, "body.reason"),
    ({"start": at(1), "end": at(2)}, "body.reason"),
    ({"start": at(1), "end": at(2), "reason": "x", "nodes": ["n1", "n1"]}, "body.nodes.1"),
    ({"start": at(1), "end": at(2), "reason": "x", "nodes": ["n1;reboot"]}, "body.nodes.0"),
    ({"start": at(1), "end": at(2), "reason": "x", "nodes": ["-n1"]}, "body.nodes.0"),
    ({"start": "tuesday", "end": at(2), "reason": "x"}, "body.start"),
    ({"start": at(1), "end": at(2), "reason": "x", "colour": "red"}, "body.colour"),
])
def test_bad_windows_are_problems_naming_the_field_and_change_nothing(gw, pool_row, body, field):
    before = count(gw)
    r = gw.client.post(f"/v1/admin/pools/{POOL}/windows", json=body, headers=gw.headers("root", admin=True))
    assert r.status_code == 422 and r.headers["content-type"].startswith("application/problem+json")
    assert field in [e["field"] for e in r.json()["errors"]], r.json()
    assert count(gw) == before


def test_unknown_pools_and_ids_are_not_found(gw, pool_row):
    admin = gw.headers("root", admin=True)
    r = gw.client.post("/v1/admin/pools/nosuch/windows", headers=admin,
                       json={"start": at(1), "end": at(2), "reason": "x"})
    assert r.status_code == 404
    assert gw.client.get("/v1/admin/pools/nosuch/windows", headers=admin).status_code == 404
    r = gw.client.delete(f"/v1/admin/pools/{POOL}/windows/not-an-id", headers=admin)
    assert r.status_code == 422 and "path.window_id" in [e["field"] for e in r.json()["errors"]]


def test_only_admins_touch_windows(gw, pool_row):
    user = gw.headers()
    assert gw.client.post(f"/v1/admin/pools/{POOL}/windows", headers=user,
                          json={"start": at(1), "end": at(2), "reason": "x"}).status_code == 403
    assert gw.client.get(f"/v1/admin/pools/{POOL}/windows", headers=user).status_code == 403
    assert count(gw) == 0
