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
from datetime import datetime
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
from gateway.kit.timeutil import new_id, new_ids, utcnow

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
    templated = "{{" in "".join(base.command) + "".join(base.env.values())
    encoder = SpecEncoder(base.stored(), base.command, base.env, count, params=names_of(spec))
    ids = new_ids(count)
    job_rows: list[tuple[Any, ...]] = []
    event_rows: list[tuple[Any, ...]] = []
    blocked_by_deps = JobState.BLOCKED.value, resolved.reason
    waiting_slot = JobState.BLOCKED.value, f"waiting for a free slot (max_running {max_running})"
    pending = JobState.PENDING.value, waiting_reason
    for i, values in enumerate(combos):
        # A sweep's values differ in length: check every task. An array's only value is its
        # index, longest in the last task: checking that one checks them all.
        if templated and (spec.sweep is not None or i == count - 1):
            _check_rendered(*_render_task(base, values, count), i)
        if not resolved.met:
            state, reason = blocked_by_deps
        elif max_running is not None and i >= max_running:
            state, reason = waiting_slot
        else:
            state, reason = pending
        job_rows.append((ids[i], state, reason, encoder.encode(values), i))
        event_rows.append((ids[i], state, f'{{"job_set": "{set_id}", "array_index": {i}}}'))
    bulk_insert(conn, Job.__table__, dict(
        name=spec.name, account_name=spec.account, submitted_by=principal.subject, username=principal.username,
        requested_backend=spec.pool, backend=None, workers=spec.workers,
        gpus_per_worker=spec.gpus_per_worker, total_gpus=spec.total_gpus, time_limit_s=time_limit_s,
        priority=spec.priority, routing_reason="", dispatch_attempts=0, created_at=now, updated_at=now,
        job_set_id=set_id), ("id", "state", "state_reason", "spec", "array_index"), job_rows)
    bulk_insert(conn, JobEvent.__table__, dict(at=now, actor=principal.subject, kind="state", from_state=None,
                                               reason="submitted"), ("job_id", "to_state", "data"), event_rows)
    add_dependencies(session, ids, resolved)
    log.info("job set %s: %d tasks (%s)", set_id, count, kind,
             extra={"account": spec.account, "actor": principal.subject})
    return session.get(JobSet, set_id)


def names_of(spec: JobSetSpec) -> list[str]:
    return list(spec.sweep) if spec.sweep is not None else []


class SpecEncoder:
    """A task's stored spec as JSON text, exactly ``json.dumps`` of what :func:`_render_task` gives.

    The set's spec is encoded once, split at its placeholders; a task's text is then the
    literal pieces joined with its (JSON-escaped) values. JSON escaping works character by
    character, so escaping the pieces one by one equals escaping the rendered string; the
    placeholders are found in the raw strings, as :func:`templates.render` finds them.
    Saves a ``json.dumps`` of the whole spec per task (most of a 10,000-task request's
    Python time, bench/bench_arrays.py).
    """

    def __init__(self, stored: dict[str, Any], command: list[str], env: dict[str, str], count: int,
                 params: list[str]) -> None:
        marks = {key: f"\x00{key}-{new_id()}" for key in ("command", "env", "parameters")}
        doc = {**stored, "command": marks["command"], "env": marks["env"]}
        if params:
            doc["parameters"] = marks["parameters"]
        pieces: list[str | _Name] = [json.dumps(doc)]
        env = {**env, "ISTHMUS_ARRAY_INDEX": "{{ index }}", "ISTHMUS_ARRAY_COUNT": str(count)}
        parts = {
            "command": ["["] + _joined([['"', *_template(arg), '"'] for arg in command]) + ["]"],
            "env": ["{"] + _joined([[json.dumps(k) + ': "', *_template(v), '"'] for k, v in env.items()]) + ["}"],
            "parameters": ["{"] + _joined([[json.dumps(k) + ': "', _Name(k), '"'] for k in params]) + ["}"],
        }
        for key, mark in marks.items():
            token = json.dumps(mark)
            out: list[str | _Name] = []
            for piece in pieces:
                if isinstance(piece, str) and token in piece:
                    before, after = piece.split(token)
                    out += [before, *parts[key], after]
                else:
                    out.append(piece)
            pieces = out
        # Merge neighbouring literals: literals[0], then (name, literal) pairs.
        self.literals: list[str] = [""]
        self.names: list[str] = []
        for piece in pieces:
            if isinstance(piece, _Name):
                self.names.append(piece)
                self.literals.append("")
            else:
                self.literals[-1] += piece
        self.rest = list(zip(self.names, self.literals[1:]))
        self.plain = all(n == "index" for n in self.names)  # an array: values need no escaping

    def encode(self, values: dict[str, str]) -> str:
        if self.plain:
            return self.literals[0] + "".join([values[n] + lit for n, lit in self.rest])
        escaped = {k: json.dumps(v)[1:-1] for k, v in values.items()}
        return self.literals[0] + "".join([escaped[n] + lit for n, lit in self.rest])


