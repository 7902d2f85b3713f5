"""kit/db.py::database_unavailable: the one rule for "the database cannot be reached now" (#47, 6).

What it says decides between a 503 with Retry-After (retry: nothing is wrong with the request)
and the 500 of a bug; tests/recovery/test_database_outage.py shows it on a real outage.
"""

from __future__ import annotations

import sqlite3

import psycopg
import psycopg.errors as pg
import pytest
from sqlalchemy import exc as sa

from gateway.kit.db import database_unavailable


def wrapped(orig: Exception, cls=sa.OperationalError, **kw) -> sa.DBAPIError:
    return cls("SELECT 1", {}, orig, **kw)


@pytest.mark.parametrize("error", [
    pytest.param(wrapped(psycopg.OperationalError("connection refused")), id="refused"),
    pytest.param(wrapped(pg.AdminShutdown("terminating connection due to administrator command")),
                 id="admin-shutdown"),
    pytest.param(wrapped(pg.CrashShutdown("crash")), id="crash-shutdown"),
    pytest.param(wrapped(pg.CannotConnectNow("the database system is starting up")), id="starting-up"),
    pytest.param(wrapped(pg.ConnectionFailure("lost")), id="connection-failure"),
    pytest.param(wrapped(pg.TooManyConnections("too many clients")), id="too-many-connections"),
    pytest.param(wrapped(psycopg.InterfaceError("the connection is closed"), sa.InterfaceError),
                 id="interface-closed"),
    pytest.param(wrapped(Exception("gone"), sa.DBAPIError, connection_invalidated=True), id="invalidated"),
    pytest.param(sa.TimeoutError("QueuePool limit of size 10 overflow 10 reached"), id="pool-timeout"),
    pytest.param(psycopg.OperationalError("server closed the connection unexpectedly"), id="bare-psycopg"),
    pytest.param(pg.AdminShutdown("terminating"), id="bare-admin-shutdown"),
])
def test_an_unreachable_database_is_an_outage(error):
    assert database_unavailable(error)


@pytest.mark.parametrize("error", [
    pytest.param(wrapped(pg.UniqueViolation("duplicate key"), sa.IntegrityError), id="unique-violation"),
    pytest.param(wrapped(pg.UndefinedTable("no such table"), sa.ProgrammingError), id="undefined-table"),
    pytest.param(wrapped(pg.SerializationFailure("could not serialize")), id="serialization-failure"),
    pytest.param(wrapped(pg.DeadlockDetected("deadlock")), id="deadlock"),
    pytest.param(wrapped(pg.LockNotAvailable("lock timeout")), id="lock-timeout"),
    pytest.param(wrapped(pg.QueryCanceled("statement timeout")), id="query-cancelled"),
    pytest.param(wrapped(sqlite3.OperationalError("database is locked")), id="sqlite-locked"),
    pytest.param(ValueError("a bug"), id="a-bug"),
])
def test_anything_else_is_not(error):
    assert not database_unavailable(error)


def test_an_outage_raised_from_another_error_is_still_one():
    try:
        try:
            raise wrapped(pg.AdminShutdown("terminating"))
        except sa.OperationalError as exc:
            raise RuntimeError("the round failed") from exc
    except RuntimeError as exc:
        assert database_unavailable(exc)
