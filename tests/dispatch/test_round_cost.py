"""What one dispatch round costs in SQL statements, and that batching it changed no rule.

A round reads the ledger once per round and writes its claims and reservations together
(gateway/ledger/round.py, jobs.Claims): its statement count depends on the number of
accounts it looks at, never on the number of jobs. Counted on the round's own engine, so
the count is the same on a loaded machine. The pools are in-process stand-ins with a fixed
capacity (adapters/standin.py; no cluster is needed to count statements; the same round runs against the real
clusters in test_slurm_e2e.py, test_kube_e2e.py and tests/pools).

Both dialects: SQLite and the stack's Postgres, each test on an empty migrated database.
"""

from __future__ import annotations

import contextlib
import shutil
import uuid
from datetime import UTC

import pytest
from sqlalchemy import event, select, text

from adapters.standin import StandInPool
from gateway.kit.db import make_engine, make_sessionmaker, transaction
from tests.conftest import postgres_database
from tests.ledger.dbfixtures import add_account, sqlite_template  # noqa: F401 - a fixture

POOLS = [("slurm-a", "slurm", "a100", 1.0), ("slurm-b", "slurm", "h100", 2.0),
         ("kube-a", "kubernetes", "a100", 1.0), ("kube-b", "kubernetes", "h100", 1.5)]


@pytest.fixture(scope="module")
def pg_database():
    with postgres_database(migrated=True) as url:
        yield url


@pytest.fixture(params=["sqlite", "postgres"])
def url(request, tmp_path, sqlite_template):
    if request.param == "sqlite":
        path = tmp_path / f"round-{uuid.uuid4().hex[:8]}.db"
        shutil.copy(sqlite_template, path)
        return f"sqlite:///{path}"
    url = request.getfixturevalue("pg_database")
    from gateway.models import metadata

    eng = make_engine(url)
    with eng.begin() as conn:
        conn.execute(text("TRUNCATE " + ", ".join(t.name for t in metadata.sorted_tables) + " CASCADE"))
    eng.dispose()
    return url


@contextlib.contextmanager
def dispatcher(url: str, **settings):
    from gateway.dispatch import Dispatcher
    from gateway.kit.settings import Settings
    from gateway.pools.config import PoolConfig
    from gateway.pools.service import reconcile

    engine = make_engine(url, pool_size=4)
    sessions = make_sessionmaker(engine)
    with transaction(sessions) as s:
        reconcile(s, [PoolConfig(name=n, kind=k, settings=None, gpu_types=(t,), cost=c) for n, k, t, c in POOLS])
    d = Dispatcher(sessions=sessions, backends={n: StandInPool(k, t) for n, k, t, _ in POOLS},
                   settings=Settings(database_url=url, capacity_ttl_s=0, routing_weights="{}", **settings).dispatch)
    d.submitter.submit_all = lambda *a, **kw: None  # the backend side is not what is counted here
    d.engine = engine
    try:
        yield d
    finally:
        engine.dispose()


def add_jobs(d, account: str, n: int, *, gpus: int = 8, time_limit_s: int = 3600) -> list[str]:
    from gateway.kit.timeutil import new_id, utcnow
    from gateway.models.jobs import Job

    ids = []
    with transaction(d.sessions) as s:
        for i in range(n):
            job = Job(id=new_id(), name="j", account_name=account, submitted_by="dev:alice", username="alice",
                      requested_pool="auto", pool=None, state="pending", state_reason="",
                      spec={"command": ["true"], "gpu_type": ("a100", "h100", None)[i % 3]},
                      workers=1, gpus_per_worker=gpus, total_gpus=gpus, time_limit_s=time_limit_s, priority=0,
                      routing_reason="", dispatch_attempts=0, created_at=utcnow(), updated_at=utcnow())
            s.add(job)
            ids.append(job.id)
    return ids


def counted_round(d) -> tuple[list[str], list[str]]:
    seen: list[str] = []

    def note(conn, cursor, statement, parameters, context, executemany):
        seen.append(" ".join(statement.split())[:100])

    event.listen(d.engine, "before_cursor_execute", note)
    try:
        claimed = d.dispatch_round()
    finally:
        event.remove(d.engine, "before_cursor_execute", note)
    return claimed, seen


def setup_accounts(d, n: int, prefix: str = "") -> list[str]:
    """``n`` accounts without limits, half of them under a parent (chains of one and two)."""
    with transaction(d.sessions) as s:
        add_account(s, f"{prefix}org")
        names = [f"{prefix}team-{i}" for i in range(n)]
        for i, name in enumerate(names):
            add_account(s, name, parent=f"{prefix}org" if i % 2 else None)
    return names


