"""Database engine, declarative base and the per-request transaction.

The request dependency owns the transaction: it commits when the route returns and rolls
back on any exception. Services and repositories only ``flush()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import select
import weakref
from collections.abc import Callable, Iterator
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Request
from sqlalchemy import BigInteger, Integer, MetaData, create_engine, event
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# SQLite only auto-increments INTEGER PRIMARY KEY; Postgres gets a real bigint.
BigIntPK = BigInteger().with_variant(Integer(), "sqlite")


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


def make_engine(url: str, *, pool_size: int = 10) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record):  # pragma: no cover - exercised on sqlite
            # Let pysqlite's own BEGIN handling be replaced by ours so that
            # "BEGIN IMMEDIATE" serialises writers instead of failing late.
            dbapi_conn.isolation_level = None
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()

        @event.listens_for(engine, "begin")
        def _sqlite_begin(conn):  # pragma: no cover - exercised on sqlite
            conn.exec_driver_sql("BEGIN IMMEDIATE")

        return engine
    engine = create_engine(url, pool_size=pool_size, max_overflow=pool_size, pool_recycle=1800)
    event.listen(engine, "checkout", _drop_dead_connection)
    return engine


def _drop_dead_connection(dbapi_conn, _record, _proxy) -> None:
    """A pre-ping without a round trip: is this idle pooled connection still alive?

    An idle connection has nothing to read. When Postgres restarts or ends a session it
    sends an error and closes the socket, so the socket turns readable (or psycopg already
    knows it is closed): the pool then reconnects before handing it out. This replaces
    SQLAlchemy's ``pool_pre_ping``, whose ``SELECT 1`` was one round trip in six of every
    submission (bench/bench_api.py). A connection that dies silently mid-use still fails
    its statement and SQLAlchemy invalidates the pool, as it would with pre-ping.
    """
    # The async engine's pool hands out SQLAlchemy's adapter; the psycopg connection is inside.
    dbapi_conn = getattr(dbapi_conn, "driver_connection", dbapi_conn)
    if getattr(dbapi_conn, "closed", False) or getattr(dbapi_conn, "broken", False):
        raise DisconnectionError("connection closed")
    poller = select.poll()
    poller.register(dbapi_conn.fileno(), select.POLLIN | select.POLLERR | select.POLLHUP)
    if poller.poll(0):
        raise DisconnectionError("the server closed or wrote to an idle connection")


# SQLSTATEs that say the server cannot be reached or is going away, not that a statement is
# wrong: connection exceptions (08...), admin / crash shutdown, cannot connect now (57P01-03),
# too many connections (53300). A serialisation failure, a lock timeout or a cancelled query
# is an OperationalError too, but the server is there: not an outage.
_OUTAGE_SQLSTATES = ("08", "57P01", "57P02", "57P03", "53300")


def database_unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` means the database cannot be reached now (refused, terminated, shut down,
    no pooled connection to be had), so that the same request may succeed once it is back.

    The one classification of an outage (issue #47): SQLAlchemy's errors (a pool timeout, a
    connection it found dead, or a DB-API error it wraps) and psycopg's own (raised bare by
    ``CompiledRead``). A constraint violation or a programming error is not an outage; nor is
    anything SQLite says (a locked file waits out its busy timeout, then is an error).
    """
    from sqlalchemy import exc as sa_exc

    for err in (exc, exc.__cause__):
        if err is None:
            continue
        if isinstance(err, sa_exc.TimeoutError):  # the pool's: every connection busy or none opens
            return True
        if isinstance(err, sa_exc.DBAPIError):
            if err.connection_invalidated:
                return True
            err = err.orig
        if _psycopg_outage(err):
            return True
    return False


def _psycopg_outage(err: BaseException | None) -> bool:
    try:
        import psycopg
    except ImportError:  # pragma: no cover - SQLite-only installs
        return False
    if isinstance(err, psycopg.InterfaceError):  # "the connection is closed"
        return True
    if not isinstance(err, psycopg.OperationalError):
        return False
    state = getattr(err, "sqlstate", None)
    # No SQLSTATE: the client's own failure (refused, server closed the connection, timeout).
    return state is None or state.startswith(_OUTAGE_SQLSTATES)


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False, autoflush=True)


@contextlib.contextmanager
def transaction(factory: sessionmaker[Session]) -> Iterator[Session]:
    """One unit of work outside a request (workers, CLI): commit or roll back."""
    session = factory()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


