"""A list filtered by state reads the same few index entries however many jobs wait (issue #32).

On Postgres, ``GET /v1/jobs?state=succeeded`` asked as one ``state IN (...) ORDER BY id DESC``
was planned as a backward walk of the primary key with a filter: it read every newer job of
another state first (every pending job), so it slowed down as work piled up (0.17 of its
empty-registry rate at 1,000,000 jobs, docs/benchmarks.md). The registry here is grown in SQL
as bench/bench_submit_growth.py documents it: history (succeeded, older) and pending jobs
(newer). The list's own statement is run again under ``EXPLAIN ANALYZE``: the rows it reads
from the job table stay within the page, and the page is the newest jobs of that state.
"""

from __future__ import annotations

import json

import pytest
from sqlalchemy import event

from bench.bench_submit_growth import grow
from tests.jobs.test_api import SPEC, submit


def job_rows_read(plan: dict) -> int:
    """Rows the plan's scans of ``job`` produced or filtered away, over all their loops."""
    n = 0
    if plan.get("Relation Name") == "job":
        n += (plan.get("Actual Rows", 0) + plan.get("Rows Removed by Filter", 0)) * plan.get("Actual Loops", 1)
    return n + sum(job_rows_read(p) for p in plan.get("Plans", []))


def test_a_state_filtered_list_reads_one_page_however_many_jobs_wait(gw, database_url):
    if not database_url.startswith("postgresql"):
        pytest.skip("the plan is Postgres's (SQLite keeps the plain query)")
    first = submit(gw, SPEC).json()["id"]
    grow(database_url, first, history=100_000, pending=5_000)  # pending: all newer than the history
    engine = gw.app.state.engine
    seen: list[tuple[str, dict]] = []

    def note(conn, cursor, statement, parameters, context, executemany):
        if "FROM job" in statement and "ORDER BY" in statement:
            seen.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", note)
    try:
        page = gw.client.get("/v1/jobs?state=succeeded&limit=50", headers=gw.headers("alice", ("team-a",))).json()
    finally:
        event.remove(engine, "before_cursor_execute", note)
    assert len(page["items"]) == 50 and {j["state"] for j in page["items"]} == {"succeeded"}
    ids = [j["id"] for j in page["items"]]
    assert ids == sorted(ids, reverse=True)
    (statement, parameters), = seen
    raw = engine.raw_connection()
    try:
        cur = raw.cursor()
        cur.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + statement, parameters)
        plan = cur.fetchone()[0]
    finally:
        raw.close()
    plan = plan if isinstance(plan, list) else json.loads(plan)
    assert job_rows_read(plan[0]["Plan"]) <= 51 + 1, (statement, json.dumps(plan, indent=1)[:3000])
