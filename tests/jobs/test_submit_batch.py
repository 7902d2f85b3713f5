"""Group commit of submissions (issue #32): many POST /v1/jobs in one transaction.

Each worker records the submissions that arrive while its transaction is in flight
together (gateway/kit/groupcommit.py, ``admission.record_jobs`` -> ``intake.create_many``).
A batch must answer each member as if it had been alone: caps exact, idempotency keys as
before (a duplicate inside one batch too), a refused member writes nothing and does not
fail the others. On SQLite and Postgres.
"""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import event, func, select

from gateway.identity.principal import Principal
from gateway.jobs import admission, store
from gateway.jobs import intake as jobs
from gateway.jobs.schemas import JobSpec
from gateway.kit.db import transaction
from gateway.kit.errors import Conflict, Forbidden, Invalid, LimitExceeded
from gateway.models.jobs import IdempotencyKey, Job, JobEvent

BODY = {"name": "b", "account": "team-a", "command": ["true"], "workers": 1}


def who(user="alice", accounts=("team-a",)) -> Principal:
    return Principal(subject=f"dev:{user}", username=user, accounts=frozenset(accounts))


def sub(user="alice", key=None, **body) -> jobs.Submission:
    return jobs.Submission(principal=who(user, (body.get("account", "team-a"),) if user != "mallory" else ()),
                           spec=JobSpec.model_validate({**BODY, **body}), idempotency_key=key)


def record(gw, submissions):
    """One batch, as the group commit runs it: admission and all, one transaction."""
    with transaction(gw.app.state.sessionmaker) as session:
        return admission.record_jobs(session, gw.app.state.admission, submissions)


def rows(gw, model=Job) -> int:
    with gw.session() as s:
        return s.scalar(select(func.count()).select_from(model))


def test_a_batch_records_each_job_with_its_event(gw):
    results = record(gw, [sub(name=f"j{i}") for i in range(5)])
    assert [created for _, created in results] == [True] * 5
    assert [job.name for job, _ in results] == [f"j{i}" for i in range(5)]
    with gw.session() as s:
        stored = {j.id: j for j in s.scalars(select(Job))}
        events = list(s.scalars(select(JobEvent).order_by(JobEvent.id)))
    assert set(stored) == {job.id for job, _ in results}
    assert [(e.job_id, e.to_state, e.reason, e.actor) for e in events] == [
        (job.id, "pending", "submitted", "dev:alice") for job, _ in results]
    assert all(stored[job.id].state == "pending" and stored[job.id].username == "alice" for job, _ in results)


def test_a_bad_request_beside_good_ones_fails_alone(gw):
    batch = [sub(name="ok1"),
             sub(name="long", time_limit="300d"),        # 422 on the time limit
             sub(user="mallory", name="outsider"),          # 403: not a member
             sub(name="nowhere", account="no-such-account"),  # 422 naming body.account
             sub(name="ok2")]
    results = record(gw, batch)
    assert isinstance(results[1], Invalid) and results[1].errors[0].field == "body.time_limit"
    assert isinstance(results[2], Forbidden)
    assert isinstance(results[3], Invalid) and results[3].errors[0].field == "body.account"
    assert [results[i][0].name for i in (0, 4)] == ["ok1", "ok2"]
    with gw.session() as s:
        assert sorted(s.scalars(select(Job.name))) == ["ok1", "ok2"]  # nothing of the refused ones
        assert s.scalar(select(func.count()).select_from(JobEvent)) == 2


def test_caps_are_judged_in_order_inside_a_batch(gw, site):
    site(max_pending_jobs_per_user=3)
    results = record(gw, [sub(name=f"j{i}") for i in range(5)])
    assert [r[1] for r in results[:3]] == [True] * 3
    for refused in results[3:]:
        assert isinstance(refused, LimitExceeded)
        assert "alice has 3 of 3" in refused.detail and "ISTHMUS_MAX_PENDING_JOBS_PER_USER" in refused.detail
    assert rows(gw) == 3
    # The next batch counts what the last one wrote.
    assert isinstance(record(gw, [sub(name="more")])[0], LimitExceeded)


