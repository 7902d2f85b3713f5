"""Two dispatch workers over one database, a pool that stays down: one ``waiting`` event per job
while nothing changes, one more when something does (issue #47, 6; docs/dispatch.md).

Each worker has its own view of the pools, as two ``isthmus worker`` processes do: the pool
that is down is a real Slurm adapter whose slurmrestd refuses connections (each worker's
at its own address, so their error words differ), the other pool an in-process stand-in
whose free GPUs each worker sees differently (its own snapshot, taken at its own time). The
jobs fit on neither. Before issue #47 the two workers' reasons differed in those words and
numbers, and every round wrote each job a new reason and a ``waiting`` event.
"""

from __future__ import annotations

import contextlib

import pytest
from sqlalchemy import func, select

from adapters.slurm.backend import SlurmBackend
from adapters.slurm.settings import SlurmSettings
from adapters.standin import StandInPool
from gateway.audit.service import Who
from gateway.kit.db import make_engine, make_sessionmaker, transaction
from tests.conftest import postgres_database
from tests.dispatch.test_round_cost import setup_accounts
from tests.jobs.live import free_port

pytestmark = pytest.mark.postgres


@pytest.fixture
def pg_url():
    with postgres_database(migrated=True) as url:
        yield url


@contextlib.contextmanager
def worker(url: str, *, busy_idle_nodes: int):
    """One dispatch worker: its own engine, its own backends and views of the two pools."""
    from gateway.dispatch import Dispatcher
    from gateway.kit.settings import Settings
    from gateway.pools.config import PoolConfig
    from gateway.pools.service import reconcile

    engine = make_engine(url, pool_size=2)
    sessions = make_sessionmaker(engine)
    with transaction(sessions) as s:
        reconcile(s, [PoolConfig(name="down", kind="slurm", settings=None, gpu_types=("a100",)),
                      PoolConfig(name="busy", kind="kubernetes", settings=None, gpu_types=("a100",))])
    down = SlurmBackend(SlurmSettings(transport="rest", rest_url=f"http://127.0.0.1:{free_port()}", token="t",
                                      partition="p", work_dir="/tmp"))
    busy = StandInPool("kubernetes", "a100", nodes=8, idle=busy_idle_nodes)
    d = Dispatcher(sessions=sessions, backends={"down": down, "busy": busy},
                   settings=Settings(database_url=url, capacity_ttl_s=0, routing_weights="{}").dispatch)
    d.submitter.submit_all = lambda *a, **kw: None  # nothing is claimed: the jobs fit nowhere
    try:
        yield d
    finally:
        engine.dispose()


def add_gangs(d, account: str, n: int) -> list[str]:
    """Gangs of two 8-GPU workers: two whole idle nodes, which neither worker sees on ``busy``."""
    from gateway.kit.timeutil import new_id, utcnow
    from gateway.models.jobs import Job

    ids = []
    with transaction(d.sessions) as s:
        for _ in range(n):
            job = Job(id=new_id(), name="gang", account_name=account, submitted_by="dev:alice", username="alice",
                      requested_pool="auto", pool=None, state="pending", state_reason="waiting for dispatch",
                      spec={"command": ["true"]}, workers=2, gpus_per_worker=8, total_gpus=16, time_limit_s=3600,
                      priority=0, routing_reason="", dispatch_attempts=0, created_at=utcnow(), updated_at=utcnow())
            s.add(job)
            ids.append(job.id)
    return ids


def waiting_events(d) -> dict[str, list[str]]:
    from gateway.models.jobs import JobEvent

    with transaction(d.sessions) as s:
        rows = s.execute(select(JobEvent.job_id, JobEvent.reason).where(JobEvent.kind == "waiting")
                         .order_by(JobEvent.id)).all()
    out: dict[str, list[str]] = {}
    for job_id, reason in rows:
        out.setdefault(job_id, []).append(reason)
    return out


def reasons(d, ids) -> dict[str, str]:
    from gateway.models.jobs import Job

    with transaction(d.sessions) as s:
        return dict(s.execute(select(Job.id, Job.state_reason).where(Job.id.in_(ids))).all())


def test_two_workers_write_one_waiting_event_per_job_until_the_situation_changes(pg_url):
    with worker(pg_url, busy_idle_nodes=0) as a, worker(pg_url, busy_idle_nodes=1) as b:
        accounts = setup_accounts(a, 2)
        ids = add_gangs(a, accounts[0], 3) + add_gangs(a, accounts[1], 3)
        # Each worker's own words for the same situation.
        views_a, views_b = a.capacity.views(), b.capacity.views()
        assert views_a["busy"].describe() != views_b["busy"].describe()
        assert views_a["down"].describe() != views_b["down"].describe()

        for _ in range(6):
            assert a.dispatch_round() == [] and b.dispatch_round() == []
        events = waiting_events(a)
        assert set(events) == set(ids)
        assert all(len(e) == 1 for e in events.values()), events
        first = reasons(a, ids)
        assert all(r.startswith("waiting for capacity: busy: ") and "down: unavailable (slurmrestd unreachable" in r
                   for r in first.values())
        assert all(first[j] == events[j][0] for j in ids)  # the reason kept is the one its event says

        # The situation changes in meaning: ``busy`` is draining. One new event each, whichever
        # worker saw it first; none more while it stays so.
        from gateway.kit.timeutil import utcnow
        from gateway.pools import service as pools

        with transaction(a.sessions) as s:
            pools.update(s, name="busy", state="draining", weight=None, by=Who("admin:test"), now=utcnow())
        for _ in range(6):
            b.dispatch_round()
            a.dispatch_round()
        events = waiting_events(a)
        assert all(len(e) == 2 for e in events.values()), events
        assert all("busy: draining (takes no new jobs)" in e[1] for e in events.values())
        assert reasons(a, ids) == {j: e[1] for j, e in events.items()}

        from gateway.models.jobs import JobEvent

        with transaction(a.sessions) as s:
            assert s.scalar(select(func.count()).select_from(JobEvent).where(JobEvent.kind == "waiting")) == 12