def ledger_state(d, accounts=()) -> dict:
    from gateway.ledger import reading as ledger_reading
    from gateway.models.jobs import Job
    from gateway.models.ledger import Reservation

    with transaction(d.sessions) as s:
        return {"problems": ledger_reading.verify(s),
                "dispatching": set(s.scalars(select(Job.id).where(Job.state == "dispatching"))),
                "reserved": set(s.scalars(select(Reservation.job_id).where(Reservation.status == "reserved"))),
                "balances": {a: ledger_reading.get_balance(s, a).reserved_gpus for a in accounts}}


def test_a_greedy_round_costs_the_same_statements_for_20_or_100_jobs(url):
    """100 claims from 10 accounts without limits: a few statements per account, none per job."""
    counts = {}
    with dispatcher(url, scheduling_policy="greedy", dispatch_batch=100) as d:
        before: set[str] = set()
        for per_account in (2, 10):
            p = f"p{per_account}-"
            for a in setup_accounts(d, 10, prefix=p):
                add_jobs(d, a, per_account)
            # A full batch both times (an underfilled round also asks which accounts have jobs).
            d.settings = d.settings.model_copy(update={"dispatch_batch": 10 * per_account})
            claimed, seen = counted_round(d)
            assert len(claimed) == 10 * per_account, seen
            counts[per_account] = seen
            state = ledger_state(d, (f"{p}org", f"{p}team-0", f"{p}team-1"))
            assert state["problems"] == []
            assert state["dispatching"] - before == state["reserved"] - before == set(claimed)
            before |= set(claimed)
            assert state["balances"][f"{p}team-0"] == 8 * per_account
            assert state["balances"][f"{p}org"] == 8 * per_account * 5  # its five children's
    import difflib
    assert len(counts[10]) == len(counts[2]), "\n".join(difflib.unified_diff(counts[2], counts[10], lineterm=""))
    # Pick: one loose index scan + one query per account (no per-account cap: each account's
    # share depends on the one before); ledger read once; claims and ledger writes one
    # statement each (Postgres: the claims' UPDATE and events together, the balances in one
    # UPDATE). 740 before batching (7 per job); 35 allowed before session 6, when the counts
    # were 26 (Postgres) and 28 (SQLite); 25 allowed before session 8, which made the ledger's
    # writes one statement on Postgres and merged three pairs of reads. Session 16 added one: the
    # round reads the windows and advance reservations it plans with (issue #31), in one statement.
    assert len(counts[10]) <= (19 if url.startswith("postgresql") else 26), counts[10]


def test_a_reservation_round_asks_no_admission_check_per_pool_without_limits(url):
    # Every job of the window starts (a waiting job's first reason is an event of its own,
    # which SQLite inserts one by one).
    with dispatcher(url, scheduling_policy="reservation", dispatch_batch=128, scheduling_window=128,
                    scheduling_per_account=16) as d:
        accounts = setup_accounts(d, 8)
        for a in accounts:
            add_jobs(d, a, 16)
        claimed, seen = counted_round(d)
        assert len(claimed) == 128
        # 7,686 before: admission_check for every (job, pool) pair. 40 allowed before session 6 (25 on
        # Postgres, 27 on SQLite); Postgres now picks the 8 accounts in one statement and writes the
        # claims with their events in one (SQLite: a query per account, executemany writes).
        # 17 allowed before session 8: the ledger's writes are now one statement on Postgres.
        # +1 in session 16: the windows and advance reservations, one statement (issue #31).
        assert len(seen) <= (11 if url.startswith("postgresql") else 25), "\n".join(seen)
        state = ledger_state(d)
        assert state["problems"] == []
        assert state["dispatching"] == state["reserved"] == set(claimed)


