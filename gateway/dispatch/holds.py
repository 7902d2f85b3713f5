"""The backends' own reservations of the gateway's advance reservations (docs/planning.md).

The gateway holds every advance reservation in its own planner. Where the pool's backend can
hold capacity for an account too (Slurm: a reservation with ``Accounts=``), the gateway also
makes one there, named ``isthmus-hold-<reservation id>``, and the gangs it starts in the hold
name it (``--reservation``): Slurm itself then keeps everybody else's jobs off those nodes.

The registry is the truth and this part makes each backend agree with it, idempotently:

* a reservation that has not ended and that its backend does not have is made (again);
* a backend reservation of the gateway's (the prefix) that the registry no longer has, or
  has ended, is deleted;
* what became of each is kept on the row (``native``: the name once made; ``native_note``:
  in words, shown to admins), so a refusal is visible, and retried at the next sync.

The admin API syncs a reservation as it is created or deleted (its answer shows the
outcome); the dispatch loop syncs every ``INTERVAL_S`` (a crash between the two, a backend
that was down, a reservation deleted by hand in the backend).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime

from sqlalchemy import select, text, update
from sqlalchemy.orm import Session, sessionmaker

from adapters.base import (
    GATEWAY_RESERVATION_PREFIX,
    Backend,
    BackendError,
    Feature,
    ReservationRequest,
    Unsupported,
    features_of,
)
from gateway.dispatch.common import log
from gateway.domain.routing import PoolView
from gateway.domain.windows import hold_need
from gateway.kit.db import transaction
from gateway.kit.timeutil import as_utc
from gateway.models.pools import AdvanceReservation

NOTE_MAX = 500
# pg_advisory_lock(POOL_SYNC_LOCK_SPACE, hashtext(pool)): one process syncs a pool at a time.
POOL_SYNC_LOCK_SPACE = 0x15715


def native_name(reservation_id: str) -> str:
    """The backend's name of an advance reservation: the prefix and the gateway's id."""
    return GATEWAY_RESERVATION_PREFIX + reservation_id


class NativeReservations:
    """Makes and deletes the backends' own reservations so that they match the registry's."""

    INTERVAL_S = 15.0

    def __init__(self, *, sessions: sessionmaker[Session], backends: Mapping[str, Backend],
                 views: Callable[[], Mapping[str, PoolView]], clock: Callable[[], datetime]) -> None:
        self.sessions = sessions
        self.backends = backends
        self.views = views
        self.clock = clock
        self._last: float | None = None
        self._lock = threading.Lock()  # the API's sync and the loop's never run together

    def due(self) -> bool:
        return self._last is None or time.monotonic() - self._last >= self.INTERVAL_S

    def sync(self, *, pools: Mapping[str, Backend] | None = None) -> int:
        """One pass over ``pools`` (default: every backend). Returns the backend calls that
        changed something (made or deleted). Never raises for a backend's failure: it is
        noted on the reservation and tried again at the next pass."""
        with self._lock:
            self._last = time.monotonic()
            now = self.clock()
            with transaction(self.sessions) as s:
                rows = [(r.id, r.pool, r.account, r.gpus, r.nodes, as_utc(r.starts_at), as_utc(r.ends_at), r.native,
                         r.native_note)
                        for r in s.scalars(select(AdvanceReservation).where(AdvanceReservation.ends_at > now))]
            views = self.views()
            changed = 0
            for pool, backend in (pools if pools is not None else self.backends).items():
                with self._pool_lock(pool):
                    changed += self._sync_pool(pool, backend, [r for r in rows if r[1] == pool], views.get(pool),
                                               now)
            return changed

    @contextlib.contextmanager
    def _pool_lock(self, pool: str) -> Iterator[None]:
        """On Postgres, one process at a time syncs a pool: every dispatcher syncs a pool whose
        reservations were signalled (kit/signals.py), and two that made the same backend
        reservation at one instant got a refusal from the backend ("duplicate"), noted on the
        row until the next pass. The second waits for the first and then finds it made."""
        engine = self.sessions.kw.get("bind")
        if engine is None or engine.dialect.name != "postgresql":
            yield
            return
        with engine.connect() as conn:
            key = {"space": POOL_SYNC_LOCK_SPACE, "pool": pool}
            conn.execute(text("SELECT pg_advisory_lock(:space, hashtext(:pool))"), key)
            conn.commit()
            try:
                yield
            finally:
                conn.execute(text("SELECT pg_advisory_unlock(:space, hashtext(:pool))"), key)
                conn.commit()

    def _sync_pool(self, pool: str, backend: Backend, mine: list[tuple], view: PoolView | None,
                   now: datetime) -> int:
        """One pool's pass (see :meth:`sync`); returns the backend calls that changed something."""
        changed = 0
        features = features_of(backend)
        if not features.has(Feature.RESERVATIONS):  # the gateway's planner holds them alone
            for r in mine:
                self._note(r, native=None,
                           note=f"held by the gateway's planner ({features.why_not(Feature.RESERVATIONS)})")
            return changed
        try:
            made = backend.gateway_reservations()
        except BackendError as exc:
            log.warning("pool %s: the gateway's reservations there could not be read: %s", pool, exc.message)
            return changed
        wanted = {native_name(r[0]) for r in mine}
        for name in sorted(set(made) - wanted):  # deleted or ended in the registry
            try:
                backend.unreserve(name)
                changed += 1
                log.info("pool %s: deleted the backend reservation %s (not in the registry)", pool, name)
            except BackendError as exc:
                log.warning("pool %s: deleting the backend reservation %s failed: %s", pool, name,
                            exc.message)
        for r in mine:
            name = native_name(r[0])
            if r[7] == name and name in made:
                continue
            if view is None or view.capacity is None:
                continue  # its size needs the pool's capacity; next pass
            nodes = hold_need(r[3], r[4], view) if view.node_exclusive else 0
            if nodes <= 0:
                self._note(r, native=None, note="held by the gateway's planner (the backend reserves whole "
                                                "nodes; this pool shares them)")
                continue
            try:
                # One under way starts now in the backend (none takes a start in the past).
                words = backend.reserve(ReservationRequest(name=name, account=r[2], nodes=nodes,
                                                           start=max(r[5], now), end=r[6]))
            except Unsupported as exc:
                self._note(r, native=None, note=f"held by the gateway's planner: {exc.message}")
                continue
            except BackendError as exc:
                log.warning("pool %s: making the backend reservation %s failed: %s", pool, name, exc.message)
                self._note(r, native=None, note=f"held by the gateway's planner; the backend refused its "
                                                f"own reservation ({exc.message}); tried again every "
                                                f"{self.INTERVAL_S:.0f} s")
                continue
            changed += 1
            log.info("pool %s: made the backend reservation %s", pool, name)
            self._note(r, native=name, note=words)
        return changed

    def _note(self, row: tuple, *, native: str | None, note: str) -> None:
        note = note[:NOTE_MAX]
        if row[7] == native and row[8] == note:
            return
        with transaction(self.sessions) as s:
            s.execute(update(AdvanceReservation).where(AdvanceReservation.id == row[0])
                      .values(native=native, native_note=note))
