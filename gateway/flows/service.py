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
import json
import logging
from collections.abc import Sequence
from typing import Any

from sqlalchemy import JSON, select
from sqlalchemy.orm import Session

from gateway.flows import templates
from gateway.flows.models import JobSet
from gateway.flows.schemas import JobSetSpec
from gateway.identity.principal import Principal
from gateway.jobs.models import Job, JobEvent
from gateway.jobs.schemas import JobSpec, parse_duration_s
from gateway.jobs.states import JobState
from gateway.kit.errors import Forbidden, Invalid, NotFound
from gateway.kit.timeutil import new_id, utcnow

from gateway.flows.graph import (  # noqa: F401 - the dependency half, re-exported for callers
    ACTOR, FINAL, MET, NEVER, NOT_FINAL, NOT_STARTED, SLOT_STATES, WAIT, Resolved, add_dependencies, counts,
    dependencies_of, dependents_for_cascade, dependents_of, judge_job, judge_set, readable_sets, resolve,
)

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
        combos = [dict(zip(names, (templates.format_value(v) for v in combo)))
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


def _render_task(spec: JobSpec, values: dict[str, str], count: int) -> tuple[list[str], dict[str, str]]:
    command = [templates.render(arg, values) for arg in spec.command]
    env = {k: templates.render(v, values) for k, v in spec.env.items()}
    # Set after the user's env (whose ISTHMUS_ keys the schema refuses), so these are the gateway's.
    env["ISTHMUS_ARRAY_INDEX"] = values["index"]
    env["ISTHMUS_ARRAY_COUNT"] = str(count)
    return command, env


def _check_rendered(command: list[str], env: dict[str, str], index: int) -> None:
    """A rendered task obeys the same limits as a submitted job (a long value can overflow them)."""
    try:
        JobSpec._command(command)  # type: ignore[operator]
    except ValueError as exc:
        raise Invalid("body.command", f"task {index} after substitution: {exc}") from None
    for key, value in env.items():
        if len(value) > 4096:
            raise Invalid(f"body.env.{key}", f"task {index} after substitution: value is longer than 4096 characters")


def create_set(session: Session, *, principal: Principal, spec: JobSetSpec, max_tasks: int, max_points: int,
               default_time_limit_s: int, max_time_limit_s: int, caps: Any, waiting_reason: str
               ) -> JobSet:
    """Record a set and all its tasks in the caller's transaction: a few bulk statements.

    Raises:
        Forbidden, Invalid, LimitExceeded: nothing is written.
    """
    from gateway.jobs import service as jobs

    if not principal.may_use(spec.account):
        raise Forbidden(f"you are not a member of account {spec.account!r}")
    if not principal.username:
        raise Forbidden("this caller has no POSIX user mapped; jobs cannot run as it")
    base = spec.job_spec()
    combos = expand(spec, max_tasks=max_tasks, max_points=max_points)
    count = len(combos)
    time_limit_s = parse_duration_s(spec.time_limit) if spec.time_limit else default_time_limit_s
    if time_limit_s > max_time_limit_s:
        raise Invalid("body.time_limit", f"exceeds this gateway's maximum of {max_time_limit_s} s")
    if caps is not None:
        jobs.check_caps(session, account=spec.account, username=principal.username, subject=principal.subject,
                        caps=caps, with_key=False, adding=count)
    resolved = resolve(session, principal=principal, depends_on=spec.depends_on)
    max_running = spec.array.max_running if spec.array else None
    now = utcnow()
    set_id = new_id()
    kind = "sweep" if spec.sweep is not None else "array"
    conn = session.connection()
    try:
        conn.execute(JobSet.__table__.insert(), [dict(
            id=set_id, name=spec.name, account_name=spec.account, submitted_by=principal.subject, kind=kind,
            task_count=count, max_running=max_running, sweep=spec.sweep, created_at=now)])
    except Exception as exc:  # an unknown account fails the foreign key: nothing written
        from sqlalchemy.exc import IntegrityError

        if isinstance(exc, IntegrityError) and jobs._is_foreign_key_violation(exc):
            raise Invalid("body.account", f"unknown account {spec.account!r}") from None
        raise
    stored = base.stored()
    templated = "{{" in "".join(base.command) + "".join(base.env.values())
    job_rows: list[dict[str, Any]] = []
    event_rows: list[dict[str, Any]] = []
    for i, values in enumerate(combos):
        command, env = _render_task(base, values, count)
        # A sweep's values differ in length: check every task. An array's only value is its
        # index, longest in the last task: checking that one checks them all.
        if templated and (spec.sweep is not None or i == count - 1):
            _check_rendered(command, env, i)
        if not resolved.met:
            state, reason = JobState.BLOCKED.value, resolved.reason
        elif max_running is not None and i >= max_running:
            state, reason = JobState.BLOCKED.value, f"waiting for a free slot (max_running {max_running})"
        else:
            state, reason = JobState.PENDING.value, waiting_reason
        job_id = new_id()
        task_spec = {**stored, "command": command, "env": env}
        if spec.sweep is not None:
            task_spec["parameters"] = {k: v for k, v in values.items() if k != "index"}
        job_rows.append(dict(
            id=job_id, name=spec.name, account_name=spec.account, submitted_by=principal.subject,
            username=principal.username, requested_backend=spec.pool, backend=None, state=state,
            state_reason=reason, spec=task_spec, workers=spec.workers, gpus_per_worker=spec.gpus_per_worker,
            total_gpus=spec.total_gpus, time_limit_s=time_limit_s, priority=spec.priority, routing_reason="",
            dispatch_attempts=0, created_at=now, updated_at=now, job_set_id=set_id, array_index=i))
        event_rows.append(dict(job_id=job_id, at=now, actor=principal.subject, kind="state", from_state=None,
                               to_state=state, reason="submitted", data={"job_set": set_id, "array_index": i}))
    bulk_insert(conn, Job.__table__, job_rows)
    bulk_insert(conn, JobEvent.__table__, event_rows)
    add_dependencies(session, [r["id"] for r in job_rows], resolved)
    log.info("job set %s: %d tasks (%s)", set_id, count, kind,
             extra={"account": spec.account, "actor": principal.subject})
    return session.get(JobSet, set_id)


def bulk_insert(conn, table, rows: list[dict[str, Any]]) -> None:
    """Insert many rows in the connection's transaction: COPY on Postgres, executemany elsewhere.

    psycopg's executemany still sends one INSERT per row (pipelined); COPY streams them all
    in one command, which is what makes a 10,000-task array one short request
    (bench/bench_arrays.py). Same transaction either way: a failure writes nothing.
    """
    if not rows:
        return
    if conn.dialect.name != "postgresql":
        conn.execute(table.insert(), rows)
        return
    columns = list(rows[0])
    json_cols = {c for c in columns if isinstance(table.c[c].type, JSON)}
    raw = conn.connection.driver_connection
    with raw.cursor() as cur, cur.copy(f"COPY {table.name} ({', '.join(columns)}) FROM STDIN") as copy:
        for row in rows:
            copy.write_row([json.dumps(row[c]) if c in json_cols and row[c] is not None else row[c]
                            for c in columns])


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

