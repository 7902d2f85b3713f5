"""Record which accounts each subject was last seen holding, cheaply (issue #27, finding 6).

Webhook endpoints live only while the subject holding them still holds their account
(gateway/webhooks/service.py, ``suspend_unheld``); what this module writes is how the
gateway knows. The request path pays a dictionary look-up: a subject's rows are written at
most once per ``membership_seen_write_s`` per process while its accounts stay the same, and
at once when they change (so a membership the identity provider removed is noticed at the
subject's first request after it).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, sessionmaker

from gateway.identity.principal import Principal
from gateway.kit.db import transaction
from gateway.kit.timeutil import utcnow
from gateway.models.identity import ADMIN_ROLE, ANY_ACCOUNT, MembershipSeen

log = logging.getLogger("isthmus.identity")

MAX_REMEMBERED = 100_000  # subjects remembered per process; past it the memory starts over


def held(principal: Principal) -> frozenset[str]:
    """The accounts a principal holds, as recorded: its token's, plus ADMIN_ROLE for an admin."""
    return principal.accounts | ({ADMIN_ROLE} if principal.is_admin else frozenset())


class MembershipSeenRecorder:
    def __init__(self, sessions: Callable[[], sessionmaker[Session]], *, write_every_s: float):
        self._sessions = sessions
        self.write_every_s = write_every_s
        self._lock = threading.Lock()
        self._written: dict[str, tuple[frozenset[str], float]] = {}

    def due(self, principal: Principal) -> bool:
        """Whether :meth:`seen` would write now (cheap: no database; the caller may skip it)."""
        return self._due(principal.subject, held(principal), time.monotonic())

    def _due(self, subject: str, accounts: frozenset[str], now: float) -> bool:
        last = self._written.get(subject)
        return last is None or last[0] != accounts or now - last[1] >= self.write_every_s

    def seen(self, principal: Principal) -> None:
        """Note an authenticated request; writes only when due (never raises)."""
        accounts = held(principal)
        now = time.monotonic()
        with self._lock:
            if not self._due(principal.subject, accounts, now):
                return
            if len(self._written) >= MAX_REMEMBERED:
                self._written.clear()
            self._written[principal.subject] = (accounts, now)
        try:
            with transaction(self._sessions()) as session:
                write(session, subject=principal.subject, accounts=accounts)
        except Exception:
            log.exception("could not record the accounts of %s", principal.subject)
            with self._lock:
                self._written.pop(principal.subject, None)

    def forget(self) -> None:
        """Write on the next request of every subject (tests that wipe the table)."""
        with self._lock:
            self._written.clear()


def write(session: Session, *, subject: str, accounts: frozenset[str]) -> None:
    """Upsert (subject, account, now) for each account held and for ANY_ACCOUNT, one timestamp:
    an account row older than the subject's ANY_ACCOUNT row was not held at the last visit."""
    now = utcnow()
    rows = [{"subject": subject, "account": a, "last_seen_at": now} for a in sorted(accounts | {ANY_ACCOUNT})]
    dialect = postgresql if session.get_bind().dialect.name == "postgresql" else sqlite
    stmt = dialect.insert(MembershipSeen).values(rows)
    session.execute(stmt.on_conflict_do_update(index_elements=["subject", "account"],
                                               set_={"last_seen_at": stmt.excluded.last_seen_at}))
