"""The polled reads of jobs (a list, one job), as statements built once (issue #46).

The API's list and one job and the dashboard's jobs table are read far more often than
anything else. Their statements are built from ``repository.readable_jobs`` (tenancy stays
there) once per shape, the filters given and whose accounts, and sent as compiled text
(``kit/db.py`` ``CompiledRead``): no statement built, keyed and looked up per request, and
rows as plain named tuples. What they return is what ``repository.list_readable`` and
``repository.get_readable`` read.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from types import SimpleNamespace

from sqlalchemy import and_, bindparam, exists, or_, select
from sqlalchemy.orm import Session

from gateway.identity.principal import Principal
from gateway.jobs import repository
from gateway.kit.db import compiled_read
from gateway.models.flows import JobDependency
from gateway.models.jobs import Job, JobEvent

# The columns a list may read, by name: a statement's shape names them.
COLUMNS = {"shown": repository.SHOWN_AS_TEXT, "table": repository.IN_TABLE}


def _whose(principal: Principal):
    """The part of the caller that ``readable_jobs`` puts in the statement."""
    return True if principal.is_admin else tuple(sorted(principal.accounts))


def list_readable(session: Session, principal: Principal, *, columns: str, states: Sequence[str] = (),
                  account: str | None = None, pool: str | None = None, after_id: str | None = None,
                  limit: int = 50, job_set: str | None = None, as_tuples: bool = False) -> list:
    """``repository.list_readable`` with ``columns`` (a name of ``COLUMNS``): the caller's jobs,
    newest first, as rows (``as_tuples``: plain tuples in the columns' order). A state filter
    reads through the repository (its plan walks an index per account and state)."""
    if states:
        rows = repository.list_readable(session, principal, states=states, account=account, pool=pool,
                                        after_id=after_id, limit=limit, job_set=job_set, columns=COLUMNS[columns])
        return [tuple(r) for r in rows] if as_tuples else rows
    shape = ("list", columns, _whose(principal), bool(job_set), bool(account), bool(pool), bool(after_id))

    def build():
        stmt = repository.readable_jobs(principal)
        if job_set:
            stmt = stmt.where(Job.job_set_id == bindparam("r_job_set", None))
        if account:
            stmt = stmt.where(Job.account_name == bindparam("r_account", None))
        if pool:
            stmt = stmt.where(or_(Job.pool == bindparam("r_pool", None),
                                  and_(Job.pool.is_(None), Job.requested_pool == bindparam("r_pool", None))))
        if after_id:
            stmt = stmt.where(Job.id < bindparam("r_after", None))
        return stmt.with_only_columns(*COLUMNS[columns]).order_by(Job.id.desc()).limit(bindparam("r_limit", None))

    read = compiled_read(session, shape, build)
    params = {"r_job_set": job_set, "r_account": account, "r_pool": pool, "r_after": after_id, "r_limit": limit}
    return read.tuples(session, params) if as_tuples else read.rows(session, params)


def one(session: Session, principal: Principal, job_id: str):
    """The job the caller may read, as a row of ``repository.SHOWN_AS_TEXT`` plus ``lineage``
    and whether anything ties it to other jobs (``has_dependencies``: it waits for a job or
    set; ``has_dependents``: a job waits for it or its set), or None. A job with neither (most)
    needs no more statements to be shown."""
    def build():
        waits = exists().where(JobDependency.job_id == Job.id)
        awaited = or_(exists().where(JobDependency.on_job_id == Job.id),
                      and_(Job.job_set_id.is_not(None), exists().where(JobDependency.on_set_id == Job.job_set_id)))
        return (repository.readable_jobs(principal)
                .with_only_columns(*repository.SHOWN_AS_TEXT, Job.lineage, waits.label("has_dependencies"),
                                   awaited.label("has_dependents"))
                .where(Job.id == bindparam("r_id", None)))

    rows = compiled_read(session, ("one", _whose(principal)), build).rows(session, {"r_id": job_id})
    return rows[0] if rows else None


def as_job(row) -> SimpleNamespace:
    """A row of :func:`one` with a job's attributes as its readers use them (``spec_of``,
    ``checkpoint_dir_of``, ``at_risk``, the dashboard's job page): the JSON columns decoded,
    ``job_state`` and ``checkpoint_lineage`` as the model has them."""
    from gateway.domain.states import JobState

    return SimpleNamespace(**row._asdict(), spec=json.loads(row.spec_text),
                           nodes=json.loads(row.nodes_text) if row.nodes_text is not None else None,
                           job_state=JobState(row.state), checkpoint_lineage=row.lineage or row.id)


def events(session: Session, job_id: str, *, limit: int = 500) -> list:
    """``repository.list_events`` of a job whose reader is shown its history (the dashboard's job
    page): the columns it shows (not ``data``), oldest first."""
    read = compiled_read(session, "events", lambda: (
        select(JobEvent.id, JobEvent.at, JobEvent.actor, JobEvent.kind, JobEvent.from_state, JobEvent.to_state,
               JobEvent.reason).where(JobEvent.job_id == bindparam("r_id", None))
        .order_by(JobEvent.id).limit(bindparam("r_limit", None))))
    return read.rows(session, {"r_id": job_id, "r_limit": limit})
