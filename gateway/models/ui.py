"""The /ui login sessions, kept server-side (docs/ui.md, "Sessions")."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import DateTime, Index, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from gateway.kit.db import Base
from gateway.kit.timeutil import utcnow


class UiSession(Base):
    """One logged-in browser. The cookie carries only the random session id; this row is found
    by its SHA-256, so the table alone cannot be replayed as cookies. Logout deletes the row."""

    __tablename__ = "ui_session"
    __table_args__ = (Index("ix_ui_session_expires_at", "expires_at"),)

    id_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    # The provider's access token: checked like a bearer token on every request; never sent to the browser.
    access_token: Mapped[str] = mapped_column(Text)
    csrf: Mapped[str] = mapped_column(String(64))
    subject: Mapped[str] = mapped_column(String(255))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    # The token's expiry, or the session's maximum age if that comes first.
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))

    def __repr__(self) -> str:  # never the token
        return f"UiSession(subject={self.subject!r}, expires_at={self.expires_at})"
