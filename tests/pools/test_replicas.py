"""Two gateways on one database agree (issue #47, item 2).

Two replicas of the gateway (two apps, each with its own dispatcher, pool catalogue and caches)
on one fresh Postgres database, configured with two of the stack's Slurm clusters (``slurm-22``
and ``slurm-24`` of ``.stack/pools.yaml``). A change made through one replica is honoured by the
other without a call between them:

- a drained pool gets nothing new from the other's dispatcher from its very next round (a round
  reads each pool's row fresh from the database: gateway/dispatch/claim.py ``views(fresh=True)``);
- the other's ``GET /v1/pools`` (its capacity snapshot, kept for ``capacity_ttl_s``: 300 s here)
  shows the change within ``BOUND_S``: the change is signalled through the database
  (gateway/kit/signals.py, Postgres LISTEN/NOTIFY), not waited out;
- an advance reservation made or deleted through an API replica is made or deleted in Slurm
  (22.05, ``scontrol``) within ``BOUND_S`` by the other replica's dispatcher, and by an
  ``isthmus worker`` process;
- a listener whose connection is cut (``pg_terminate_backend``) connects again and re-reads
  what it may have missed, within ``BOUND_S``.

docs/architecture.md "Replicas". A piece of process-local state that a decision depends on
would make the replicas disagree here. Skips without the stack; fails with ISTHMUS_REQUIRE_STACK=1.
"""

from __future__ import annotations

import contextlib
import time
from datetime import UTC, datetime, timedelta

import pytest
import yaml
from sqlalchemy import text

from adapters.base import GATEWAY_RESERVATION_PREFIX
from adapters.slurm import parse
from tests.backends.slurm.test_reservations import scontrol
from tests.conftest import REPO, missing_system, postgres_database
from tests.dispatch.conftest import (
    KWOK_RUN_FOR,
    drive_until,
    job_state,
    slurm_env,
    wired_gateway,
)
from tests.dispatch.test_holds_real import slurm_record

pytestmark = [pytest.mark.slurm("22.05", "24.11"), pytest.mark.postgres]

POOLS_FILE = REPO / ".stack" / "pools.yaml"
TWO = ("slurm-22", "slurm-24")
TTL_S = 300  # the capacity snapshots' age bound: far longer than any wait here
BOUND_S = 2.0  # a change through one replica is honoured by the other within this


def two_pools(tmp_path_factory, **slurm_22) -> str:
    """The stack's two pools as a pools file; ``slurm_22``: settings added to slurm-22's."""
    if not POOLS_FILE.is_file():
        missing_system(f"{POOLS_FILE} missing: the test stack is not up (stack/up.sh writes it)")
    pools = [p for p in yaml.safe_load(POOLS_FILE.read_text())["pools"] if p["name"] in TWO]
    if tuple(p["name"] for p in pools) != TWO:
        missing_system(f"{POOLS_FILE} does not list {TWO}")
    pools[0]["settings"].update(slurm_22)
    path = tmp_path_factory.mktemp("replicas") / "pools.yaml"
    path.write_text(yaml.safe_dump({"pools": pools}))
    return str(path)


@pytest.fixture(scope="module")
def pools_file(tmp_path_factory):
    return two_pools(tmp_path_factory)


@pytest.fixture(scope="module")
def pools_file_with_accounts(tmp_path_factory):
    """slurm-22 submits with the gateway account as the Slurm account: it can hold a Slurm reservation."""
    return two_pools(tmp_path_factory, account_map="same")


def pool_states(gw) -> dict[str, str]:
    return {p["name"]: p["state"] for p in gw.client.get("/v1/pools", headers=gw.headers()).json()["items"]}


def listening(*gws) -> None:
    for gw in gws:
        assert gw.app.state.signals.connected.wait(10), "the replica's listener did not connect"


def within(bound_s: float, predicate, what: str) -> float:
    """Seconds until ``predicate()`` holds, polled every 50 ms; fails after ``bound_s``."""
    start = time.monotonic()
    while not predicate():
        if time.monotonic() - start > bound_s:
            raise AssertionError(f"{what}: not within {bound_s} s")
        time.sleep(0.05)
    took = time.monotonic() - start
    print(f"{what}: {took:.3f} s")  # the figures docs/architecture.md quotes (pytest -s)
    return took


