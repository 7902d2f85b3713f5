"""Queries over jobs. Tenancy is enforced here, once: ``readable_jobs``."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import (
    ARRAY,
    Select,
    String,
    Text,
    and_,
    bindparam,
    cast,
    func,
    or_,
    select,
    true,
)
from sqlalchemy.orm import Session

from gateway.identity.principal import Principal
from gateway.models.accounts import Account
from gateway.models.jobs import IdempotencyKey, Job, JobEvent


def readable_jobs(principal: Principal) -> Select[tuple[Job]]:
    """Every job this caller may see: admins all, others their accounts' jobs."""
    stmt = select(Job)
    if not principal.is_admin:
        stmt = stmt.where(Job.account_name.in_(sorted(principal.accounts)))
    return stmt


def get_readable(session: Session, principal: Principal, job_id: str, *, for_update: bool = False) -> Job | None:
    stmt = readable_jobs(principal).where(Job.id == job_id)
    if for_update:
        stmt = stmt.with_for_update()
    return session.scalars(stmt).first()


def get_for_update(session: Session, job_id: str) -> Job | None:
    """One job, locked, whoever may read it: for a caller the middleware has already bound to
    this very job (its job credential, gateway/jobs/checkpoints.py)."""
    return session.get(Job, job_id, with_for_update=True)


# What a job's reader is shown (the API's JobOut): every column but the dispatcher's own
# bookkeeping. A list reads these as plain rows, not ORM objects (issue #46): a row has the
# same attribute names, and hydrating fifty whole objects cost more than the query.
SHOWN = (Job.id, Job.name, Job.account_name, Job.submitted_by, Job.username, Job.requested_pool, Job.pool, Job.state,
         Job.state_reason, Job.spec, Job.workers, Job.gpus_per_worker, Job.total_gpus, Job.held_gpus, Job.time_limit_s,
         Job.priority, Job.backend_job_id, Job.routing_reason, Job.exit_code, Job.nodes, Job.created_at, Job.updated_at,
         Job.started_at, Job.ended_at, Job.cancel_requested_at, Job.job_set_id, Job.array_index, Job.estimated_start,
         Job.estimated_pool, Job.estimate_reason, Job.attempt, Job.borrowed, Job.checkpoint_at)
# SHOWN with the JSON columns as their stored text (``spec_text``, ``nodes_text``): for a reader
# that keeps what it made of a row by the row's values (gateway/api/jobs.py), which text allows
# and a decoded dict or list does not (unhashable), and whose rows it has seen need no decoding.
SHOWN_AS_TEXT = tuple(cast(c, Text).label(f"{c.key}_text") if c is Job.spec or c is Job.nodes else c for c in SHOWN)
# The dashboard's table of jobs (gateway/ui/templates/jobs.html): no spec, whose JSON it never shows.
IN_TABLE = (Job.id, Job.name, Job.account_name, Job.username, Job.state, Job.state_reason, Job.pool,
            Job.requested_pool, Job.created_at, Job.estimated_start, Job.estimated_pool, Job.estimate_reason)


def list_readable(session: Session, principal: Principal, *, states: Sequence[str] = (),
                  account: str | None = None, pool: str | None = None,
                  after_id: str | None = None, limit: int = 50, job_set: str | None = None,
                  columns: Sequence | None = None) -> list:
    """The caller's jobs, newest first (``after_id``: older than that one): ORM objects, or with
    ``columns`` (``SHOWN``, ``SHOWN_AS_TEXT``, ``IN_TABLE``) rows of just those columns."""
    stmt = readable_jobs(principal)
    if job_set:
        stmt = stmt.where(Job.job_set_id == job_set)
    if account:
        stmt = stmt.where(Job.account_name == account)
    if pool:
        stmt = stmt.where(or_(Job.pool == pool, and_(Job.pool.is_(None), Job.requested_pool == pool)))
    if after_id:
        stmt = stmt.where(Job.id < after_id)
    if states and session.get_bind().dialect.name == "postgresql":
        accounts = _probed_accounts(session, principal, account)
        if accounts and len(accounts) * len(states) <= MAX_LIST_PROBES:
            ids = _newest_ids_per_account_state(stmt, accounts, list(states), limit)
            return _read(session, select(Job).where(Job.id.in_(ids)).order_by(Job.id.desc()), columns)
    if states:
        stmt = stmt.where(Job.state.in_(list(states)))
    return _read(session, stmt.order_by(Job.id.desc()).limit(limit), columns)


