"""The dashboard's words for a job: where it runs, its estimated start, and the jobs table's rows."""

from __future__ import annotations

import functools
from types import SimpleNamespace
from typing import Any

from markupsafe import Markup

from gateway.domain.states import JobState
from gateway.jobs import repository as jobs_repo
from gateway.kit.timeutil import as_utc, utcnow
from gateway.models.jobs import Job
from gateway.ui.rendering import templates

PENDING = JobState.PENDING.value


def job_pool(job: Job) -> str:
    """The pool a job runs on (or asked for): one place for the pools rework to re-point."""
    return job.pool or job.requested_pool


def estimate_of(job: Job) -> dict[str, Any] | None:
    """A pending job's estimated start (docs/dispatch.md, "Estimates"), as the page shows it.

    Only while pending, as in the API: once dispatched the estimate no longer applies. With
    no start, ``reason`` says why there is none; a job no dispatch round has looked at yet
    has neither.
    """
    if job.state != PENDING:
        return None
    return _estimate(as_utc(job.estimated_start), job.estimated_pool, job.estimate_reason)


def _estimate(start, pool: str | None, reason: str | None, in_words: str | None = None) -> dict[str, Any]:
    """``estimate_of``'s words for a pending job; ``in_words``: ``_from_now(start)`` already said."""
    if start is None:
        return {"at": None, "reason": reason or "not estimated yet: no dispatch round has seen it"}
    return {"at": start.strftime("%Y-%m-%d %H:%M:%S UTC"), "iso": start.isoformat(timespec="seconds"),
            "in": _from_now(start) if in_words is None else in_words, "pool": pool or "", "reason": reason or ""}


def _from_now(at) -> str:
    seconds = int((at - utcnow()).total_seconds())
    if seconds <= 0:
        return "due now"
    if seconds < 90:
        return f"in {seconds} s"
    if seconds < 90 * 60:
        return f"in {round(seconds / 60)} min"
    if seconds < 48 * 3600:
        return f"in {seconds / 3600:.1f} h"
    return f"in {seconds / 86400:.1f} days"


_ESTIMATE = ("at", "iso", "in", "pool", "reason")
_STATE, _START = (next(i for i, c in enumerate(jobs_repo.IN_TABLE) if c.key == k) for k in ("state", "estimated_start"))


def table_rows(rows: list[tuple]) -> Markup:
    """The jobs table's rows (``jobs/repository.py`` ``IN_TABLE``, as tuples) as HTML: each row
    as ``job_row`` rendered it for the same values, and for a pending job with an estimated
    start, the same "in 5 min" (the one value that follows the clock)."""
    return Markup("".join([job_row(r, _from_now(as_utc(r[_START])) if r[_STATE] == PENDING and r[_START] is not None
                                   else None) for r in rows]))


@functools.lru_cache(maxsize=4096)
def job_row(row: tuple, in_words: str | None) -> str:
    """One row of the jobs table (templates/job_row.html), rendered once for each distinct row
    read and kept: the page's 200 rows were most of its time, and between two polls of the
    page (every 5 s) few of them change (issue #46). A pending job's "in 5 min" is part of the
    key (``in_words``), so a row whose words change is rendered anew."""
    job_id, name, account, user, state, why, pool, requested, created_at, start, est_pool, est_reason = row
    estimate = None
    if state == PENDING:
        words = _estimate(as_utc(start), est_pool, est_reason, in_words)
        estimate = SimpleNamespace(**{k: words.get(k) for k in _ESTIMATE})
    # Attributes, not dict keys: Jinja tries an attribute first, and a dict's missing one is an exception.
    j = SimpleNamespace(id=job_id, name=name, account=account, user=user, state=state, why=why or "",
                        pool=pool or requested or "", created_at=created_at, estimate=estimate)
    return templates.get_template("job_row.html").render(j=j)
