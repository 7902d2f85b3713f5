"""Dependencies between jobs: judging them, and the hook that moves blocked jobs on (issue #16).

The state machine (``gateway.jobs.service.set_state``) calls :func:`after_transition` in the
transaction of every final or ``running`` transition and hands it its own ``set_state``,
so this module never imports the job service (no import cycle; tests/layout). Job sets
(arrays, sweeps) are in :mod:`gateway.flows.service`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import func, literal, or_, select
from sqlalchemy.orm import Session

from gateway.domain.states import FINAL_STATES, JobState
from gateway.identity.principal import Principal
from gateway.jobs import repository
from gateway.kit.errors import Invalid
from gateway.kit.timeutil import utcnow
from gateway.models.flows import JobDependency, JobSet
from gateway.models.jobs import Job

log = logging.getLogger("isthmus.flows")

# jobs.service.set_state, passed in by its caller (see the module docstring).
SetState = Callable[..., Any]

ACTOR = "system:flows"
FINAL = tuple(s.value for s in FINAL_STATES)
NOT_FINAL = tuple(s.value for s in JobState if s not in FINAL_STATES)
# A set task holds one of its set's max_running slots from pending until it ends.
SLOT_STATES = tuple(s.value for s in JobState if s not in FINAL_STATES and s is not JobState.BLOCKED)
NOT_STARTED = tuple(s.value for s in (JobState.BLOCKED, JobState.PENDING, JobState.DISPATCHING, JobState.QUEUED,
                                      JobState.STARTING))
MET, WAIT, NEVER = "met", "wait", "never"


# ------------------------------------------------------------------ judging a dependency

def judge_job(condition: str, state: str, started: bool) -> str:
    """Whether ``condition`` on a job in ``state`` is met, may still be, or never will be."""
    final = state in FINAL
    if condition == "finished":
        return MET if final else WAIT
    if condition == "started":
        if started or state in (JobState.RUNNING.value, JobState.REQUEUED.value):
            return MET
        return NEVER if final else WAIT
    wanted = JobState.SUCCEEDED.value if condition == "succeeded" else JobState.FAILED.value
    if state == wanted:
        return MET
    return NEVER if final else WAIT


def _exists(session: Session, *where) -> bool:
    return session.execute(select(literal(1)).select_from(Job).where(*where).limit(1)).first() is not None


def judge_set(session: Session, condition: str, set_id: str) -> str:
    """The same for every task of a set: a few EXISTS probes on ix_job_set_state, never a count."""
    in_set = Job.job_set_id == set_id
    if condition == "finished":
        return WAIT if _exists(session, in_set, Job.state.in_(NOT_FINAL)) else MET
    if condition == "started":
        if _exists(session, in_set, Job.state.in_(FINAL), Job.started_at.is_(None)):
            return NEVER
        return WAIT if _exists(session, in_set, Job.state.in_(NOT_STARTED)) else MET
    other = ((JobState.FAILED.value, JobState.CANCELLED.value) if condition == "succeeded"
             else (JobState.SUCCEEDED.value, JobState.CANCELLED.value))
    if _exists(session, in_set, Job.state.in_(other)):
        return NEVER
    return WAIT if _exists(session, in_set, Job.state.in_(NOT_FINAL)) else MET


def _describe(dep: JobDependency | Any, verdict: str) -> str:
    target = f"job {dep.on_job_id}" if dep.on_job_id else f"job set {dep.on_set_id}"
    if verdict == NEVER:
        return f"dependency {target} can no longer be {dep.condition}"
    return f"waiting for {target} to be {dep.condition}"


# ------------------------------------------------------------------ resolving at submit

@dataclasses.dataclass
class Resolved:
    rows: list[dict[str, Any]]  # job_dependency values without job_id
    met: bool
    reason: str


def resolve(session: Session, *, principal: Principal, depends_on: Sequence[Any], field: str = "body.depends_on"
            ) -> Resolved:
    """Check each dependency names a job or set the caller can see, and judge it now.

    The target rows are read FOR SHARE on Postgres: a concurrent transition of a target
    (which locks it FOR UPDATE) either commits first, and is seen here, or waits for this
    submission to commit, and then sees the new dependent.

    Raises:
        Invalid: 422 naming ``depends_on[i].job`` / ``.job_set`` for an unknown or invisible
            target, or ``depends_on[i]`` for a condition that can never be met.
    """
    is_pg = session.get_bind().dialect.name == "postgresql"
    rows: list[dict[str, Any]] = []
    waiting: list[str] = []
    for i, dep in enumerate(depends_on):
        condition = dep.condition.value
        if dep.job is not None:
            stmt = repository.readable_jobs(principal).where(Job.id == dep.job)
            if is_pg:
                stmt = stmt.with_for_update(read=True)
            job = session.scalars(stmt).first()
            if job is None:
                raise Invalid(f"{field}[{i}].job", f"no job {dep.job!r} visible to you")
            verdict = judge_job(condition, job.state, job.started_at is not None)
            row = dict(on_job_id=job.id, on_set_id=None, condition=condition)
            what = f"job {job.id} is {job.state}"
        else:
            stmt = readable_sets(principal).where(JobSet.id == dep.job_set)
            if is_pg:
                stmt = stmt.with_for_update(read=True)
            job_set = session.scalars(stmt).first()
            if job_set is None:
                raise Invalid(f"{field}[{i}].job_set", f"no job set {dep.job_set!r} visible to you")
            verdict = judge_set(session, condition, job_set.id)
            row = dict(on_job_id=None, on_set_id=job_set.id, condition=condition)
            what = f"job set {job_set.id} has tasks that cannot be {condition}"
        if verdict == NEVER:
            raise Invalid(f"{field}[{i}]", f"{what}: condition {condition} can never be met")
        if verdict == WAIT:
            waiting.append(_describe(_Dep(**row), WAIT))
        rows.append(row)
    return Resolved(rows=rows, met=not waiting, reason="; ".join(waiting[:3]) + (" ..." if len(waiting) > 3 else ""))


@dataclasses.dataclass
class _Dep:
    on_job_id: str | None
    on_set_id: str | None
    condition: str


def add_dependencies(session: Session, job_ids: Sequence[str], resolved: Resolved) -> None:
    if not resolved.rows or not job_ids:
        return
    session.connection().execute(JobDependency.__table__.insert(),
                                 [{"job_id": j, **row} for j in job_ids for row in resolved.rows])


# ------------------------------------------------------------------ job sets

HIDDEN_STATE = "not visible to you (another account's)"


def dependencies_of(session: Session, job: Job, *, principal: Principal) -> list[dict[str, Any]]:
    """What the job waits for, as ``principal`` may see it: the state of a job or set of an
    account the caller cannot read is hidden (its id is the job's own data; whether the
    dependency is met is the job's own state), as ``dependents`` lists only readable jobs."""
    out = []
    deps = list(session.scalars(select(JobDependency).where(JobDependency.job_id == job.id).order_by(JobDependency.id)))
    job_ids = [d.on_job_id for d in deps if d.on_job_id]
    set_ids = [d.on_set_id for d in deps if d.on_set_id]
    readable_jobs = set(session.scalars(repository.readable_jobs(principal).with_only_columns(Job.id)
                                        .where(Job.id.in_(job_ids)))) if job_ids else set()
    readable = set(session.scalars(readable_sets(principal).with_only_columns(JobSet.id)
                                   .where(JobSet.id.in_(set_ids)))) if set_ids else set()
    for dep in deps:
        if dep.on_job_id:
            target = session.get(Job, dep.on_job_id)
            state = target.state if target else "unknown"
            met = judge_job(dep.condition, state, bool(target and target.started_at)) == MET
            visible = dep.on_job_id in readable_jobs
        else:
            c = counts(session, dep.on_set_id)
            state = ", ".join(f"{n} {s}" for s, n in sorted(c.items()))
            met = judge_set(session, dep.condition, dep.on_set_id) == MET
            visible = dep.on_set_id in readable
        out.append(dict(job=dep.on_job_id, job_set=dep.on_set_id, condition=dep.condition,
                        state=state if visible else HIDDEN_STATE, met=met))
    return out


def dependents_of(session: Session, job: Job, *, principal: Principal, limit: int = 100) -> list[str]:
    """Ids of the jobs ``principal`` may read that wait for this job (directly, or for its whole set), oldest first.

    A dependent in another account (made by a user of both) is left out: its id is not the
    caller's to see (issue #27 finding 5).
    """
    where = JobDependency.on_job_id == job.id
    if job.job_set_id:
        where = or_(where, JobDependency.on_set_id == job.job_set_id)
    stmt = (repository.readable_jobs(principal).with_only_columns(Job.id)
            .where(Job.id.in_(select(JobDependency.job_id).where(where))))
    return list(session.scalars(stmt.order_by(Job.id).limit(limit)))


def readable_sets(principal: Principal):
    stmt = select(JobSet)
    if not principal.is_admin:
        stmt = stmt.where(JobSet.account_name.in_(sorted(principal.accounts)))
    return stmt


def counts(session: Session, set_id: str) -> dict[str, int]:
    rows = session.execute(select(Job.state, func.count()).where(Job.job_set_id == set_id).group_by(Job.state))
    return dict(rows.all())


# ------------------------------------------------------------------ the hook

def after_transition(session: Session, job: Job, target: JobState, *, set_state: SetState) -> None:
    """Move on what waits for ``job`` now that it reached ``target``; same transaction.

    Called by ``jobs.service.set_state`` for final states and ``running``. Work is queued
    and drained iteratively (a cancelled dependent can cancel its own dependents), so a
    long chain or a large array does not recurse.
    """
    if not (target.final or target is JobState.RUNNING):
        return
    queue: list[tuple[str, str | None, JobState]] = session.info.setdefault("flows_queue", [])
    queue.append((job.id, job.job_set_id, target))
    if session.info.get("flows_busy"):
        return
    session.info["flows_busy"] = True
    try:
        while queue:
            _settle(session, *queue.pop(0), set_state=set_state)
    except BaseException:
        queue.clear()
        raise
    finally:
        session.info["flows_busy"] = False


def _settle(session: Session, job_id: str, set_id: str | None, target: JobState, *, set_state: SetState
            ) -> None:
    where = JobDependency.on_job_id == job_id
    if set_id is not None:
        where = or_(where, JobDependency.on_set_id == set_id)
    waiting = select(JobDependency.job_id).where(where)
    # Lock the blocked dependents (in id order: no deadlock between two settling transactions)
    # before judging: a concurrent transition of another dependency then judges after us.
    blocked = session.scalars(select(Job).where(Job.id.in_(waiting), Job.state == JobState.BLOCKED.value)
                              .order_by(Job.id).with_for_update()).all() if _has_dependents(session, where) else []
    verdicts: dict[tuple[str | None, str | None, str], str] = {}
    full_sets: set[str] = set()
    for dependent in blocked:
        if dependent.state != JobState.BLOCKED.value:
            continue
        _release_or_cancel(session, dependent, verdicts, full_sets, set_state)
    if set_id is not None and target.final and set_id not in session.info.get("flows_quiet_sets", ()):
        _hand_over_slots(session, set_id, verdicts, set_state)


def _has_dependents(session: Session, where) -> bool:
    # The common case (a job nobody waits for) costs one index probe and takes no lock.
    return session.execute(select(literal(1)).select_from(JobDependency).where(where).limit(1)).first() is not None


def _verdict(session: Session, job: Job, verdicts: dict) -> tuple[str, str]:
    """All of a blocked job's dependencies judged: (MET | WAIT | NEVER, the reason to show)."""
    reasons = []
    for dep in session.scalars(select(JobDependency).where(JobDependency.job_id == job.id).order_by(JobDependency.id)):
        key = (dep.on_job_id, dep.on_set_id, dep.condition)
        if key not in verdicts:
            if dep.on_job_id:
                target = session.get(Job, dep.on_job_id)
                verdicts[key] = judge_job(dep.condition, target.state, target.started_at is not None)
            else:
                verdicts[key] = judge_set(session, dep.condition, dep.on_set_id)
        verdict = verdicts[key]
        if verdict == NEVER:
            return NEVER, _describe(dep, NEVER)
        if verdict == WAIT:
            reasons.append(_describe(dep, WAIT))
    return (WAIT, "; ".join(reasons)) if reasons else (MET, "")


def _free_slots(session: Session, job_set: JobSet) -> int:
    """Slots left under max_running: a count stopped at the limit (bounded cost)."""
    if job_set.max_running is None:
        return 1 << 30
    used = session.execute(select(func.count()).select_from(
        select(literal(1)).select_from(Job).where(Job.job_set_id == job_set.id, Job.state.in_(SLOT_STATES))
        .limit(job_set.max_running).subquery())).scalar_one()
    return job_set.max_running - used


def _release_or_cancel(session: Session, job: Job, verdicts: dict, full_sets: set[str], set_state: SetState) -> None:
    verdict, reason = _verdict(session, job, verdicts)
    if verdict == NEVER:
        job.ended_at = utcnow()
        set_state(session, job, JobState.CANCELLED, actor=ACTOR, reason=f"cancelled: {reason}")
        return
    if verdict == WAIT:
        if reason != job.state_reason:
            job.state_reason = reason
        return
    if job.job_set_id is not None:
        if job.job_set_id in full_sets:
            job.state_reason = "dependencies met; waiting for a free slot"
            return
        job_set = session.get(JobSet, job.job_set_id)
        if _free_slots(session, job_set) <= 0:
            full_sets.add(job.job_set_id)
            job.state_reason = f"dependencies met; waiting for a free slot (max_running {job_set.max_running})"
            return
    set_state(session, job, JobState.PENDING, actor=ACTOR, reason="waiting for dispatch",
                   data={"released": "dependencies met" if job.job_set_id is None else "dependencies met, slot free"})


def _hand_over_slots(session: Session, set_id: str, verdicts: dict, set_state: SetState) -> None:
    """A task of a max_running set ended: release the next blocked tasks, lowest index first."""
    job_set = session.get(JobSet, set_id)
    if job_set is None or job_set.max_running is None:
        return
    free = _free_slots(session, job_set)
    if free <= 0:
        return
    candidates = session.scalars(select(Job).where(Job.job_set_id == set_id, Job.state == JobState.BLOCKED.value)
                                 .order_by(Job.array_index).limit(free).with_for_update(skip_locked=True)).all()
    for job in candidates:
        verdict, reason = _verdict(session, job, verdicts)
        if verdict == WAIT:
            return  # the set's tasks share their dependencies: the rest wait too
        if verdict == NEVER:
            job.ended_at = utcnow()
            set_state(session, job, JobState.CANCELLED, actor=ACTOR, reason=f"cancelled: {reason}")
            continue  # its own transition hands its (never used) slot on
        set_state(session, job, JobState.PENDING, actor=ACTOR, reason="waiting for dispatch",
                       data={"released": f"slot free (max_running {job_set.max_running})"})


def dependents_for_cascade(session: Session, job: Job, *, principal: Principal, limit: int = 100_000) -> list[Job]:
    """Every job ``principal`` may cancel that waits for this one, directly or through others
    (or their sets), locked.

    May cancel is may read (``repository.readable_jobs``, the rule ``cancel`` applies to the job
    itself). A dependent in another account is not reached, nor what waits for it: it is
    judged by its own dependency condition when the jobs it waits for end, as without
    cascade (issue #27 finding 5).
    """
    seen: dict[str, Job] = {}
    frontier = [(job.id, job.job_set_id)]
    while frontier and len(seen) < limit:
        job_id, set_id = frontier.pop()
        where = JobDependency.on_job_id == job_id
        if set_id is not None:
            where = or_(where, JobDependency.on_set_id == set_id)
        for dependent in session.scalars(repository.readable_jobs(principal)
                                         .where(Job.id.in_(select(JobDependency.job_id).where(where)))
                                         .order_by(Job.id).with_for_update()):
            if dependent.id not in seen:
                seen[dependent.id] = dependent
                frontier.append((dependent.id, dependent.job_set_id))
    return list(seen.values())