def test_a_pool_drained_through_one_replica_is_honoured_by_the_other(pools_file, dev_key_path):
    with postgres_database(migrated=True) as url, \
            wired_gateway(url, dev_key_path, {}, pools_file=pools_file, capacity_ttl_s=TTL_S) as a, \
            wired_gateway(url, dev_key_path, {}, fresh=False, pools_file=pools_file, capacity_ttl_s=TTL_S) as b:
        admin = a.headers("root", admin=True)
        listening(a, b)
        assert pool_states(a) == pool_states(b) == {"slurm-22": "active", "slurm-24": "active"}
        try:
            r = a.client.patch("/v1/admin/pools/slurm-24", json={"state": "draining"}, headers=admin)
            assert r.status_code == 200 and r.json()["state"] == "draining", r.text
            # A's snapshot was refreshed by the change it served (same process) ...
            assert pool_states(a)["slurm-24"] == "draining"
            # ... and B's own listing (its snapshot, 300 s fresh) by the signal, before any round of B's.
            within(BOUND_S, lambda: pool_states(b)["slurm-24"] == "draining", "drain through A seen by B")

            # B's next round: nothing new goes to slurm-24, and a job pinned there waits with the reason.
            anywhere = b.client.post("/v1/jobs", json={
                "name": "replica", "account": "team-a", "workers": 1, "gpus_per_worker": 8, "time_limit": "2m",
                "command": ["sleep", "1"], "pool_kind": "slurm", "labels": {KWOK_RUN_FOR: "1s"}}, headers=b.headers())
            pinned = b.client.post("/v1/jobs", json={
                "name": "replica", "account": "team-a", "workers": 1, "gpus_per_worker": 8, "time_limit": "2m",
                "command": ["sleep", "1"], "pool": "slurm-24"}, headers=b.headers())
            assert anywhere.status_code == pinned.status_code == 202, (anywhere.text, pinned.text)
            routed = drive_until(b, lambda: job_state(b, anywhere.json()["id"], "queued", "running", "succeeded",
                                                      "failed"), timeout_s=60)
            assert routed["assigned_pool"] == "slurm-22", routed
            assert "slurm-24: draining" in routed["routing_reason"], routed["routing_reason"]
            held = job_state(b, pinned.json()["id"], "pending")
            assert held and held["assigned_pool"] is None and "draining" in held["state_reason"], held

            # Back in service through B: A's listing says so within the bound, and A's next round
            # may send the pinned job there.
            r = b.client.patch("/v1/admin/pools/slurm-24", json={"state": "active"}, headers=admin)
            assert r.status_code == 200, r.text
            within(BOUND_S, lambda: pool_states(a)["slurm-24"] == "active", "enable through B seen by A")
            moved = drive_until(a, lambda: job_state(a, pinned.json()["id"], "queued", "running", "succeeded",
                                                     "failed"), timeout_s=60)
            assert moved["assigned_pool"] == "slurm-24", moved
        finally:
            a.client.patch("/v1/admin/pools/slurm-24", json={"state": "active"}, headers=admin)
            for gw, job in ((b, anywhere), (a, pinned)):
                with contextlib.suppress(Exception):
                    gw.client.post(f"/v1/jobs/{job.json()['id']}/cancel", headers=gw.headers())


def slurm_reservations(env) -> set[str]:
    proc = scontrol(env, "--oneliner", "show", "reservation")
    return {x["name"] for x in parse.reservation_text(proc.stdout)}


def test_a_reservation_made_through_an_api_replica_is_made_in_slurm_by_the_dispatching_one(
        pools_file_with_accounts, dev_key_path, monkeypatch):
    """A serves the API only: its own sync in the request is switched off, so only the signal
    can reach a dispatcher. B runs its dispatcher (``dispatch_in_serve``) and syncs native
    reservations every hour on its own: within the bound, only the signal can have done it."""
    env = slurm_env("22.05")
    files = {"pools_file": pools_file_with_accounts, "capacity_ttl_s": TTL_S}
    with postgres_database(migrated=True) as url, \
            wired_gateway(url, dev_key_path, {}, **files) as a, \
            wired_gateway(url, dev_key_path, {}, fresh=False, dispatch_in_serve=True, **files) as b:
        monkeypatch.setattr(a.app.state.dispatcher.native_reservations, "sync", lambda **_: 0)
        native = b.app.state.dispatcher.native_reservations
        monkeypatch.setattr(native, "INTERVAL_S", 3600.0)
        synced: list[tuple[tuple[str, ...] | None, int]] = []  # (pools asked, backend changes) per sync
        real_sync = native.sync

        def spy(*, pools=None):
            changed = real_sync(pools=pools)
            synced.append((tuple(sorted(pools)) if pools is not None else None, changed))
            return changed

        monkeypatch.setattr(native, "sync", spy)
        listening(a, b)
        admin = a.headers("root", admin=True)
        now = datetime.now(UTC)
        r = a.client.post("/v1/admin/reservations", headers=admin, json={
            "account": "team-a", "pool": "slurm-22", "nodes": 1, "start": (now - timedelta(minutes=1)).isoformat(),
            "end": (now + timedelta(minutes=20)).isoformat(), "reason": "replicas agree"})
        assert r.status_code == 201, r.text
        held = r.json()
        name = f"{GATEWAY_RESERVATION_PREFIX}{held['id']}"
        assert held["native"] is None  # A made nothing in Slurm
        try:
            within(BOUND_S, lambda: name in slurm_reservations(env), "reservation through A made in Slurm by B")
            assert (("slurm-22",), 1) in synced, synced  # by the signal's sync of that pool
            rec = slurm_record(env, "reservation", name)
            assert rec["Accounts"] == "team-a" and rec["NodeCnt"] == "1", rec
            within(BOUND_S, lambda: [h["native"] for h in a.client.get("/v1/admin/reservations", headers=admin)
                                     .json() if h["id"] == held["id"]] == [name], "B's note on the row")
        finally:
            gone = a.client.delete(f"/v1/admin/reservations/{held['id']}", headers=admin)
        assert gone.status_code == 204, gone.text
        within(BOUND_S, lambda: name not in slurm_reservations(env), "deletion through A done in Slurm by B")