def _read(session: Session, stmt: Select, columns: Sequence | None) -> list:
    if columns is None:
        return list(session.scalars(stmt))
    return list(session.execute(stmt.with_only_columns(*columns)))


# A state filter on Postgres walks ix_job_account_state_id once per (account, state) pair, up
# to this many pairs (an admin's list without an account: every account, from the account
# table, which every job's account is in); beyond, the plain query.
MAX_LIST_PROBES = 64


def _probed_accounts(session: Session, principal: Principal, account: str | None) -> list[str]:
    """The accounts a state-filtered list probes: the one named, else the caller's, else (an
    admin) every account, read up to one past MAX_LIST_PROBES."""
    if account:
        return [account]
    if not principal.is_admin:
        return sorted(principal.accounts)
    return list(session.scalars(select(Account.name).order_by(Account.name).limit(MAX_LIST_PROBES + 1)))


def _newest_ids_per_account_state(stmt: Select, accounts: list[str], states: list[str], limit: int):
    """The ids of ``stmt``'s newest ``limit`` jobs in ``states``, read as the newest ``limit`` of
    each (account, state) pair through ix_job_account_state_id and merged (issue #32).

    Asked as one ``state IN (...) ORDER BY id DESC``, Postgres walks the primary key backwards
    with a filter, since most of the table is in a history state; it then reads every newer job
    of another state first (every waiting job, for a list of succeeded ones), a cost that grows
    with the work waiting. Here account and state come from ``unnest`` of two array parameters,
    so the planner cannot fold them into constants and the index's own order is the cheapest:
    at most ``limit`` entries per pair, whatever the registry holds
    (tests/jobs/test_list_by_state.py reads the plan back). Only ids are read there (the index
    holds them), and only bind parameters vary, so SQLAlchemy compiles the statement once.
    An earlier form that selected whole rows from a ``VALUES`` list through an aliased entity
    was bounded in the plan but slower when served: it was compiled anew for every request."""
    acc = func.unnest(bindparam("list_accounts", accounts, type_=ARRAY(String))).table_valued("a") \
        .render_derived(name="list_a")
    sts = func.unnest(bindparam("list_states", states, type_=ARRAY(String))).table_valued("s") \
        .render_derived(name="list_s")
    newest = (stmt.with_only_columns(Job.id).where(Job.account_name == acc.c.a, Job.state == sts.c.s)
              .order_by(Job.account_name.desc(), Job.state.desc(), Job.id.desc()).limit(limit).lateral("newest"))
    return (select(newest.c.id).select_from(acc).join(sts, true()).join(newest, true())
            .order_by(newest.c.id.desc()).limit(limit).scalar_subquery())


def list_events(session: Session, job_id: str, *, after_id: int = 0, limit: int = 500) -> list[JobEvent]:
    stmt = (select(JobEvent).where(JobEvent.job_id == job_id, JobEvent.id > after_id)
            .order_by(JobEvent.id).limit(limit))
    return list(session.scalars(stmt))


def get_idempotency(session: Session, subject: str, key: str) -> IdempotencyKey | None:
    return session.scalars(select(IdempotencyKey).where(
        IdempotencyKey.subject == subject, IdempotencyKey.key == key)).first()


def is_final(session: Session, job_id: str, final_states) -> bool:
    """Whether the job has reached one of ``final_states`` (read fresh: a log follow polls it)."""
    return session.scalar(select(Job.state).where(Job.id == job_id)) in final_states


def waiting_per_pool(session: Session, states: Sequence[str]) -> dict[str, int]:
    """How many jobs wait in ``states`` per pool: the pool they were routed to, else the one
    they asked for (``auto`` for the unrouted)."""
    from sqlalchemy import func

    where = func.coalesce(Job.pool, Job.requested_pool)
    return dict(session.execute(select(where, func.count()).where(Job.state.in_(list(states))).group_by(where)).all())
