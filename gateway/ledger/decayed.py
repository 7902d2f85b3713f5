"""The ledger's calls that decay usage, bound to the one fair-share half-life the gateway runs
with (issue #47, item 1).

The half-life is a setting (``ISTHMUS_FAIRSHARE_HALF_LIFE_S``) that every charge and every
fair-share read must agree on. It travelled as an argument through the routers, the metrics
collector and the dispatcher's parts (21 call sites); now each of them holds a
:class:`Ledger` made from the settings once, and the pure functions below it keep taking it
as an argument (their tests pass any).
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from gateway.ledger import breakdown, reading, requeues, service


@dataclasses.dataclass(frozen=True)
class Ledger:
    """Fair share, usage and the charges that decay, at one half-life."""

    half_life_s: float

    @classmethod
    def of(cls, settings: Any) -> Ledger:
        return cls(half_life_s=settings.fairshare_half_life_s)

    # --- reads
    def fairshare(self, session: Session, *, now: datetime | None = None) -> dict[str, reading.FairShare]:
        return reading.fairshare(session, now=now, half_life_s=self.half_life_s)

    def fairshare_and_guarantees(self, session: Session, *, now: datetime | None = None):
        return reading.fairshare_and_guarantees(session, now=now, half_life_s=self.half_life_s)

    def account_usage(self, session: Session, *, account: str, now: datetime | None = None,
                      shares: dict[str, reading.FairShare] | None = None, pools: bool = True) -> dict[str, Any]:
        return reading.account_usage(session, account=account, now=now, half_life_s=self.half_life_s,
                                     shares=shares, pools=pools)

    def own_pool_weights(self, session: Session, *, now: datetime) -> dict[str, dict[str, float]]:
        return breakdown.own_pool_weights(session, now=now, half_life_s=self.half_life_s)

    # --- charges
    def record_finish(self, session: Session, *, job: Any, started_at: datetime | None, ended_at: datetime,
                      actor: str, retried: bool = False) -> int:
        return service.record_finish(session, job=job, started_at=started_at, ended_at=ended_at, actor=actor,
                                     half_life_s=self.half_life_s, retried=retried)

    def accrue_usage(self, session: Session, *, job: Any, now: datetime, actor: str) -> int:
        return service.accrue_usage(session, job=job, now=now, actor=actor, half_life_s=self.half_life_s)

    def requeue(self, session: Session, *, job: Any, started_at: datetime | None, requeued_at: datetime,
                actor: str, now: datetime | None = None) -> requeues.Requeued:
        return requeues.requeue(session, job=job, started_at=started_at, requeued_at=requeued_at, actor=actor,
                                half_life_s=self.half_life_s, now=now)