T = TypeVar("T")


def make_async_engine(url: str, *, pool_size: int = 10):
    """The engine of the routes that run their transaction on the event loop (issue #32), or
    None where the driver has no async form (SQLite: those routes use the thread pool).

    Postgres through psycopg's async connection: SQLAlchemy runs the same synchronous ORM
    code in a greenlet and awaits each round trip, so a request costs no thread-pool hop.
    A second pool beside the sync engine's, with the same size and the same liveness check."""
    if not url.startswith("postgresql+psycopg"):
        return None
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine(url, pool_size=pool_size, max_overflow=pool_size, pool_recycle=1800)
    event.listen(engine.sync_engine, "checkout", _drop_dead_connection)
    return engine


def make_async_sessionmaker(engine):
    from sqlalchemy.ext.asyncio import async_sessionmaker

    return async_sessionmaker(engine, expire_on_commit=False, autoflush=True)


@dataclasses.dataclass(frozen=True)
class Databases:
    """A process's sessions, made once from its engines where the app is built (gateway/app.py)
    and handed to the request helpers below: writes, reads (``make_read_sessionmaker``), and
    async writes where the driver has them (``make_async_sessionmaker``; None on SQLite)."""

    sessions: sessionmaker[Session]
    read_sessions: sessionmaker[Session]
    async_sessions: Any = None


async def in_transaction(db: Databases, work: Callable[[Session], T]) -> T:
    """``work(session)`` in one transaction, committed before this returns, rolled back on any
    exception; the same synchronous code as ``transaction``.

    With an async engine (``db.async_sessions``) the work runs on the event loop in a
    greenlet and every statement is awaited: no thread-pool hop, and a slow query holds no
    thread. Without one (SQLite) it runs in the thread pool. ``work`` must not block on
    anything but the session: look-ups that may block (NSS) happen before, in the pool."""
    factory = db.async_sessions
    if factory is None:
        from starlette.concurrency import run_in_threadpool

        return await run_in_threadpool(_in_sync_transaction, db.sessions, work)
    async with factory() as session:
        try:
            result = await session.run_sync(work)
            await session.commit()
        except BaseException:
            await session.rollback()
            raise
    return result


def make_read_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    """Sessions for work that only reads (a list, one job, a dashboard page).

    On Postgres they run in autocommit: each SELECT is sent alone, with no BEGIN and COMMIT
    round trips around it (two of a list's three, issue #46). Under the default READ COMMITTED
    every statement reads its own snapshot whether or not a transaction holds it, so a read
    sees exactly what it saw inside one. The same engine and pool as ``make_sessionmaker``'s
    (its listeners too). Elsewhere (SQLite): ordinary sessions. Never for work that writes:
    each flush would commit on its own."""
    if engine.dialect.name != "postgresql":
        return make_sessionmaker(engine)
    return sessionmaker(engine.execution_options(isolation_level="AUTOCOMMIT"), expire_on_commit=False,
                        autoflush=False)


@contextlib.contextmanager
def reading(db: Databases) -> Iterator[Session]:
    """A session for work that only reads, where the caller holds it (the dashboard's pages):
    the read sessions (``make_read_sessionmaker``)."""
    with transaction(db.read_sessions) as session:
        yield session


async def in_read(db: Databases, work: Callable[[Session], T]) -> T:
    """``work(session)``, which only reads, in a read session (``make_read_sessionmaker``), run
    in the thread pool in one hop (``in_read_thread``): a sync route with the session dependency
    took four (the dependency's enter and exit, the route, the check of its answer; issue #46)."""
    return await in_read_thread(_in_sync_transaction, db.read_sessions, work)


# Threads that run reads at once, per event loop (a worker process). A read is mostly Python
# holding the GIL: with the thread pool's default of 40, 16 concurrent reads in a worker cost
# 20-40% more CPU each than 4 did (threads handing the GIL to each other: bench/bench_read_cpu.py
# at 4 to 64 clients, issue #46); a few threads still overlap one read's round trips with
# another's Python. Writes and every other sync route keep the default pool.
READ_THREADS = 4
_READ_LIMITERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