def test_an_admin_cap_on_a_parent_counts_the_batch_across_its_subtree(gw):
    r = gw.client.put("/v1/admin/accounts/team-a/quota", json={"max_queued_jobs": 2},
                      headers=gw.headers(user="adm", admin=True))
    assert r.status_code == 200, r.text
    results = record(gw, [sub(name="a"), sub(user="bob", name="b"), sub(user="carol", name="c")])
    assert [isinstance(r, tuple) for r in results] == [True, True, False]
    assert "max_queued_jobs of team-a" in results[2].detail
    assert rows(gw) == 2


def test_a_duplicate_key_inside_one_batch_replays_the_first(gw):
    results = record(gw, [sub(key="k1", name="same"), sub(key="k1", name="same"), sub(key="k1", name="other"),
                          sub(name="plain")])
    (first, created1), (again, created2) = results[0], results[1]
    assert created1 is True and created2 is False and again.id == first.id
    assert isinstance(results[2], Conflict)                    # same key, another body: 409
    assert results[3][1] is True
    assert rows(gw) == 2 and rows(gw, IdempotencyKey) == 1
    # And across batches, as before.
    (job, created), = record(gw, [sub(key="k1", name="same")])
    assert job.id == first.id and created is False


def test_a_refused_key_does_not_spend_the_cap_of_its_batch_mates(gw, site):
    site(max_pending_jobs_per_user=2)
    results = record(gw, [sub(key="a", name="x"), sub(key="a", name="y"), sub(name="z"), sub(name="w")])
    assert results[0][1] is True and isinstance(results[1], Conflict)
    assert results[2][1] is True and isinstance(results[3], LimitExceeded)
    assert rows(gw) == 2


def statements(gw, submissions) -> list[str]:
    engine = gw.app.state.engine  # the sync engine: record() runs the batch as the thread pool would
    seen: list[str] = []

    def note(conn, cursor, statement, parameters, context, executemany):
        seen.append(" ".join(statement.split()))

    record(gw, [sub(name="warm")])  # first-use reads (settings caches) are not the hot path
    event.listen(engine, "before_cursor_execute", note)
    try:
        results = record(gw, submissions)
    finally:
        event.remove(engine, "before_cursor_execute", note)
    assert all(isinstance(r, tuple) for r in results), results
    return [s for s in seen if not s.upper().startswith(("BEGIN", "COMMIT"))]


def test_a_batch_costs_the_statements_of_one_submission(gw):
    """The regression guard of group commit: the statements of a batch do not grow with it.
    One submission: the locks (Postgres), one cap read, one insert of the job and its event
    (two on SQLite). Sixteen: the same."""
    one = statements(gw, [sub(name="one")])
    many = statements(gw, [sub(name=f"m{i}") for i in range(16)])
    postgres = gw.app.state.engine.dialect.name == "postgresql"
    assert len(one) == 3, one  # Postgres: locks, read, insert; SQLite: read, two inserts
    assert len(many) == len(one), many
    assert sum("pg_advisory_xact_lock" in s for s in many) == (1 if postgres else 0)


def test_two_users_in_one_batch_cost_one_more_read(gw):
    two = statements(gw, [sub(name="a1"), sub(user="bob", name="b1"), sub(name="a2"), sub(user="bob", name="b2")])
    postgres = gw.app.state.engine.dialect.name == "postgresql"
    assert len(two) == 4, two  # the locks (Postgres) or a second insert (SQLite), two reads, one insert
    assert sum("pg_advisory_xact_lock" in s for s in two) == (1 if postgres else 0)