def test_limits_still_refuse_and_hold_with_the_ledgers_words(url):
    """Accounts with a limit in their chain take the per-job rules: same refusals, same reasons."""
    from gateway.models.jobs import Job

    with dispatcher(url, scheduling_policy="greedy", dispatch_batch=100) as d:
        with transaction(d.sessions) as s:
            add_account(s, "capped", max_gpus=16)  # room for two 8-GPU gangs
            add_account(s, "org", max_gpus=24)
            add_account(s, "under-org", parent="org")  # no limit of its own; its parent's applies
            add_account(s, "budget", budget_gpu_seconds=8 * 3600)  # one 8-GPU hour a month
            add_account(s, "free")
        capped = add_jobs(d, "capped", 4)
        under = add_jobs(d, "under-org", 4)
        budget = add_jobs(d, "budget", 1, gpus=16)  # needs two hours: never fits the budget
        free = add_jobs(d, "free", 4)
        d.dispatch_round()
        with transaction(d.sessions) as s:
            jobs = {j.id: j for j in s.scalars(select(Job))}
            state = {i: jobs[i].state for i in jobs}
            assert [state[i] for i in free] == ["dispatching"] * 4
            assert sorted(state[i] for i in capped) == ["dispatching", "dispatching", "pending", "pending"]
            assert sorted(state[i] for i in under) == ["dispatching"] * 3 + ["pending"]
            waiting = [jobs[i] for i in capped if state[i] == "pending"]
            assert all("capped: 16 of 16 concurrent GPUs in use, job needs 8" in j.state_reason
                       for j in waiting), [j.state_reason for j in waiting]
            [held] = [jobs[i] for i in under if state[i] == "pending"]
            assert "org: 24 of 24 concurrent GPUs in use, job needs 8" in held.state_reason
            assert state[budget[0]] == "failed"
            assert "budget's monthly GPU-hour budget is 8.0 GPU-hours" in jobs[budget[0]].state_reason
        assert ledger_state(d)["problems"] == []


def test_a_limit_set_or_a_move_under_the_round_makes_it_claim_again(url):
    """The batch is written under the chains' locks only if nothing it relied on changed: the
    tree, no limit on a chain judged without one, and a limited chain's totals."""
    from gateway.domain.quota import Tally
    from gateway.kit.timeutil import utcnow
    from gateway.ledger import chains as ledger_chains
    from gateway.ledger import service as ledger
    from gateway.ledger.round import RoundLedger
    from gateway.models.accounts import Account, AccountQuota
    from gateway.models.jobs import Job

    with dispatcher(url, scheduling_policy="greedy") as d:
        with transaction(d.sessions) as s:
            add_account(s, "org")
            add_account(s, "team", parent="org")
            add_account(s, "other")
        [job_id, other_id] = add_jobs(d, "team", 2)
        for change in ("limit", "move", "totals"):
            with pytest.raises(ledger_chains.ChainChanged), transaction(d.sessions) as s:
                job = s.get(Job, job_id)
                if change == "totals":  # team may hold one gang: the round judges this one fits
                    s.add(AccountQuota(account_name="team", max_gpus=job.total_gpus))
                    s.flush()
                rl = RoundLedger(s, accounts_=["team"], now=utcnow())
                tally = Tally(rl.view)
                assert tally.limited("team") == (change == "totals")
                assert tally.reserve(job, "slurm-a", job.total_gpus, None) is None
                if change == "limit":
                    s.add(AccountQuota(account_name="org", max_gpus=4))
                elif change == "move":
                    s.get(Account, "team").parent_name = "other"
                else:  # another writer reserves the other gang before the round takes the locks
                    ledger.reserve(s, job=s.get(Job, other_id), pool="slurm-a", actor="test")
                s.flush()
                rl.write(tally.reservations, actor="test")
        # And a dispatch round, meeting nothing of the kind, reserves each once.
        assert sorted(d.dispatch_round()) == sorted([job_id, other_id])
        assert d.dispatch_round() == []
        assert ledger_state(d)["problems"] == []


def test_two_dispatchers_batching_at_once_claim_each_job_once(url):
    """Concurrent rounds on shared chains: every job claimed and reserved once, totals = entries."""
    import threading

    from gateway.models.jobs import JobEvent

    if url.startswith("sqlite"):
        pytest.skip("SQLite serialises writers (BEGIN IMMEDIATE): nothing runs at once")
    with dispatcher(url, scheduling_policy="greedy", dispatch_batch=30) as one, \
            dispatcher(url, scheduling_policy="greedy", dispatch_batch=30) as two:
        accounts = setup_accounts(one, 6)  # three of them share the parent "org"
        ids = {j for a in accounts for j in add_jobs(one, a, 25)}
        claimed: list[list[str]] = [[], []]
        errors: list[BaseException] = []

        def run(d, into):
            try:
                for _ in range(8):
                    into.extend(d.dispatch_round())
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(d, c)) for d, c in ((one, claimed[0]), (two, claimed[1]))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert errors == []
        assert not set(claimed[0]) & set(claimed[1])
        assert sorted(claimed[0] + claimed[1]) == sorted(ids)
        state = ledger_state(one, ("org",))
        assert state["problems"] == []
        assert state["dispatching"] == state["reserved"] == ids
        assert state["balances"]["org"] == 8 * 25 * 3
        with transaction(one.sessions) as s:
            claims = s.execute(select(JobEvent.job_id, JobEvent.data).where(JobEvent.to_state == "dispatching")).all()
        assert sorted(j for j, _ in claims) == sorted(ids)  # one claim event per job
        assert all(isinstance(data, dict) and data["pool"] for _, data in claims)


