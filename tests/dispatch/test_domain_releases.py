"""Releases that name the network domains their gangs free (docs/planning.md, "Topology"):
the registry's side of the planner's domain futures. SQLite only, no cluster."""

from __future__ import annotations

import shutil
import uuid
from datetime import timedelta

import pytest

from adapters.base import Capacity, PoolCapacity, TopologyDomain
from gateway.dispatch import planning
from gateway.domain.routing import PoolView
from gateway.kit.db import make_engine, make_sessionmaker, transaction
from gateway.kit.timeutil import utcnow
from tests.ledger.dbfixtures import add_account, add_job, sqlite_template  # noqa: F401 - a fixture

BLOCKS = (TopologyDomain("block", "b1", ("n1", "n2"), 0), TopologyDomain("block", "b2", ("n3", "n4"), 1))


@pytest.fixture
def sessions(tmp_path, sqlite_template):
    path = tmp_path / f"releases-{uuid.uuid4().hex[:8]}.db"
    shutil.copy(sqlite_template, path)
    engine = make_engine(f"sqlite:///{path}")
    yield make_sessionmaker(engine)
    engine.dispose()


def view() -> PoolView:
    cap = Capacity(backend="slurm", pools=(PoolCapacity("gpu", 4, 1, 32, 8, 8, topology=BLOCKS),))
    return PoolView(name="slurm", capacity=cap, kind="slurm", idle_nodes=1, total_nodes=4,
                    total_gpus=32, free_gpus=8, gpus_per_node=8, domains={"block": {"b1": 0, "b2": 1}},
                    topology_sizes={"block": 2})


def running(s, *, nodes, workers, started, limit=3600):
    job = add_job(s, "team-a", gpus=8 * workers, workers=workers, time_limit_s=limit)
    for state in ("dispatching", "queued", "running"):  # the state machine's own path
        job.state = state
    job.started_at, job.nodes = started, nodes
    return job


def test_running_gangs_with_known_nodes_name_the_blocks_they_free(sessions):
    now = utcnow()
    with transaction(sessions) as s:
        add_account(s, "team-a")
        running(s, nodes=["n1", "n2"], workers=2, started=now - timedelta(seconds=600))
        running(s, nodes=["n3"], workers=1, started=now - timedelta(seconds=100))
    with transaction(sessions) as s:
        rel, held = planning.releases(s, {"slurm": view()}, now=now)
    assert held == {"slurm": 3}
    got = sorted((r.units, round(r.at - now.timestamp()), r.domains) for r in rel)
    assert got == [(1, 3500, (("block", "b2", 1),)), (2, 3000, (("block", "b1", 2),))]


def test_a_gang_whose_nodes_are_unknown_leaves_the_pool_on_plain_releases(sessions):
    now = utcnow()
    with transaction(sessions) as s:
        add_account(s, "team-a")
        running(s, nodes=["n1", "n2"], workers=2, started=now - timedelta(seconds=600))
        running(s, nodes=None, workers=1, started=now - timedelta(seconds=100))  # not reported yet
    with transaction(sessions) as s:
        rel, _ = planning.releases(s, {"slurm": view()}, now=now)
    assert sorted(r.units for r in rel) == [1, 2] and all(r.domains == () for r in rel)