def test_concurrent_batches_never_pass_a_cap_on_postgres(gw, site, monkeypatch):
    """Two workers' batches at once (two transactions), each of four against a cap of five:
    the second batch counts after the first commits. Each batch is held after its insert,
    before its commit, until both got there or a second passed: without the locks both read
    zero and all eight would be written."""
    if gw.app.state.engine.dialect.name != "postgresql":
        pytest.skip("SQLite serialises writers itself; the race is Postgres's")
    site(max_pending_jobs_per_user=5)
    arrived = []
    insert = store.insert_jobs

    def held(session, new_rows, **kw):
        insert(session, new_rows, **kw)
        arrived.append(1)
        deadline = time.monotonic() + 1
        while len(arrived) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)

    monkeypatch.setattr(store, "insert_jobs", held)
    results: list = []

    def worker(tag):
        results.extend(record(gw, [sub(name=f"{tag}{i}") for i in range(4)]))

    threads = [threading.Thread(target=worker, args=(t,)) for t in "xy"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    admitted = [r for r in results if isinstance(r, tuple)]
    assert len(admitted) == 5 and rows(gw) == 5
    assert all(isinstance(r, LimitExceeded) for r in results if not isinstance(r, tuple))


def test_concurrent_api_submissions_share_transactions(gw, monkeypatch):
    """Through the API: requests arriving while a batch is in flight go together in the next
    one (fewer transactions than requests), and each gets its own answer."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from sqlalchemy.util.concurrency import await_only, in_greenlet

    insert = store.insert_jobs

    def slow(session, new_rows, **kw):
        insert(session, new_rows, **kw)
        if in_greenlet():
            await_only(asyncio.sleep(0.2))
        else:
            time.sleep(0.2)  # SQLite: in the thread pool

    monkeypatch.setattr(store, "insert_jobs", slow)
    n = 8

    def post(i):
        return gw.client.post("/v1/jobs", json={**BODY, "name": f"api{i}"}, headers=gw.headers())

    with ThreadPoolExecutor(n) as pool:
        answers = list(pool.map(post, range(n)))
    assert [a.status_code for a in answers] == [202] * n
    assert sorted(a.json()["name"] for a in answers) == sorted(f"api{i}" for i in range(n))
    assert len({a.json()["id"] for a in answers}) == n and rows(gw) == n
    assert gw.app.state.submissions[1].batches < n


GHOST = "0192f0c4-7d3e-7a51-8c3e-5b1f0d9a2c44"  # a job id no one has


def test_a_member_refused_after_its_cap_check_gives_its_place_back(gw, site):
    site(max_pending_jobs_per_user=2)
    results = record(gw, [sub(name="a"), sub(name="dep", depends_on=[{"job": GHOST}]), sub(name="b")])
    assert isinstance(results[1], Invalid) and results[1].errors[0].field.startswith("body.depends_on")
    assert results[0][1] is True and results[2][1] is True
    assert rows(gw) == 2


def test_a_refusal_after_writing_rolls_back_that_request_and_spares_its_batch_mates(gw, monkeypatch):
    """A keyed or dependent member is written at its turn; refused after that (here: its
    dependency rows), its writes cannot stay. The batch is rolled back and re-run member by
    member: the others are recorded, it gets its 422, nothing of it is kept."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from sqlalchemy.util.concurrency import await_only, in_greenlet

    from gateway.jobs import graph

    first = gw.client.post("/v1/jobs", json={**BODY, "name": "first"}, headers=gw.headers()).json()["id"]

    def refuse(*args, **kw):
        raise Invalid("body.depends_on", "refused after writing (test)")

    monkeypatch.setattr(graph, "add_dependencies", refuse)
    alone = gw.client.post("/v1/jobs", json={**BODY, "name": "dep", "depends_on": [{"job": first}]},
                           headers=gw.headers())
    assert alone.status_code == 422 and alone.headers["content-type"].startswith("application/problem+json")
    assert rows(gw) == 1

    insert = store.insert_jobs

    def slow(session, new_rows):  # the first batch is in flight while the others queue
        insert(session, new_rows)
        if in_greenlet():
            await_only(asyncio.sleep(0.2))
        else:
            time.sleep(0.2)

    monkeypatch.setattr(store, "insert_jobs", slow)
    bodies = [{**BODY, "name": f"ok{i}"} for i in range(4)]
    bodies.insert(2, {**BODY, "name": "dep", "depends_on": [{"job": first}]})

    def post(body):
        return gw.client.post("/v1/jobs", json=body, headers=gw.headers())

    with ThreadPoolExecutor(len(bodies)) as pool:
        answers = list(pool.map(post, bodies))
    assert [a.status_code for a in answers] == [202, 202, 422, 202, 202], [a.text for a in answers]
    with gw.session() as s:
        assert sorted(s.scalars(select(Job.name))) == ["first", "ok0", "ok1", "ok2", "ok3"]
