"""Recording new jobs: who may, within which caps and limits, with which Idempotency-Key.

:func:`create_many` records a batch of submissions in the caller's transaction, each judged
as if it were alone (issue #32's group commit); a single submission is a batch of one
(gateway/jobs/admission.py). The caps are gateway/jobs/caps.py's; the rows are written by
gateway/jobs/store.py, the one way a job is created. Split out of gateway/jobs/service.py
(issue #46).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable
from typing import Any

from sqlalchemy.orm import Session

from gateway.domain.shapes import parse_duration_s
from gateway.domain.states import JobState
from gateway.identity.principal import Principal
from gateway.jobs import repository, store
from gateway.jobs.caps import CapRead, CapTally, SubmitCaps, admit, lock_caps, read_caps
from gateway.jobs.schemas import JobSpec
from gateway.kit.errors import Conflict, Forbidden, GatewayError, Invalid
from gateway.kit.timeutil import new_id, utcnow
from gateway.models.accounts import Account
from gateway.models.jobs import IdempotencyKey, Job


def spec_hash(spec: JobSpec) -> str:
    canonical = json.dumps(spec.stored(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def check_caller(principal: Principal, account: str) -> None:
    """Who may record jobs for ``account``: a member (or an admin) with a POSIX user to run as.

    The one rule for single jobs and job sets (gateway/flows/service.py). Raises Forbidden.
    """
    if not principal.may_use(account):
        raise Forbidden(f"you are not a member of account {account!r}")
    if not principal.username:
        raise Forbidden("this caller has no POSIX user mapped; jobs cannot run as it")


def time_limit_of(time_limit: str | None, *, default_s: int, max_s: int) -> int:
    """A job's time limit in seconds: the spec's, else the site default; never above the site maximum."""
    time_limit_s = parse_duration_s(time_limit) if time_limit else default_s
    if time_limit_s > max_s:
        raise Invalid("body.time_limit", f"exceeds this gateway's maximum of {max_s} s")
    return time_limit_s


class RefusedWhileWriting(Exception):
    """A submission refused after part of it was written (:func:`create_many`): its
    transaction must be rolled back. ``refusal`` is the answer the request gets."""

    def __init__(self, refusal: GatewayError):
        super().__init__(str(refusal))
        self.refusal = refusal


@dataclasses.dataclass
class Submission:
    """One job to record (:func:`create_many`): who asks, what, with which Idempotency-Key.

    ``lineage``: the checkpoint lineage of a job resuming an earlier one's (admission's
    ``checkpoint_lineage``); a job with a checkpoint and none starts its own (its id).
    ``hold`` gets the account chain the cap check read, root first, and returns why the job
    is held (its state reason becomes "held: ..."), or None; it may raise to refuse. A
    ``prepare`` callback of :func:`create_many` may set both."""

    principal: Principal
    spec: JobSpec
    idempotency_key: str | None = None
    lineage: str | None = None
    hold: Callable[[list[Any]], str | None] | None = None


def create_many(session: Session, submissions: list[Submission], *, default_time_limit_s: int,
                max_time_limit_s: int, caps: SubmitCaps | None = None,
                waiting_reason: str = "waiting for dispatch",
                prepare: Callable[[Session, Submission], None] | None = None) -> list[tuple[Job, bool] | GatewayError]:
    """Record ``submissions`` in the caller's transaction, judged one after another in order
    as if each were alone (issue #32, group commit): one result each, ``(job, created)`` or
    the refusal (403, 409, 422, 429) that the request gets. A refused submission writes
    nothing and does not stop the others.

    Statements per call, whatever the number of submissions: ``prepare`` (admission's
    early refusals: reads only in uncommon cases), the cap locks of every account and user
    at once (Postgres), one cap read per distinct account, user and key use (two when an
    admin cap is set on the chain), and ONE insert of every plain job and its event
    (Postgres; two executemany on SQLite). The caps stay exact: every count is read under the
    locks before anything is written, and each submission is judged by :func:`admit` on
    those counts plus the batch's earlier admissions (``CapTally``). Submissions with an
    Idempotency-Key or dependencies take the ORM path (savepoint, key row, dependency rows)
    at their turn, so a later duplicate key in the same call replays the first.

    Raises:
        Only what is not a refusal of one submission before anything of it was written (a
        database error, an insert that lost its account meanwhile, ``RefusedWhileWriting``):
        the caller rolls back and may retry each submission alone, where a lost account is
        its 422.
    """
    results: list[Any] = [None] * len(submissions)
    live: list[int] = []
    for i, sub in enumerate(submissions):
        try:
            if prepare is not None:
                prepare(session, sub)
            check_caller(sub.principal, sub.spec.account)
            live.append(i)
        except GatewayError as exc:
            results[i] = exc
    reads: dict[tuple, CapRead | None] = {}
    if caps is not None and live:
        groups = sorted({(s.spec.account, s.principal.username, s.principal.subject, s.idempotency_key is not None)
                         for s in (submissions[i] for i in live)})
        lock_caps(session, [(account, username) for account, username, _, _ in groups])
        now = utcnow()  # every count is read before anything is written
        for account, username, subject, with_key in groups:
            reads[(account, username, subject, with_key)] = read_caps(
                session, account=account, username=username, subject=subject, caps=caps, with_key=with_key, now=now)
    tally = CapTally()
    plain: list[tuple[int, dict[str, Any]]] = []
    for i in live:
        sub = submissions[i]
        try:
            results[i] = _admit_one(session, i, sub, reads, tally, plain, caps=caps, waiting_reason=waiting_reason,
                                    default_time_limit_s=default_time_limit_s, max_time_limit_s=max_time_limit_s)
        except GatewayError as exc:
            results[i] = exc
    if plain:
        store.insert_jobs(session, [values for _, values in plain])
        for i, values in plain:
            results[i] = Job(**{k: v for k, v in values.items() if k != "actor"}), True
    return results


def _admit_one(session: Session, index: int, sub: Submission, reads: dict, tally: CapTally, plain: list, *,
               caps: SubmitCaps | None, waiting_reason: str, default_time_limit_s: int,
               max_time_limit_s: int) -> tuple[Job, bool] | None:
    """One submission's turn in :func:`create_many`: a refusal raises before anything of it is
    written (a GatewayError); a plain job is queued in ``plain`` (None), a keyed or dependent
    one written now. An error while writing is not a refusal: it propagates as such."""
    principal, spec, key = sub.principal, sub.spec, sub.idempotency_key
    digest = spec_hash(spec) if key is not None else ""  # only a keyed request is compared
    if key is not None:
        existing = repository.get_idempotency(session, principal.subject, key)
        if existing is not None:
            return _replay(session, existing, digest), False
    time_limit_s = time_limit_of(spec.time_limit, default_s=default_time_limit_s, max_s=max_time_limit_s)
    before = CapTally(tally)
    if caps is not None:
        read = reads[(spec.account, principal.username, principal.subject, key is not None)]
        if read is None:
            raise Invalid("body.account", f"unknown account {spec.account!r}")
        # Judged before the hold, as one request was: a refused job never reaches it. The
        # tally is taken back if the hold or the dependencies refuse the job after all.
        admit(read, tally)
        try:
            held = sub.hold(read.chain[::-1]) if sub.hold is not None else None
            if held:
                waiting_reason = f"held: {held}"
            resolved = _resolve(session, sub)
        except BaseException:
            tally.clear()
            tally.update(before)
            raise
    else:
        resolved = _resolve(session, sub)
    now = utcnow()
    values = dict(
        id=new_id(), name=spec.name, account_name=spec.account, submitted_by=principal.subject,
        username=principal.username, requested_pool=spec.pool, pool=None,
        state=JobState.PENDING.value, state_reason=waiting_reason, spec=spec.stored(),
        workers=spec.workers, gpus_per_worker=spec.gpus_per_worker, total_gpus=spec.total_gpus,
        time_limit_s=time_limit_s, priority=spec.priority, routing_reason="", dispatch_attempts=0,
        created_at=now, updated_at=now, lineage=sub.lineage if spec.checkpoint else None,
    )
    if resolved is not None and not resolved.met:
        values.update(state=JobState.BLOCKED.value, state_reason=resolved.reason)
    if key is None and resolved is None:
        # The hot path (bench/bench_api.py): written with the batch's other plain jobs in
        # one Core insert. The account's existence was checked by the cap read; without
        # caps, by the foreign key (an unknown account fails the insert, nothing is written).
        plain.append((index, {**values, "actor": principal.subject}))
        return None
    try:
        job, created = _write_orm(session, values, principal, key, digest, resolved)
    except GatewayError as exc:
        # Refused after some of it may have been written: not this member's refusal alone,
        # the transaction must go (the caller re-runs the batch one by one).
        raise RefusedWhileWriting(exc) from exc
    if not created:  # a concurrent request with the same key won: this one adds nothing
        tally.clear()
        tally.update(before)
    return job, created


def _resolve(session: Session, sub: Submission):
    if not sub.spec.depends_on:
        return None
    from gateway.jobs import graph as flows

    return flows.resolve(session, principal=sub.principal, depends_on=sub.spec.depends_on)


def _write_orm(session: Session, values: dict[str, Any], principal: Principal, key: str | None, digest: str,
               resolved) -> tuple[Job, bool]:
    """A keyed or dependent job: the same insert (gateway/jobs/store.py), under a savepoint
    with its key row, or followed by its dependency rows; the job is returned loaded."""
    if session.get(Account, values["account_name"]) is None:
        raise Invalid("body.account", f"unknown account {values['account_name']!r}")
    row = {**values, "actor": principal.subject, "event_data": {"idempotency_key": key} if key else None}
    if key is None:
        store.insert_jobs(session, [row])
    elif not store.insert_with_key(session, row, subject=principal.subject, key=key, digest=digest, at=utcnow()):
        # A concurrent request with the same key won the race; answer as it did.
        existing = repository.get_idempotency(session, principal.subject, key)
        return _replay(session, existing, digest), False
    if resolved is not None:
        from gateway.jobs import graph as flows

        flows.add_dependencies(session, [values["id"]], resolved)
    return session.get(Job, values["id"]), True


def _replay(session: Session, existing: IdempotencyKey, digest: str) -> Job:
    if existing.request_hash != digest:
        raise Conflict("this Idempotency-Key was already used with a different request body")
    job = session.get(Job, existing.job_id)
    assert job is not None
    return job
