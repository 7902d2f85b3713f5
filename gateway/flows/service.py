"""Workflows: job sets (arrays, sweeps) and dependencies between jobs (issue #16, docs/jobs.md).

Every task of a set is an ordinary Job row (own id, state, events, ledger entries). A job
whose dependencies are not met, or a task beyond its set's ``max_running``, waits in
``blocked``: not in the dispatch pick, nothing reserved in the ledger. :func:`after_transition`
(called by ``jobs.service.set_state``, in the transaction of the state change) moves
blocked jobs on: to ``pending`` when they may run (the dispatcher's ordinary admission and
reservation then apply), to ``cancelled`` when a dependency can no longer be met.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from gateway.domain import templates
from gateway.domain.states import JobState
from gateway.flows.schemas import JobSetSpec
from gateway.identity.principal import Principal
from gateway.jobs.graph import (  # noqa: F401 - the dependency half, re-exported for callers
    ACTOR,
    FINAL,
    MET,
    NEVER,
    NOT_FINAL,
    NOT_STARTED,
    SLOT_STATES,
    WAIT,
    Resolved,
    add_dependencies,
    counts,
    dependencies_of,
    dependents_for_cascade,
    dependents_of,
    judge_job,
    judge_set,
    readable_sets,
    resolve,
)
from gateway.jobs.schemas import JobSpec
from gateway.kit.errors import Invalid, NotFound
from gateway.kit.timeutil import new_id, new_ids, utcnow
from gateway.models.flows import JobSet
from gateway.models.jobs import Job

if TYPE_CHECKING:
    from gateway.jobs.admission import Admission

log = logging.getLogger("isthmus.flows")

def get_set_or_raise(session: Session, *, principal: Principal, set_id: str) -> JobSet:
    job_set = session.scalars(readable_sets(principal).where(JobSet.id == set_id)).first()
    if job_set is None:
        raise NotFound(f"no job set {set_id!r} visible to you")
    return job_set


def expand(spec: JobSetSpec, *, max_tasks: int, max_points: int) -> list[dict[str, str]]:
    """One dict of template values per task, in index order.

    Raises:
        Invalid: a count or sweep over the site's limit, or a template naming no parameter.
    """
    if spec.sweep is not None:
        points = 1
        for values in spec.sweep.values():
            points *= len(values)
        if points > max_points:
            raise Invalid("body.sweep", f"{points} points (the product of the value lists) exceed this gateway's "
                                        f"limit of {max_points} (ISTHMUS_MAX_SWEEP_POINTS)")
        names = list(spec.sweep)
        combos = [dict(zip(names, (templates.format_value(v) for v in combo), strict=True))
                  for combo in itertools.product(*spec.sweep.values())]
    else:
        assert spec.array is not None and spec.array.count is not None
        if spec.array.count > max_tasks:
            raise Invalid("body.array.count", f"{spec.array.count} tasks exceed this gateway's limit of {max_tasks} "
                                              f"(ISTHMUS_MAX_ARRAY_TASKS)")
        names = []
        combos = [{} for _ in range(spec.array.count)]
    unknown = templates.unknown_names(spec.command, spec.env, set(names) | set(templates.BUILTINS))
    if unknown:
        field, name = unknown
        known = ", ".join(sorted(set(names) | set(templates.BUILTINS)))
        raise Invalid(field, f"template names {{{{ {name} }}}}, which is not a parameter of this set (known: {known})")
    for i, values in enumerate(combos):
        values["index"] = str(i)
    return combos


def _check_rendered(command: list[str], env: dict[str, str], index: int) -> None:
    """A rendered task obeys the same limits as a submitted job (a long value can overflow them)."""
    try:
        JobSpec._command(command)  # type: ignore[operator]
    except ValueError as exc:
        raise Invalid("body.command", f"task {index} after substitution: {exc}") from None
    for key, value in env.items():
        if len(value) > 4096:
            raise Invalid(f"body.env.{key}", f"task {index} after substitution: value is longer than 4096 characters")


def record_set(session: Session, context: Admission, principal: Principal, spec: JobSetSpec) -> JobSet:
    """``POST /v1/job-sets``: admit and record a set with all its tasks in the caller's
    transaction, by the same checks, in the same order, as a single job
    (gateway/jobs/admission.py ``record_jobs``)."""
    from gateway.jobs import admission

    settings = context.settings
    admission.refuse_early(session, context, principal, spec)
    return create_set(session, principal=principal, spec=spec, max_tasks=settings.max_array_tasks,
                      max_points=settings.max_sweep_points, default_time_limit_s=settings.default_time_limit_s,
                      max_time_limit_s=settings.max_time_limit_s, caps=admission.caps(settings),
                      waiting_reason=admission.waiting_reason(context),
                      hold=admission.budget_hold(session, spec, settings))


def create_set(session: Session, *, principal: Principal, spec: JobSetSpec, max_tasks: int, max_points: int,
               default_time_limit_s: int, max_time_limit_s: int, caps: Any, waiting_reason: str,
               hold: Callable[[list[Any]], str | None] | None = None) -> JobSet:
    """Record a set and all its tasks in the caller's transaction: a few bulk statements.

    Judged as a single job is (gateway/jobs/intake.py), in the same order: the caller, the
    time limit, the caps (``caps``; every task counts), then ``hold`` on the account chain the
    cap check read (gateway/jobs/admission.py ``budget_hold``: why the tasks are held, or a
    refusal), then the dependencies. ``caps`` None checks no caps and asks no ``hold``.

    Raises:
        Forbidden, Invalid, LimitExceeded: nothing is written.
    """
    from gateway.jobs import caps as job_caps
    from gateway.jobs import intake, store

    intake.check_caller(principal, spec.account)
    base = spec.job_spec()
    combos = expand(spec, max_tasks=max_tasks, max_points=max_points)
    count = len(combos)
    time_limit_s = intake.time_limit_of(spec.time_limit, default_s=default_time_limit_s, max_s=max_time_limit_s)
    if caps is not None:
        job_caps.lock_caps(session, [(spec.account, principal.username)])
        read = job_caps.read_caps(session, account=spec.account, username=principal.username,
                                  subject=principal.subject, caps=caps, with_key=False)
        if read is None:
            raise Invalid("body.account", f"unknown account {spec.account!r}")
        job_caps.admit(read, job_caps.CapTally(), adding=count)
        held = hold(read.chain[::-1]) if hold is not None else None
        if held:
            waiting_reason = f"held: {held}"
    resolved = resolve(session, principal=principal, depends_on=spec.depends_on)
    max_running = spec.array.max_running if spec.array else None
    now = utcnow()
    set_id = new_id()
    kind = "sweep" if spec.sweep is not None else "array"
    conn = session.connection()
    try:
        conn.execute(JobSet.__table__.insert(), [dict(
            id=set_id, name=spec.name, account_name=spec.account, submitted_by=principal.subject, kind=kind,
            task_count=count, max_running=max_running, sweep=spec.sweep, spec=base.stored(), created_at=now)])
    except Exception as exc:  # an unknown account fails the foreign key: nothing written
        from sqlalchemy.exc import IntegrityError

        if isinstance(exc, IntegrityError) and store.is_foreign_key_violation(exc):
            raise Invalid("body.account", f"unknown account {spec.account!r}") from None
        raise
    templated = "{{" in "".join(base.command) + "".join(base.env.values())
    # The spec is the set's, stored once above; a task keeps only its own values (an array's
    # task none but its index, which has a column): gateway/models/specs.py renders the whole.
    params = names_of(spec)
    ids = new_ids(count)
    rows: list[dict[str, Any]] = []
    blocked_by_deps = JobState.BLOCKED.value, resolved.reason
    waiting_slot = JobState.BLOCKED.value, f"waiting for a free slot (max_running {max_running})"
    pending = JobState.PENDING.value, waiting_reason
    for i, values in enumerate(combos):
        # A sweep's values differ in length: check every task. An array's only value is its
        # index, longest in the last task: checking that one checks them all.
        if templated and (spec.sweep is not None or i == count - 1):
            _check_rendered(*templates.render_task(base.command, base.env, values, count), i)
        if not resolved.met:
            state, reason = blocked_by_deps
        elif max_running is not None and i >= max_running:
            state, reason = waiting_slot
        else:
            state, reason = pending
        own = {"parameters": {k: values[k] for k in params}} if params else {}
        rows.append({"id": ids[i], "state": state, "state_reason": reason, "spec": own, "array_index": i,
                     "event_data": {"job_set": set_id, "array_index": i}})
    store.insert_jobs(session, rows, shared=dict(
        name=spec.name, account_name=spec.account, submitted_by=principal.subject, username=principal.username,
        requested_pool=spec.pool, pool=None, workers=spec.workers,
        gpus_per_worker=spec.gpus_per_worker, total_gpus=spec.total_gpus, time_limit_s=time_limit_s,
        priority=spec.priority, routing_reason="", dispatch_attempts=0, created_at=now, updated_at=now,
        job_set_id=set_id, lineage=None, actor=principal.subject))
    add_dependencies(session, ids, resolved)
    log.info("job set %s: %d tasks (%s)", set_id, count, kind,
             extra={"account": spec.account, "actor": principal.subject})
    return session.get(JobSet, set_id)


def names_of(spec: JobSetSpec) -> list[str]:
    return list(spec.sweep) if spec.sweep is not None else []


def list_tasks(session: Session, set_id: str, *, after_index: int = -1, limit: int = 100,
               states: Sequence[str] = ()) -> list[Job]:
    stmt = select(Job).where(Job.job_set_id == set_id, Job.array_index > after_index)
    if states:
        stmt = stmt.where(Job.state.in_(list(states)))
    return list(session.scalars(stmt.order_by(Job.array_index).limit(limit)))


def cancel_set(session: Session, *, principal: Principal, set_id: str) -> JobSet:
    """Cancel every task not yet ended: waiting ones at once, submitted ones through ``cancelling``."""
    from gateway.jobs import service as jobs

    job_set = get_set_or_raise(session, principal=principal, set_id=set_id)
    why = f"job set cancelled by {principal.username or principal.subject}"
    quiet = session.info.setdefault("flows_quiet_sets", set())
    quiet.add(set_id)  # no slot hand-over to tasks that are being cancelled anyway
    try:
        tasks = session.scalars(select(Job).where(Job.job_set_id == set_id, Job.state.in_(NOT_FINAL))
                                .order_by(Job.id).with_for_update()).all()
        for job in tasks:
            jobs.cancel_job(session, job=job, actor=principal.subject, reason=why)
    finally:
        quiet.discard(set_id)
    return job_set


# ------------------------------------------------------------------ the graph around a job