class _Name(str):
    """A placeholder's parameter name among the literal pieces of a template."""


def _template(text: str) -> list[str | _Name]:
    """A raw string as JSON-escaped literal pieces and parameter names (no quotes)."""
    split = templates.PLACEHOLDER.split(text)
    return [_Name(p) if k % 2 else json.dumps(p)[1:-1] for k, p in enumerate(split)]


def _joined(items: list[list[str | _Name]]) -> list[str | _Name]:
    out: list[str | _Name] = []
    for k, item in enumerate(items):
        if k:
            out.append(", ")
        out += item
    return out


_COPY_ESCAPES = str.maketrans({"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"})


def _copy_text(value: Any, is_json: bool = False) -> str:
    """One value in COPY's text format (docs: COPY, "Text Format")."""
    if type(value) is str and not is_json:
        if "\\" in value or "\n" in value or "\r" in value or "\t" in value:
            return value.translate(_COPY_ESCAPES)
        return value
    if value is None:
        return "\\N"
    if is_json and not isinstance(value, str):
        value = json.dumps(value)
    if isinstance(value, bool):
        return "t" if value else "f"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, str):
        # Most values need no escape; looking costs far less than translating.
        if "\\" in value or "\n" in value or "\r" in value or "\t" in value:
            return value.translate(_COPY_ESCAPES)
        return value
    raise TypeError(f"no COPY text form for {type(value).__name__}")


def bulk_insert(conn, table, shared: dict[str, Any], columns: Sequence[str], rows: Sequence[tuple[Any, ...]],
                *, chunk: int = 2000) -> None:
    """Insert many rows in the connection's transaction: COPY on Postgres, executemany elsewhere.

    Each row is ``shared`` (the values every row has) plus its own ``columns`` values, JSON
    columns among those already encoded as text. psycopg's executemany still sends one
    INSERT per row (pipelined); COPY streams them all in one command, and the rows' text is
    built here with the shared part formatted once, which is what makes a 10,000-task
    array one short request (bench/bench_arrays.py). Same transaction either way: a
    failure writes nothing.
    """
    if not rows:
        return
    json_cols = {c.name for c in table.c if isinstance(c.type, JSON)}
    if conn.dialect.name != "postgresql":
        conn.execute(table.insert(), [
            {**shared, **{c: json.loads(v) if c in json_cols and v is not None else v for c, v in zip(columns, row)}}
            for row in rows])
        return
    names = [*shared, *columns]
    head = "".join(_copy_text(v, k in json_cols) + "\t" for k, v in shared.items())
    raw = conn.connection.driver_connection
    with raw.cursor() as cur, cur.copy(f"COPY {table.name} ({', '.join(names)}) FROM STDIN") as copy:
        for start in range(0, len(rows), chunk):
            copy.write("".join([head + "\t".join([_copy_text(v) for v in row]) + "\n"
                                for row in rows[start:start + chunk]]))


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

