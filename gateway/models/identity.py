"""When each subject was last seen holding each account (issue #27, finding 6)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import DateTime, String
from sqlalchemy.orm import Mapped, mapped_column

from gateway.kit.db import Base

# Pseudo-accounts: ANY_ACCOUNT is written on every visit (when the subject was last seen at
# all); ADMIN_ROLE when the token carried the admin role (an admin holds every account).
ANY_ACCOUNT = ""
ADMIN_ROLE = "*"


class MembershipSeen(Base):
    """One row per (subject, account held): the last authenticated request that showed it.

    Written at most once per subject per ``membership_seen_write_s`` while the token's
    accounts stay the same, and at once when they change (gateway/identity/seen.py).
    """

    __tablename__ = "membership_seen"

    subject: Mapped[str] = mapped_column(String(255), primary_key=True)
    account: Mapped[str] = mapped_column(String(63), primary_key=True)
    last_seen_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