async def in_read_thread(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)``, blocking work that only reads, in the thread pool, at most ``READ_THREADS``
    of them at once in this event loop (the rest wait their turn)."""
    import anyio.to_thread

    loop = asyncio.get_running_loop()
    limiter = _READ_LIMITERS.get(loop)
    if limiter is None:
        limiter = _READ_LIMITERS[loop] = anyio.CapacityLimiter(READ_THREADS)
    return await anyio.to_thread.run_sync(fn, *args, limiter=limiter)


def _in_sync_transaction(factory: sessionmaker[Session], work: Callable[[Session], T]) -> T:
    with transaction(factory) as session:
        return work(session)


def get_session(request: Request) -> Iterator[Session]:
    """FastAPI dependency: one transaction per request. Use it through ``DbSession``."""
    with transaction(request.app.state.sessionmaker) as session:
        yield session


# scope="function": the transaction commits when the route returns, BEFORE the response
# is sent. (The default scope exits after sending, so a client could be told "202" for a
# commit that then fails, or read its own write before it is committed.)
DbSession = Annotated[Session, Depends(get_session, scope="function")]


class CompiledRead:
    """A read statement built and compiled once, then sent as its SQL text (issue #46).

    SQLAlchemy builds, keys and looks up a statement on every execution, and wraps each row;
    for a read sent hundreds of times a second that was a third of its CPU. Where nothing in
    the statement needs SQLAlchemy's processing on the way in or out (every value is the
    driver's own: Postgres through psycopg, where timestamps, integers, booleans and text come
    back as SQLAlchemy would hand them), the compiled text is sent on the pooled connection
    as it is, without a transaction (autocommit: one statement, its own snapshot, as
    ``make_read_sessionmaker``'s sessions read). Elsewhere (SQLite, or a column whose values
    SQLAlchemy converts) the same statement object runs through the session: built once all
    the same. Rows are named tuples with the statement's column names."""

    __slots__ = ("fixed", "row", "sql", "statement")

    def __init__(self, statement, engine: Engine | None):
        from collections import namedtuple

        self.statement = statement
        self.row = namedtuple("Row", [c.key for c in statement.selected_columns], rename=True)
        self.sql, self.fixed = None, {}
        if engine is None or engine.dialect.name != "postgresql" or engine.dialect.driver != "psycopg":
            return
        compiled = statement.compile(dialect=engine.dialect, compile_kwargs={"render_postcompile": True})
        if compiled._bind_processors or compiled.positional:
            return
        for *_names, type_ in compiled._result_columns:
            if type_._cached_result_processor(engine.dialect, None) is not None:
                return
        self.sql, self.fixed = compiled.string, compiled.construct_params(_check=False)

    def rows(self, session: Session, params: dict[str, Any]) -> list:
        """The rows for ``params`` (the statement's bind parameters by name), as named tuples."""
        return list(map(self.row._make, self.tuples(session, params)))

    def tuples(self, session: Session, params: dict[str, Any]) -> list[tuple]:
        """The rows as plain tuples in the statement's column order. ``session``: a read session
        (``make_read_sessionmaker``); one that already holds a connection (a transaction)
        sends the statement on it instead."""
        if self.sql is None or session.in_transaction():
            return [tuple(r) for r in session.execute(self.statement, params)]
        fairy = session.get_bind().raw_connection()
        try:
            conn = fairy.driver_connection
            conn.autocommit = True  # a read alone: no BEGIN / COMMIT around it
            rows = conn.execute(self.sql, {**self.fixed, **params}).fetchall()
            conn.autocommit = False  # the pool's connections are the write sessions' too
        except BaseException:
            fairy.invalidate()  # in a state not known: the pool opens a new one
            raise
        finally:
            fairy.close()
        return rows


_READS: dict[Any, CompiledRead] = {}
_READS_KEPT = 1024  # a few KB each: shapes are few, a principal's accounts make the rest


def compiled_read(session: Session, key: Any, build: Callable[[], Any]) -> CompiledRead:
    """The ``CompiledRead`` of ``build()``, made once per dialect and ``key`` (the shape of the
    statement: which filters it has, whose accounts) and kept; ``key`` must name everything
    ``build`` puts in the statement other than its bind parameters."""
    dialect = session.get_bind().dialect
    full = (dialect.name, dialect.driver, key)
    read = _READS.get(full)
    if read is None:
        if len(_READS) >= _READS_KEPT:
            _READS.clear()  # shapes are few; a flood of distinct account sets starts over
        read = _READS[full] = CompiledRead(build(), session.get_bind())
    return read
