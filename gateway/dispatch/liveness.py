"""Which dispatch workers are alive: a Postgres session lock each, held while the process lives.

A claim (``dispatching``) carries a lease: a worker that dies mid-claim leaves its jobs to the
others when the lease ends (``dispatch_lease_s``, 120 s by default). That is the backstop. The
faster path (issue #47, item 6): each dispatcher holds a session-level advisory lock, keyed by
a random number of its own, on a connection of its own, and writes that key on the jobs it
claims (``job.claim_owner``). Postgres ends a session's locks with its connection, so a worker
killed with -9, or cut off from the database, drops out of ``pg_locks`` within the server's
notice of the broken connection. Another worker sees the claim's owner missing there; once it
has been missing for ``dispatch_owner_grace_s`` (a worker whose lock connection broke while it
lives, e.g. through a database restart, locks again within a second or two), its claims are
taken over: re-driven idempotently, and a cancel waiting behind them is carried out.

SQLite (one process by design) has no session locks across processes: no key is written and
the lease alone decides, as before.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterable

from sqlalchemy import create_engine, select, text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from gateway.domain.states import JobState
from gateway.models.jobs import Job

log = logging.getLogger("isthmus.dispatch")

# The advisory lock space of dispatch workers: pg_advisory_lock(LOCK_SPACE, key) shows in
# pg_locks as classid = LOCK_SPACE, objid = key, objsubid = 2.
LOCK_SPACE = 0x15714
_LIVE_KEYS = text("SELECT objid::bigint FROM pg_locks WHERE locktype = 'advisory' AND classid = :space "
                  "AND objsubid = 2 AND granted")


class Liveness:
    """This dispatcher's key and lock, and what it knows of the others' (see the module's doc).

    ``key`` is None until :meth:`start` has taken the lock (and always on SQLite): claims made
    meanwhile carry no owner, and only their lease frees them.
    """

    def __init__(self, engine: Engine | None, *, grace_s: float, check_s: float = 1.0,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.engine = engine if engine is not None and engine.dialect.name == "postgresql" else None
        self._own: Engine | None = None  # the lock's connection, outside the sessions' pool
        self.grace_s = grace_s
        self.check_s = check_s
        self._monotonic = monotonic
        self.key: int | None = None
        self._wanted = secrets.randbelow(2**31 - 1) + 1
        self._conn: Connection | None = None
        self._missing_since: dict[int, float] = {}
        self._mutex = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- this worker's own lock ---------------------------------------------------------

    def start(self) -> None:
        """Take the lock now if the database answers, and keep it (re-taken after a broken connection)."""
        if self.engine is None or self._thread is not None:
            return
        self._stop.clear()
        self._ensure()
        self._thread = threading.Thread(target=self._keep, name="isthmus-liveness", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Let go of the lock (a clean stop: the claims still held are freed by their lease or
        by another worker once this one is gone)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None
        self._close()
        if self._own is not None:
            self._own.dispose()
            self._own = None

    def _keep(self) -> None:
        while not self._stop.wait(self.check_s):
            self._ensure()

    def _ensure(self) -> None:
        """Hold the lock: check the connection, or connect and lock again."""
        try:
            if self._conn is not None:
                self._conn.execute(text("SELECT 1"))
                return
        except Exception:  # noqa: BLE001 - a broken connection: its lock is gone with it
            log.warning("dispatch worker %s lost its liveness lock's connection; taking the lock again", self.key)
            self._close()
        try:
            if self._own is None:
                self._own = create_engine(self.engine.url, poolclass=NullPool)
            conn = self._own.connect()
            got = conn.execute(text("SELECT pg_try_advisory_lock(:space, :key)"),
                               {"space": LOCK_SPACE, "key": self._wanted}).scalar()
            conn.commit()  # a session lock outlives the transaction; no transaction is left open
            if not got:  # another live process drew the same key (1 in 2**31): draw another
                conn.close()
                self._wanted = secrets.randbelow(2**31 - 1) + 1
                return
            self._conn, self.key = conn, self._wanted
        except Exception as exc:  # noqa: BLE001 - the database is down: the next check tries again
            log.info("dispatch worker liveness lock not taken yet (%s)", type(exc).__name__)

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # noqa: BLE001
                conn.invalidate()

    # --- the others ---------------------------------------------------------------------

    def dead(self, connection: Connection, owners: Iterable[int]) -> set[int]:
        """Which of ``owners`` (claim owners' keys) have held no lock for ``grace_s``: dead.

        This worker's own key is never dead to itself. Read through the caller's connection
        (one small query over ``pg_locks``); remembered across calls for the grace period.
        """
        owners = {o for o in owners if o is not None and o != self.key}
        if self.engine is None or not owners:
            return set()
        live = set(connection.execute(_LIVE_KEYS, {"space": LOCK_SPACE}).scalars())
        now = self._monotonic()
        with self._mutex:
            for owner in live & self._missing_since.keys():
                del self._missing_since[owner]
            if len(self._missing_since) > 10_000:  # owners whose claims are long gone
                self._missing_since.clear()
            dead = set()
            for owner in owners - live:
                since = self._missing_since.setdefault(owner, now)
                if now - since >= self.grace_s:
                    dead.add(owner)
            return dead


def dead_owners(session: Session, liveness: Liveness, states: Iterable[JobState]) -> set[int]:
    """The owners of claims in ``states`` not yet submitted whose worker is dead (see Liveness.dead)."""
    if liveness.engine is None:
        return set()
    owners = session.scalars(select(Job.claim_owner).distinct().where(
        Job.state.in_([st.value for st in states]), Job.backend_job_id.is_(None), Job.claim_owner.is_not(None)))
    return liveness.dead(session.connection(), owners)