def test_the_plans_releases_follow_the_rule_to_the_microsecond(url):
    """planning.releases (computed by Postgres there, in Python on SQLite): each gang's units and expected end,
    gangs of one pool that end at the same moment summed into one release."""
    from datetime import datetime, timedelta

    from gateway.dispatch import planning
    from gateway.models.jobs import Job

    with dispatcher(url) as d:
        setup_accounts(d, 1)
        ids = add_jobs(d, "team-0", 8, gpus=12)
        now = datetime(2026, 11, 2, 12, 0, 0, 654321, tzinfo=UTC)
        t0 = datetime(2026, 11, 2, 11, 59, 58, 123457, tzinfo=UTC)  # odd microseconds: exact floats
        # (state, pool, started_at, updated_at, held_gpus, time limit)
        gangs = [("running", "slurm-a", t0, t0, 16, 7), ("running", "kube-a", None, t0, 0, 3600),
                 ("starting", "kube-a", t0 - timedelta(hours=2), t0, 12, 60),  # past its end: "soon"
                 ("dispatching", "kube-b", None, t0 + timedelta(microseconds=1), None, 1800),
                 ("queued", "slurm-b", None, t0, 16, 900), ("cancelling", "kube-a", t0, t0, 12, 3600),
                 ("running", "gone-pool", t0, t0, 12, 60), ("pending", None, None, t0, None, 60)]
        with transaction(d.sessions) as s:
            for job_id, (state, pool, started, updated, held, limit) in zip(ids, gangs, strict=True):
                s.execute(Job.__table__.update().where(Job.id == job_id).values(
                    state=state, pool=pool, started_at=started, updated_at=updated, held_gpus=held,
                    time_limit_s=limit, workers=2))
        views = {v.name: v for v in d.views(fresh=True).values()}
        with transaction(d.sessions) as s:
            rels, held = planning.releases(s, views, now=now)
        soon = now.timestamp() + 1.0
        want = [("slurm-a", 2, t0.timestamp() + 7),  # whole nodes on a node-exclusive pool
                ("kube-a", 12, now.timestamp() + 3600),  # no start known: from now; held 0 -> its GPUs
                ("kube-b", 12, (t0 + timedelta(microseconds=1)).timestamp() + 1800),
                ("slurm-b", 2, t0.timestamp() + 900),
                ("kube-a", 24, soon)]  # past its end, and being cancelled: one release of both, soon
        assert sorted((r.pool, r.units, r.at) for r in rels) == sorted(want)
        assert held == {"slurm-a": 2, "kube-a": 36, "kube-b": 12, "slurm-b": 2}


@pytest.mark.parametrize("limit,per_account", [(60, 8), (37, 5), (500, None)])
def test_the_pick_takes_each_accounts_share_in_fair_share_order_and_locks_only_those(url, limit, per_account):
    """pending_order (one statement per batch of accounts on Postgres): the rule, and no row locked but those picked."""
    from datetime import timedelta

    from gateway.dispatch.claim import pending_order
    from gateway.kit.timeutil import utcnow
    from gateway.models.jobs import Job

    pg = url.startswith("postgresql")
    with dispatcher(url) as d:
        names = setup_accounts(d, 24)
        counts = {a: (i * 7) % 13 if i % 3 else 0 for i, a in enumerate(names)}  # many empty: the probe misses
        jobs = {a: add_jobs(d, a, n) for a, n in counts.items() if n}
        now = utcnow()
        with transaction(d.sessions) as s:
            for i, job_id in enumerate(j for ids in jobs.values() for j in ids):
                s.execute(Job.__table__.update().where(Job.id == job_id).values(
                    priority=i % 4, next_attempt_at=now + timedelta(hours=1) if i % 5 == 0 else None))
        factors = {a: 1.0 / (1 + i) for i, a in enumerate(names[:-2])}  # the last two have none: picked last
        with transaction(d.sessions) as s:
            rows = s.execute(select(Job.id, Job.account_name, Job.priority, Job.next_attempt_at)).all()
        due = {a: sorted((r for r in rows if r.account_name == a and r.next_attempt_at is None),
                         key=lambda r: (-r.priority, r.id)) for a in names}
        want: list[str] = []
        for a in sorted(factors, key=lambda a: (-factors[a], a)) + sorted(names[-2:]):
            want += [r.id for r in due[a][:min(per_account or limit, limit - len(want))]]
        assert len(want) == min(limit, sum(len(v) for v in due.values()))
        with transaction(d.sessions) as s:
            picked = pending_order(s, now=now, limit=limit, lock=pg, factors=factors, per_account=per_account)
            assert [j.id for j in picked] == want
            if pg:  # a second dispatcher meanwhile gets every other due job: nothing else is locked
                with transaction(d.sessions) as other:
                    rest = pending_order(other, now=now, limit=10_000, lock=True, factors=factors)
                    assert sorted(j.id for j in rest) == sorted({r.id for v in due.values() for r in v} - set(want))


