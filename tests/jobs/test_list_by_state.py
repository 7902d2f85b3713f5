"""A list filtered by state reads the same few index entries however many jobs wait (issue #32).

On Postgres, ``GET /v1/jobs?state=succeeded`` asked as one ``state IN (...) ORDER BY id DESC``
was planned as a backward walk of the primary key with a filter: it read every newer job of
another state first (every pending job), so it slowed down as work piled up (0.14 of its
empty-registry rate at 1,000,000 jobs, docs/benchmarks.md). The registry here is grown in SQL
as bench/bench_submit_growth.py documents it: history (succeeded, older) and pending jobs
(newer). The list's own statement is run again under ``EXPLAIN ANALYZE``: the rows it reads
from the job table stay within two pages (the ids, then their rows), and the page is the newest
jobs of that state, the same the plain query gives.
"""

from __future__ import annotations

import json

from sqlalchemy import event, select

from bench.bench_submit_growth import grow
from gateway.models.jobs import Job
from tests.jobs.test_api import SPEC, submit


def job_rows_read(plan: dict) -> int:
    """Rows the plan's scans of ``job`` produced or filtered away, over all their loops."""
    n = 0
    if plan.get("Relation Name") == "job":
        n += (plan.get("Actual Rows", 0) + plan.get("Rows Removed by Filter", 0)) * plan.get("Actual Loops", 1)
    return n + sum(job_rows_read(p) for p in plan.get("Plans", []))


def listed(gw, query: str, *, admin: bool = False) -> tuple[list[str], str | None, list[tuple[str, dict]]]:
    """The ids a list answers, its next cursor, and the statements it ran on the job table."""
    engine = gw.app.state.engine
    seen: list[tuple[str, dict]] = []

    def note(conn, cursor, statement, parameters, context, executemany):
        if "FROM job" in statement and "ORDER BY" in statement:
            seen.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", note)
    try:
        headers = gw.headers("root", (), admin=True) if admin else gw.headers("alice", ("team-a",))
        r = gw.client.get(f"/v1/jobs?{query}", headers=headers)
    finally:
        event.remove(engine, "before_cursor_execute", note)
    assert r.status_code == 200, r.text
    return [j["id"] for j in r.json()["items"]], r.json()["next_cursor"], seen


def expected(gw, states: tuple[str, ...], limit: int, after: str | None = None) -> list[str]:
    """The same page by the plain query: the newest ``limit`` jobs of team-a in ``states``."""
    with gw.app.state.engine.connect() as c:
        stmt = select(Job.id).where(Job.account_name == "team-a", Job.state.in_(states))
        if after:
            stmt = stmt.where(Job.id < after)
        return list(c.scalars(stmt.order_by(Job.id.desc()).limit(limit)))


def test_a_state_filtered_list_reads_one_page_however_many_jobs_wait(gw, database_url):
    made = [submit(gw, SPEC).json()["id"] for _ in range(60)]
    with gw.app.state.engine.begin() as c:  # interleaved states: the pairs' pages are merged
        c.execute(Job.__table__.update().where(Job.id.in_(made[::2])).values(state="succeeded"))
    postgres = database_url.startswith("postgresql")
    if postgres:  # history, then pending jobs all newer than it (SQLite keeps the plain query)
        grow(database_url, made[0], history=100_000, pending=5_000)
    page = 50 if postgres else 20

    ids, cursor, seen = listed(gw, f"state=succeeded&limit={page}")
    assert len(ids) == page and ids == expected(gw, ("succeeded",), page)
    more, _, _ = listed(gw, f"state=succeeded&limit={page}&cursor={cursor}")
    assert more and more == expected(gw, ("succeeded",), page, after=ids[-1])
    both, _, _ = listed(gw, "state=succeeded&state=pending&limit=20")
    assert both == expected(gw, ("succeeded", "pending"), 20)
    # An admin naming the account takes the same path as its members.
    as_admin, _, admin_seen = listed(gw, f"state=succeeded&limit={page}&account=team-a", admin=True)
    assert as_admin == ids
    # An admin's list of every account probes each account there is (team-b's job is newest).
    other = submit(gw, {**SPEC, "account": "team-b"}, user="bob", groups=("team-b",)).json()["id"]
    with gw.app.state.engine.begin() as c:
        c.execute(Job.__table__.update().where(Job.id == other).values(state="succeeded"))
    everyone, _, every_seen = listed(gw, f"state=succeeded&limit={page}", admin=True)
    with gw.app.state.engine.connect() as c:
        assert everyone[0] == other and everyone == list(c.scalars(
            select(Job.id).where(Job.state == "succeeded").order_by(Job.id.desc()).limit(page)))
    if not postgres:
        return
    for statement, parameters in seen[-1:] + admin_seen[-1:] + every_seen[-1:]:
        raw = gw.app.state.engine.raw_connection()
        try:
            cur = raw.cursor()
            cur.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + statement, parameters)
            plan = cur.fetchone()[0]
        finally:
            raw.close()
        plan = plan if isinstance(plan, list) else json.loads(plan)
        # At most a page of ids (limit + 1, the API's look-ahead) per (account, state) pair,
        # then the page's rows: however many jobs wait or ended.
        pairs = len(parameters.get("list_accounts", ())) * len(parameters.get("list_states", ()))
        assert job_rows_read(plan[0]["Plan"]) <= (pairs + 1) * (page + 1), (statement, json.dumps(plan, indent=1)[:3000])
