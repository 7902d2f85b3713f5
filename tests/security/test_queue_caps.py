"""Finding 10 / issue #15: caps on what one user and one account can have waiting, at submit.

A job counts while it waits (pending, dispatching, queued, requeued). Over a cap the
submission is a 429 problem+json that names the limit, and nothing is recorded.
"""

from __future__ import annotations

import pytest
from sqlalchemy import delete, func, select

from gateway.domain.states import JobState
from gateway.jobs.service import set_state
from gateway.kit.db import transaction
from gateway.models.accounts import Account, AccountQuota
from gateway.models.jobs import IdempotencyKey, Job
from gateway.models.ledger import AccountBalance

ADMIN = {"user": "adm", "admin": True}


def _submit(gw, user="alice", account="team-a", groups=None, key=None):
    headers = gw.headers(user=user, groups=tuple(groups or (account,)))
    if key:
        headers["Idempotency-Key"] = key
    return gw.client.post("/v1/jobs", json={"name": "q", "account": account, "command": ["true"], "workers": 1},
                          headers=headers)


def _count(gw, model=Job) -> int:
    with gw.session() as s:
        return s.scalar(select(func.count()).select_from(model))


def _refused(r, *names: str) -> None:
    assert r.status_code == 429, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    for name in names:
        assert name in r.json()["detail"], r.json()


def _quota(gw, account, **limits):
    r = gw.client.put(f"/v1/admin/accounts/{account}/quota", json=limits, headers=gw.headers(**ADMIN))
    assert r.status_code == 200, r.text


def test_site_cap_per_user_counts_across_accounts_and_frees_on_cancel(gw, site):
    site(max_pending_jobs_per_user=3)
    ids = [_submit(gw, account=a, groups=("team-a", "team-b")).json()["id"] for a in ("team-a", "team-b", "team-a")]
    _refused(_submit(gw, account="team-b", groups=("team-a", "team-b")),
             "alice", "3 of 3", "ISTHMUS_MAX_PENDING_JOBS_PER_USER")
    assert _count(gw) == 3
    assert _submit(gw, user="bob").status_code == 202          # another user is not affected
    gw.client.post(f"/v1/jobs/{ids[0]}/cancel", headers=gw.headers(groups=("team-a",)))
    assert _submit(gw).status_code == 202                       # a cancelled job no longer counts


def test_started_jobs_do_not_count(gw, site):
    site(max_pending_jobs_per_user=1)
    job_id = _submit(gw).json()["id"]
    _refused(_submit(gw), "1 of 1")
    with transaction(gw.app.state.sessionmaker) as s:
        job = s.get(Job, job_id)
        for state in (JobState.DISPATCHING, JobState.QUEUED, JobState.RUNNING):
            set_state(s, job, state, actor="test")
    assert _submit(gw).status_code == 202


def test_site_default_per_account(gw, site):
    site(max_pending_jobs_per_account=2)
    assert _submit(gw, user="alice").status_code == 202
    assert _submit(gw, user="bob").status_code == 202
    _refused(_submit(gw, user="carol"), "team-a", "2 of 2", "ISTHMUS_MAX_PENDING_JOBS_PER_ACCOUNT")
    assert _submit(gw, user="carol", account="team-b").status_code == 202


def test_admin_set_account_cap_replaces_the_site_default(gw, site):
    site(max_pending_jobs_per_account=1)
    _quota(gw, "team-a", max_queued_jobs=2)
    assert _submit(gw, user="alice").status_code == 202
    assert _submit(gw, user="bob").status_code == 202
    _refused(_submit(gw, user="carol"), "max_queued_jobs of team-a", "2 of 2")
    assert _count(gw) == 2


def test_admin_set_per_user_cap(gw):
    _quota(gw, "team-a", max_queued_jobs_per_user=1)
    assert _submit(gw, user="alice").status_code == 202
    _refused(_submit(gw, user="alice"), "max_queued_jobs_per_user of team-a", "alice")
    assert _submit(gw, user="bob").status_code == 202