def test_a_rounds_claims_and_their_events_are_written_whole_and_in_fair_share_order(url):
    """jobs.Claims.flush (one statement on Postgres): every field of the claim, one event each, in the round's order."""
    from gateway.models.jobs import Job, JobEvent

    with dispatcher(url, scheduling_policy="greedy", dispatch_batch=12) as d:
        for a in setup_accounts(d, 3):
            add_jobs(d, a, 4)
        claimed = d.dispatch_round()
        assert len(claimed) == 12
        with transaction(d.sessions) as s:
            jobs = {j.id: j for j in s.scalars(select(Job).where(Job.id.in_(claimed)))}
            events = list(s.scalars(select(JobEvent).where(JobEvent.to_state == "dispatching").order_by(JobEvent.id)))
        assert [e.job_id for e in events] == claimed  # the claim order: fair-share position 1, 2, ...
        assert [e.data["fairshare_position"] for e in events] == list(range(1, 13))
        for e in events:
            job = jobs[e.job_id]
            assert (e.kind, e.from_state, e.actor) == ("state", "pending", "system:dispatcher")
            assert e.reason == job.state_reason == job.routing_reason and e.reason.startswith(f"routed to {job.pool}")
            assert e.data["pool"] == job.pool and job.held_gpus == 8 and job.dispatch_attempts == 1
            assert job.state == "dispatching" and job.next_attempt_at is not None and job.estimated_start is None
            assert abs((job.updated_at.replace(tzinfo=None) - e.at.replace(tzinfo=None)).total_seconds()) < 1e-6


def test_the_jobs_a_round_holds_back_get_their_reason_estimate_and_one_event(url):
    """Waiting notes (jobs.Claims.note_waiting / note_estimate, written with the claims): reason, estimate,
    one ``waiting`` event when the reason changes, no write at all when only the fair-share position moves
    (a reason written only when it changes in meaning: domain/waiting.py, issue #47)."""
    from gateway.models.jobs import Job, JobEvent

    with dispatcher(url, scheduling_policy="reservation", dispatch_batch=12, scheduling_window=20,
                    scheduling_per_account=10) as d:
        for a in setup_accounts(d, 3):
            add_jobs(d, a, 10)

        def waiting():
            with transaction(d.sessions) as s:
                jobs = {j.id: j for j in s.scalars(select(Job).where(Job.state == "pending",
                                                                      Job.state_reason != ""))}
                events = s.execute(select(JobEvent.job_id, JobEvent.reason).where(JobEvent.kind == "waiting")
                                   .order_by(JobEvent.id)).all()
            return jobs, events

        first = d.dispatch_round()
        assert len(first) == 12
        held, events = waiting()
        assert len(held) == 8
        for i, job in enumerate(sorted(held.values(), key=lambda j: j.state_reason[-4:])):
            assert job.state_reason.startswith("waiting for capacity: held back, starting now would delay a higher "
                                               "job's reservation; behind the 8 jobs that hold reservations")
            assert job.state_reason.endswith(f"(fair-share position {13 + i})")
            assert job.estimated_start is None and job.estimate_reason == (
                "behind the 8 jobs that hold reservations; no estimate yet")
            assert job.updated_at > job.created_at
        assert sorted(j for j, _ in events) == sorted(held) and all(r == held[j].state_reason for j, r in events)
        # A round starting only two: the others wait again at a new place: the same reason in meaning, so
        # neither their reason nor an event is written (the position is the one of the last change).
        d.settings = d.settings.model_copy(update={"dispatch_batch": 2})
        second = d.dispatch_round()
        assert len(second) == 2 and not set(second) & set(first)
        again, events_after = waiting()
        assert events_after[:len(events)] == events
        assert set(again) & set(held)  # some wait in both rounds
        for j in set(again) & set(held):
            assert again[j].state_reason == held[j].state_reason  # the position moved; nothing written
            assert again[j].updated_at == held[j].updated_at
            assert [e for e in events_after if e[0] == j] == [e for e in events if e[0] == j]
        assert ledger_state(d)["problems"] == []