def test_a_listener_that_lost_its_connection_connects_again_and_re_reads(pools_file, dev_key_path):
    """A change nobody signalled (as one made while the listener was away) is seen once the
    listener has connected again: after every connect it re-reads everything."""
    from gateway.kit.db import transaction

    with postgres_database(migrated=True) as url, \
            wired_gateway(url, dev_key_path, {}, pools_file=pools_file, capacity_ttl_s=TTL_S) as a, \
            wired_gateway(url, dev_key_path, {}, fresh=False, pools_file=pools_file, capacity_ttl_s=TTL_S) as b:
        admin = a.headers("root", admin=True)
        listener = b.app.state.signals
        listening(a, b)
        try:
            assert pool_states(b)["slurm-24"] == "active"
            with transaction(a.app.state.sessionmaker) as s:  # written, not signalled (service.update signals)
                s.execute(text("UPDATE pool SET state = 'disabled' WHERE name = 'slurm-24'"))
            time.sleep(0.5)
            assert pool_states(b)["slurm-24"] == "active"  # B's snapshot: nothing told it

            pid, connects = listener.backend_pid, listener.connects
            with a.app.state.engine.connect() as conn:
                assert conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid}).scalar() is True
            within(BOUND_S, lambda: pool_states(b)["slurm-24"] == "disabled", "re-read after the listener's loss")
            assert listener.connects == connects + 1 and listener.backend_pid not in (None, pid)

            # And it listens again: a signalled change arrives as before.
            r = a.client.patch("/v1/admin/pools/slurm-24", json={"state": "active"}, headers=admin)
            assert r.status_code == 200, r.text
            within(BOUND_S, lambda: pool_states(b)["slurm-24"] == "active", "signal after the reconnect")
        finally:
            a.client.patch("/v1/admin/pools/slurm-24", json={"state": "active"}, headers=admin)


def test_a_reservation_made_through_an_api_replica_is_made_in_slurm_by_an_isthmus_worker(
        pools_file_with_accounts, dev_key_path, monkeypatch, tmp_path):
    """The same through a real ``isthmus worker`` process (gateway/cli.py). It syncs native
    reservations when it starts and then every 15 s on its own: made more than 2 s after its
    start and seen in Slurm within the bound, the reservation was made on the signal."""
    import json
    import os
    import subprocess

    from tests.e2e.conftest import ISTHMUS

    env = slurm_env("22.05")
    with postgres_database(migrated=True) as url, \
            wired_gateway(url, dev_key_path, {}, pools_file=pools_file_with_accounts, capacity_ttl_s=TTL_S) as a:
        monkeypatch.setattr(a.app.state.dispatcher.native_reservations, "sync", lambda **_: 0)
        listening(a)
        log = (tmp_path / "worker.log").open("w")
        worker = subprocess.Popen([ISTHMUS, "worker"], cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env={
            **os.environ, "ISTHMUS_DATABASE_URL": url, "ISTHMUS_POOLS_FILE": pools_file_with_accounts,
            "ISTHMUS_BACKENDS": json.dumps({}), "ISTHMUS_DISPATCH_INTERVAL_S": "0.5", "ISTHMUS_LOG_LEVEL": "info"})
        admin = a.headers("root", admin=True)
        held = None
        try:
            def worker_listens() -> bool:
                assert worker.poll() is None, (tmp_path / "worker.log").read_text()[-3000:]
                with a.app.state.engine.connect() as conn:
                    return bool(conn.execute(text(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND "
                        "application_name = 'isthmus-signals' AND pid <> :mine"),
                        {"mine": a.app.state.signals.backend_pid}).scalar())
            within(60, worker_listens, "isthmus worker listening")
            time.sleep(2.5)  # its start-up syncs are over; its next own one is 15 s away
            now = datetime.now(UTC)
            r = a.client.post("/v1/admin/reservations", headers=admin, json={
                "account": "team-a", "pool": "slurm-22", "nodes": 1,
                "start": (now - timedelta(minutes=1)).isoformat(), "end": (now + timedelta(minutes=20)).isoformat(),
                "reason": "replicas agree: worker"})
            assert r.status_code == 201, r.text
            held = r.json()
            name = f"{GATEWAY_RESERVATION_PREFIX}{held['id']}"
            within(BOUND_S, lambda: name in slurm_reservations(env), "reservation through A made by the worker")
            gone = a.client.delete(f"/v1/admin/reservations/{held['id']}", headers=admin)
            assert gone.status_code == 204, gone.text
            held = None
            within(BOUND_S, lambda: name not in slurm_reservations(env), "deletion through A done by the worker")
        finally:
            if held is not None:
                a.client.delete(f"/v1/admin/reservations/{held['id']}", headers=admin)
            worker.terminate()
            try:
                assert worker.wait(15) == 0, (tmp_path / "worker.log").read_text()[-3000:]
            finally:
                if worker.poll() is None:
                    worker.kill()
                log.close()


