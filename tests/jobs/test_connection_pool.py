"""The pool's liveness check: connections the server closed are replaced before use.

The gateway does not spend a ``SELECT 1`` round trip per checkout (pool_pre_ping); it checks
the idle socket instead (gateway/kit/db.py). These tests kill the server side of every
pooled connection and expect the next requests to succeed, as a user would after a
Postgres restart or a failover. (tests/dispatch/test_faults.py restarts Postgres itself.)
"""

from __future__ import annotations

import concurrent.futures

from sqlalchemy import text

from tests.jobs.test_api import SPEC, count, submit


def _terminate_pooled_backends(gw) -> int:
    """End, from another session, every server process serving this app's pool."""
    engine = gw.app.state.engine
    with engine.connect() as conn:  # also fills one pool slot
        mine = conn.execute(text("SELECT pg_backend_pid()")).scalar()
        db = conn.execute(text("SELECT current_database()")).scalar()
    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool

    killer = create_engine(engine.url.render_as_string(hide_password=False), poolclass=NullPool)
    try:
        with killer.connect() as k:
            pids = k.execute(text("SELECT pid FROM pg_stat_activity WHERE datname = :db AND pid <> pg_backend_pid() "
                                  "AND backend_type = 'client backend'"), {"db": db}).scalars().all()
            assert mine in pids
            for pid in pids:
                k.execute(text("SELECT pg_terminate_backend(:pid, 5000)"), {"pid": pid})
    finally:
        killer.dispose()
    return len(pids)


def test_requests_after_the_server_ended_every_pooled_connection_succeed(gw, database_url):
    if not database_url.startswith("postgresql"):
        return  # SQLite has no server to lose; this case is Postgres-only
    # Fill the pool with several connections by running requests concurrently.
    with concurrent.futures.ThreadPoolExecutor(6) as ex:
        assert all(r.status_code == 202 for r in ex.map(lambda _: submit(gw), range(12)))
    killed = _terminate_pooled_backends(gw)
    assert killed >= 1
    codes = [submit(gw).status_code for _ in range(killed + 3)]
    assert codes == [202] * len(codes)
    assert gw.client.get("/readyz").status_code == 200
    assert count(gw) == 12 + len(codes)


def test_an_unknown_account_is_refused_by_the_foreign_key_and_writes_nothing(gw):
    """The submission path no longer reads the account first; the insert's foreign key refuses it."""
    r = submit(gw, {**SPEC, "account": "team-nope"}, groups=("team-nope",))
    assert r.status_code == 422
    assert r.headers["content-type"].startswith("application/problem+json")
    assert [e["field"] for e in r.json()["errors"]] == ["body.account"]
    assert count(gw) == 0
    from gateway.models.jobs import JobEvent

    assert count(gw, JobEvent) == 0
    # The transaction was rolled back cleanly: the next submission works.
    assert submit(gw).status_code == 202
