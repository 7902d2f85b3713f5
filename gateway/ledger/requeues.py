"""A run the backend requeued (docs/ledger.md, "Requeue re-admission"): charge what it ran,
give back the rest of its commitment, and re-admit the next run against the budgets.
"""

from __future__ import annotations

import dataclasses
from datetime import date, datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from gateway.domain import quota
from gateway.kit.timeutil import as_utc, utcnow
from gateway.ledger.booking import entry
from gateway.ledger.chains import _apply, _locked_reservation
from gateway.ledger.rules import _run_charge, charged_of, quota_of
from gateway.ledger.service import _add_bucket, _add_decayed_usage
from gateway.models.accounts import AccountQuota
from gateway.models.ledger import (
    AccountBalance,
    Reservation,
)


@dataclasses.dataclass(frozen=True)
class Requeued:
    """What :func:`requeue` did."""

    charged_gpu_seconds: int  # the segment's GPU-seconds (0 when nothing was charged)
    over_budget: str | None = None  # why the job may not run again (it must be cancelled), else None


def record_requeue(session: Session, *, job: Any, started_at: datetime | None, requeued_at: datetime, actor: str,
                   half_life_s: float, now: datetime | None = None) -> int:
    """:func:`requeue`, returning only the segment's GPU-seconds (the re-admission still applies)."""
    return requeue(session, job=job, started_at=started_at, requeued_at=requeued_at, actor=actor,
                   half_life_s=half_life_s, now=now).charged_gpu_seconds


def _requeue_refusal(session: Session, *, names: list[str], balances: dict[str, AccountBalance], r: Reservation,
                     held: int, charge: int, charged_on: date, now: datetime) -> str | None:
    """:func:`quota.requeue_refusal` over the chain's budgets, what they were charged this
    period and the balances locked by the caller."""
    quotas = {q.account_name: quota_of(q) for q in session.scalars(select(AccountQuota).where(
        AccountQuota.account_name.in_(names), AccountQuota.budget_gpu_seconds.is_not(None)))}
    if not quotas:
        return None
    view = quota.ChainView(parent={}, quotas=quotas, charged=charged_of(session, quotas, now),
                           held={n: quota.Held(b.reserved_gpus, b.committed_gpu_seconds) for n, b in balances.items()})
    return quota.requeue_refusal(view, names, held=held, charge=charge, charged_on=charged_on, now=now,
                                 committed=r.committed_gpu_seconds)


def requeue(session: Session, *, job: Any, started_at: datetime | None, requeued_at: datetime, actor: str,
            half_life_s: float, now: datetime | None = None) -> Requeued:
    """Charge the segment a gang ran before the backend requeued it, and re-admit it.

    The gang held its GPUs from ``started_at`` to ``requeued_at``: that segment is charged
    now (a ``usage`` entry) so the time it then spends waiting in the backend's queue is
    never charged. The reservation goes back to ``reserved`` (queued) and keeps its GPUs.
    The next run may use the full time limit again (Slurm and Kueue both restart a requeued
    job from scratch), so its whole committed GPU-time is admitted again against the GPU-hour
    budgets of the chain, as :func:`reserve` would:

    * it fits: the commitment is whole again; the next :func:`record_start` records the new
      start and :func:`record_finish` charges only the last segment;
    * it does not: ``over_budget`` says why, and the reservation keeps only what is left of
      the admission it ran under (committed minus this segment), so the budget holds even if
      the backend restarts the gang before the caller's cancel reaches it.

    Idempotent: a reservation that is not ``started`` is left alone.

    Args:
        job: the requeued job.
        started_at: when the segment started (defaults to the reservation's start).
        requeued_at: when the backend took the gang down.
        actor: who observed the requeue (e.g. "system:reconciler").
        now: the time of the re-admission (budget period); defaults to ``requeued_at``.
    """
    requeued_at = as_utc(requeued_at)
    now = as_utc(now) or requeued_at
    names, balances, r = _locked_reservation(session, job)
    if r is None or r.status != "started":
        return Requeued(0)
    started = as_utc(started_at) or as_utc(r.started_at) or requeued_at
    seconds, used = _run_charge(r, started, requeued_at)
    # Part of the segment may have been charged while it ran (accrue_usage): charge the rest.
    accrued = r.accrued_gpu_seconds or 0
    charge = used - accrued
    refusal = _requeue_refusal(session, names=names, balances=balances, r=r, held=r.committed_gpu_seconds - accrued,
                               charge=charge, charged_on=requeued_at.date(), now=now)
    # Re-admitted: give back the commitment the accruals took, so it is whole for the next
    # run. Refused: the segment consumes its part of the commitment, as at an end.
    back = accrued if refusal is None else -charge
    entry(session, at=requeued_at, account_name=r.account_name, kind="usage", job_id=job.id, pool=r.pool,
           gpu_type=r.gpu_type, username=r.username, gpus=0, committed_gpu_seconds=back, gpu_seconds=charge,
           billing_weight=r.billing_weight, actor=actor,
           reason=f"ran {int(seconds)} s on {r.gpus} GPUs, then requeued by the backend"
                  + (f"; not re-admitted: {refusal}" if refusal else ""),
           data={"started_at": started.isoformat(), "ended_at": requeued_at.isoformat(), "requeued": True,
                 "accrued": accrued, **({"over_budget": refusal} if refusal else {})})
    r.status, r.started_at, r.reserved_at = "reserved", None, requeued_at
    r.used_gpu_seconds = (r.used_gpu_seconds or 0) + used
    r.accrued_gpu_seconds, r.accrued_at, r.requeued_at = 0, None, requeued_at
    if refusal is not None:
        r.committed_gpu_seconds -= used
    _apply(balances, names, utcnow(), charged_gpu_seconds=charge, committed_gpu_seconds=back, queued_jobs=1)
    if charge:
        # jobs=0: the job is counted once, in the bucket of the day it ends.
        _add_bucket(session, r.account_name, requeued_at.date(), r.pool, charge, usage=charge)
        _add_decayed_usage(session, r.account_name, charge, requeued_at, float(half_life_s))
    session.flush()
    return Requeued(used, refusal)
