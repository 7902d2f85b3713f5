"""The dashboard's login sessions, kept server-side in the ``ui_session`` table (docs/ui.md,
"Sessions"; #27, finding 9).

The /ui cookie (gateway/ui/session.py) carries only a random session id; the access token,
the CSRF token and the expiry stay here, found by the id's SHA-256, so every worker process
sees a logout at once: the row is deleted and a replayed cookie finds nothing. The dashboard
calls these inside its own transaction; nothing here commits.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime, timedelta

from sqlalchemy import bindparam, delete, select
from sqlalchemy.orm import Session

from gateway.kit.db import compiled_read
from gateway.kit.timeutil import as_utc, utcnow
from gateway.models.ui import UiSession

MAX_AGE_S = 12 * 3600  # a session ends by then even if the provider's token lives longer


def hash_id(sid: str) -> str:
    return hashlib.sha256(sid.encode()).hexdigest()


def create(session: Session, *, access_token: str, subject: str, token_expires_at: datetime | None) -> str:
    """Store a logged-in session and return its id (for the cookie); expired rows are purged here."""
    now = utcnow()
    purge_expired(session, now=now)
    expires = now + timedelta(seconds=MAX_AGE_S)
    if token_expires_at is not None:
        expires = min(expires, as_utc(token_expires_at))
    sid = secrets.token_urlsafe(32)
    session.add(UiSession(id_hash=hash_id(sid), access_token=access_token, csrf=secrets.token_urlsafe(32),
                          subject=subject, created_at=now, expires_at=expires))
    session.flush()
    return sid


def get(session: Session, *, sid: str) -> UiSession | None:
    """The live session with this id; None when there is none, it was revoked, or it expired."""
    if not sid or not isinstance(sid, str):
        return None
    return session.scalar(select(UiSession).where(UiSession.id_hash == hash_id(sid),
                                                  UiSession.expires_at > utcnow()))


class Live:
    """What a page needs of its live session row; its repr never shows the token."""

    __slots__ = ("access_token", "csrf")

    def __init__(self, access_token: str, csrf: str):
        self.access_token, self.csrf = access_token, csrf

    def __repr__(self) -> str:
        return "Live(<session>)"


def live(session: Session, *, sid: str) -> Live | None:
    """``get`` for every page's session check, as a statement built once (kit/db.py
    ``CompiledRead``; issue #46): the token and CSRF token of the live session with this id."""
    if not sid or not isinstance(sid, str):
        return None
    read = compiled_read(session, "ui_session.live", lambda: select(UiSession.access_token, UiSession.csrf).where(
        UiSession.id_hash == bindparam("r_id_hash", None), UiSession.expires_at > bindparam("r_now", None)))
    rows = read.rows(session, {"r_id_hash": hash_id(sid), "r_now": utcnow()})
    return Live(*rows[0]) if rows else None


def revoke(session: Session, *, sid: str) -> None:
    if sid and isinstance(sid, str):
        session.execute(delete(UiSession).where(UiSession.id_hash == hash_id(sid)))


def purge_expired(session: Session, *, now: datetime) -> int:
    return session.execute(delete(UiSession).where(UiSession.expires_at <= now)).rowcount or 0