def test_parent_cap_covers_its_subtree(gw):
    admin = gw.headers(**ADMIN)
    for body in ({"name": "org"}, {"name": "team-c", "parent": "org"}, {"name": "team-d", "parent": "org"}):
        assert gw.client.post("/v1/admin/accounts", json=body, headers=admin).status_code == 201
    try:
        _quota(gw, "org", max_queued_jobs=2)
        groups = ("team-c", "team-d")
        assert _submit(gw, user="alice", account="team-c", groups=groups).status_code == 202
        assert _submit(gw, user="bob", account="team-d", groups=groups).status_code == 202
        _refused(_submit(gw, user="carol", account="team-d", groups=groups), "max_queued_jobs of org")
    finally:  # the shared clean-up deletes accounts in one statement: children first here
        with transaction(gw.app.state.sessionmaker) as s:
            s.execute(delete(Job).where(Job.account_name.in_(["team-c", "team-d"])))
            for table in (AccountQuota, AccountBalance):
                s.execute(delete(table).where(table.account_name.in_(["org", "team-c", "team-d"])))
            s.execute(delete(Account).where(Account.name.in_(["team-c", "team-d"])))
            s.execute(delete(Account).where(Account.name == "org"))


def test_idempotency_keys_per_caller_are_capped_but_replays_work(gw, site):
    site(max_idempotency_keys_per_user=2)
    first = _submit(gw, key="k1")
    assert first.status_code == 202 and _submit(gw, key="k2").status_code == 202
    _refused(_submit(gw, key="k3"), "2 of 2", "ISTHMUS_MAX_IDEMPOTENCY_KEYS_PER_USER")
    replay = _submit(gw, key="k1")
    assert replay.status_code == 200 and replay.json()["id"] == first.json()["id"]
    assert _count(gw, IdempotencyKey) == 2 and _count(gw) == 2
    assert _submit(gw, user="bob", key="k3").status_code == 202  # per caller


def test_defaults_are_sane(gw):
    s = gw.settings
    assert 100 <= s.max_pending_jobs_per_user <= s.max_pending_jobs_per_account
    assert s.max_idempotency_keys_per_user >= s.max_pending_jobs_per_user


@pytest.mark.parametrize("case", ["sets, account cap", "sets, user cap", "single jobs, account cap"])
def test_concurrent_requests_never_pass_a_cap_on_postgres(gw, site, monkeypatch, case):
    """Issue #27 finding 3: six concurrent submissions against a pending-job cap.

    Each request is held, after its cap check and its inserts and before its commit, until
    all six are there or a second has passed: without a lock all six count the same jobs
    and all commit (24 jobs against a cap of 10); with it the later ones count after the
    earlier ones commit.
    """
    import asyncio
    import itertools
    import time
    from concurrent.futures import ThreadPoolExecutor

    from sqlalchemy.util.concurrency import await_only, in_greenlet

    from gateway.flows import service as flows
    from gateway.jobs import store

    if not gw.settings.database_url.startswith("postgresql"):
        pytest.skip("SQLite serialises writers itself; the race is Postgres's")
    n = 6
    tasks, limit = (4, 10) if case.startswith("sets") else (1, 3)
    if case.endswith("account cap"):
        _quota(gw, "team-a", max_queued_jobs=limit)           # six users, one account
        requests = [(f"user{i}", "team-a", ("team-a",)) for i in range(n)]
    else:
        site(max_pending_jobs_per_user=limit)                  # one user, two account trees
        requests = [("alice", ("team-a", "team-b")[i % 2], ("team-a", "team-b")) for i in range(n)]
    arrived = itertools.count(1)
    seen = [0]

    def held(write):
        def written_then_held(*args, **kw):
            out = write(*args, **kw)
            seen[0] = next(arrived)
            deadline = time.monotonic() + 1  # the lock lets only one request at a time get here
            while seen[0] < n and time.monotonic() < deadline:
                if in_greenlet():
                    # POST /v1/jobs runs on the event loop (kit/db.py in_transaction): wait
                    # without blocking it, so the other requests can reach this point.
                    await_only(asyncio.sleep(0.01))
                else:
                    time.sleep(0.01)
            return out
        return written_then_held

    # The last write of each path before the request's commit.
    if case.startswith("sets"):
        monkeypatch.setattr(flows, "add_dependencies", held(flows.add_dependencies))
    else:
        monkeypatch.setattr(store, "insert_jobs", held(store.insert_jobs))

    def submit(req):
        user, account, groups = req
        body = {"name": "race", "account": account, "command": ["true"]}
        path = "/v1/jobs"
        if tasks > 1:
            body, path = {**body, "array": {"count": tasks}}, "/v1/job-sets"
        return gw.client.post(path, json=body, headers=gw.headers(user=user, groups=groups)).status_code

    with ThreadPoolExecutor(n) as pool:
        codes = list(pool.map(submit, requests))
    accepted = limit // tasks
    assert sorted(codes) == [202] * accepted + [429] * (n - accepted), codes
    assert _count(gw) == accepted * tasks <= limit
