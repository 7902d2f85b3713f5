from __future__ import annotations

from datetime import datetime

from sqlalchemy import CheckConstraint, DateTime, ForeignKey, Integer, String, Text, func
from sqlalchemy.orm import Mapped, mapped_column

from gateway.kit.db import Base


class Account(Base):
    """A chargeable account (organisation, team, sub-team). Its name is its id."""

    __tablename__ = "account"
    __table_args__ = (CheckConstraint("shares >= 0", name="shares_non_negative"),)

    name: Mapped[str] = mapped_column(String(63), primary_key=True)
    parent_name: Mapped[str | None] = mapped_column(
        String(63), ForeignKey("account.name", ondelete="RESTRICT"), index=True)
    shares: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    description: Mapped[str] = mapped_column(Text, default="", server_default="")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