def test_two_dispatchers_syncing_one_pool_at_once_make_its_reservation_once_without_a_refusal(
        pools_file_with_accounts, dev_key_path):
    """Every dispatcher syncs a pool whose reservations were signalled, so two may sync it at
    the same instant: they take turns (a Postgres lock per pool, dispatch/holds.py), and the
    second finds Slurm's reservation made instead of being refused a duplicate. The interleaving
    that made the duplicate is forced: each sync, having listed the pool's reservations, waits
    (up to 2 s) for the other to have listed too; with the lock the other cannot list until the
    first is done, so the wait runs out and the two never call Slurm at once."""
    import threading

    from adapters.base import BackendError
    from gateway.audit.service import Who
    from gateway.kit.db import transaction
    from gateway.pools import reservations

    env = slurm_env("22.05")
    files = {"pools_file": pools_file_with_accounts, "capacity_ttl_s": TTL_S}
    with postgres_database(migrated=True) as url, \
            wired_gateway(url, dev_key_path, {}, **files) as a, \
            wired_gateway(url, dev_key_path, {}, fresh=False, **files) as b:
        views = a.app.state.dispatcher.views(fresh=True)
        now = datetime.now(UTC)
        with transaction(a.app.state.sessionmaker) as s:  # the registry's row, made in no backend yet
            held = reservations.create(s, views, account="team-a", pool="slurm-22", gpu_type=None, gpus=None,
                                       nodes=1, starts_at=now - timedelta(minutes=1),
                                       ends_at=now + timedelta(minutes=20), reason="two syncs", by=Who("root"), now=now)
            held_id = held.id
        name = f"{GATEWAY_RESERVATION_PREFIX}{held_id}"
        refusals: list[str] = []
        calls: list[tuple[float, float]] = []  # each reserve call's (start, end), monotonic
        start = threading.Barrier(2)
        listed = threading.Barrier(2, timeout=2)

        def sync(gw) -> None:
            native = gw.app.state.dispatcher.native_reservations
            backend = native.backends["slurm-22"]
            real = backend.reserve

            def reserve(request):
                began = time.monotonic()
                try:
                    return real(request)
                except BackendError as exc:
                    refusals.append(exc.message)
                    raise
                finally:
                    calls.append((began, time.monotonic()))

            backend.reserve = reserve
            real_list = backend.gateway_reservations

            def gateway_reservations():
                made = real_list()
                with contextlib.suppress(threading.BrokenBarrierError):
                    listed.wait()
                return made

            backend.gateway_reservations = gateway_reservations
            start.wait(10)
            native.sync(pools={"slurm-22": backend})

        threads = [threading.Thread(target=sync, args=(gw,)) for gw in (a, b)]
        try:
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            assert refusals == []
            (first, second) = sorted(calls)
            assert first[1] <= second[0], f"the two syncs called Slurm at once: {calls}"
            assert name in slurm_reservations(env)
            [row] = [h for h in a.client.get("/v1/admin/reservations", headers=a.headers("root", admin=True)).json()
                     if h["id"] == held_id]
            assert row["native"] == name and "refused" not in row["native_note"], row
        finally:
            with contextlib.suppress(Exception):
                scontrol(env, "delete", f"ReservationName={name}")
