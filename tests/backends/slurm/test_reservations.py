"""Slurm reservations as capacity windows, against the real local clusters (every version x
transport): an admin's ``scontrol create reservation`` reaches ``capacity().pools[0].windows``.

Reservations are made as root with the cluster's own scontrol (inside its chroot for the
Debian 13/sid clusters) and always deleted again: the other tests on these clusters need every
node. The future ones start in an hour, so no job that runs now loses its node; the active
one lives for a second or two.
"""

from __future__ import annotations

import contextlib
import dataclasses
import subprocess
import uuid
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta

import pytest

from adapters.base import BackendState, PoolCapacity, Window
from adapters.slurm import parse
from tests import slurm_cli

pytestmark = pytest.mark.slurm

PREFIX = "isthmus-resv-test-"


def slurm_command(env: Mapping[str, str], command: str, *args: str) -> subprocess.CompletedProcess[str]:
    """One of this cluster's commands as root (tests/slurm_cli.py); the caller judges the exit."""
    return slurm_cli.run(env, command, *args, check=False)


def scontrol(env: Mapping[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """This cluster's scontrol as root."""
    return slurm_command(env, "scontrol", *args)


def delete(env: Mapping[str, str], name: str) -> None:
    proc = scontrol(env, "delete", f"ReservationName={name}")
    assert proc.returncode == 0 or "invalid reservation" in (proc.stdout + proc.stderr).lower(), \
        f"could not delete reservation {name}: {proc.stdout}{proc.stderr}"


@contextlib.contextmanager
def reservation(env: Mapping[str, str], *fields: str) -> Iterator[str]:
    """A reservation made for the block and deleted after it, whatever happens."""
    name = f"{PREFIX}{uuid.uuid4().hex[:10]}"
    proc = scontrol(env, "create", "reservation", f"ReservationName={name}", *fields)
    try:
        assert proc.returncode == 0, f"scontrol create reservation failed: {proc.stdout}{proc.stderr}"
        yield name
    finally:
        delete(env, name)


@pytest.fixture(scope="module", autouse=True)
def no_leftovers(cluster_env) -> None:
    """Delete reservations an interrupted earlier run of this file left behind."""
    for rec in parse.reservation_text(scontrol(cluster_env, "--oneliner", "show", "reservation").stdout):
        if str(rec["name"]).startswith(PREFIX):
            delete(cluster_env, rec["name"])


def pool(backend) -> PoolCapacity:
    (mine,) = backend.capacity().pools
    return mine


def named(p: PoolCapacity, name: str) -> Window | None:
    return next((w for w in p.windows if w.name == name), None)


def node_of(backend, *, idle: bool = False) -> str:
    """A node of the partition (an idle one when asked; the last one otherwise)."""
    nodes = [n for n in backend.transport.nodes() if backend.settings.partition in (n.get("partitions") or [])]
    if idle:
        nodes = [n for n in nodes if parse.pool_capacity([n])[0].idle_nodes]
        if not nodes:
            pytest.fail("no idle node in the partition to reserve")
    return str(max(nodes, key=lambda n: str(n["name"]))["name"])


def near(a: datetime, b: datetime) -> bool:
    return abs((a - b).total_seconds()) <= 60


def test_a_future_maintenance_is_a_window_of_its_node(backend, cluster_env):
    node = node_of(backend)
    backend.forget_reservations()
    assert not [w for w in pool(backend).windows if w.name.startswith(PREFIX)]
    now = datetime.now(UTC)
    with reservation(cluster_env, "StartTime=now+1hour", "Duration=60", f"Nodes={node}",
                     "Users=root", "Flags=MAINT") as name:
        # Read at most every RESERVATIONS_TTL_S: the copy read a moment ago is still served.
        assert named(pool(backend), name) is None
        backend.forget_reservations()
        w = named(pool(backend), name)
        assert w is not None, f"{name} missing from {pool(backend).windows}"
        assert w.nodes == (node,) and w.maintenance is True
        assert near(w.start, now + timedelta(hours=1)) and near(w.end, now + timedelta(hours=2)), (w.start, w.end)
        assert w.start.tzinfo is not None and w.end.utcoffset() == timedelta(0)
        assert w.detail == f"Slurm reservation {name} (MAINT), for users root"
    backend.forget_reservations()
    assert named(pool(backend), name) is None


def test_a_reservation_for_someone_is_not_a_maintenance(backend, cluster_env):
    node = node_of(backend)
    now = datetime.now(UTC)
    with reservation(cluster_env, "StartTime=now+1hour", "Duration=30", f"Nodes={node}", "Users=root") as name:
        backend.forget_reservations()
        w = named(pool(backend), name)
        assert w is not None and w.nodes == (node,) and w.maintenance is False
        assert near(w.start, now + timedelta(hours=1)) and near(w.end, now + timedelta(hours=1, minutes=30))
        assert w.detail == f"Slurm reservation {name}, for users root"


def test_an_active_maintenance_takes_its_node_out_of_the_idle_count(backend, cluster_env):
    node = node_of(backend, idle=True)
    before = pool(backend)
    now = datetime.now(UTC)
    with reservation(cluster_env, "StartTime=now", "Duration=10", f"Nodes={node}", "Users=root",
                     "Flags=MAINT,IGNORE_JOBS") as name:
        backend.forget_reservations()
        # At once: slurmctld flags the node MAINTENANCE only in its next 5 s cycle, but the
        # backend counts a node of a started reservation taken itself.
        after = pool(backend)
        w = named(after, name)
        assert w is not None and w.nodes == (node,) and w.maintenance is True
        assert near(w.start, now) and near(w.end, now + timedelta(minutes=10))
        assert after.idle_nodes == before.idle_nodes - 1, (before.detail, after.detail)
        assert after.free_gpus == before.free_gpus - before.gpus_per_node


def test_a_flag_pyslurm_has_no_name_for_hides_nothing(backend, cluster_env):
    """REPLACE_DOWN is a bit pyslurm 25.11.2's ReservationFlags does not know: reading it made
    pyslurm raise, which would have hidden every reservation. Every transport reports it."""
    now = datetime.now(UTC)
    with reservation(cluster_env, "StartTime=now+1hour", "Duration=30", "NodeCnt=1", "Users=root",
                     "Flags=REPLACE_DOWN") as name:
        backend.forget_reservations()
        w = named(pool(backend), name)
        assert w is not None and len(w.nodes) == 1 and w.maintenance is False
        assert near(w.start, now + timedelta(hours=1))


# ------------------------------------------------- the gateway's own reservations (issue #31)


def _shown(env: Mapping[str, str], name: str) -> dict | None:
    proc = scontrol(env, "--oneliner", "show", "reservation", name)
    found = [r for r in parse.reservation_text(proc.stdout) if r["name"] == name]
    return found[0] if found else None


def test_the_gateways_reservation_holds_a_node_for_its_account_alone(backend, cluster_env, slurm_version):
    """``reserve()`` makes a real Slurm reservation for the account (slurmrestd from v0.0.43,
    Slurm 25.11 on; scontrol before), the account's job runs in it, another account's job may
    not, it is no window of the pool, and ``unreserve()`` deletes it (twice is fine)."""
    from adapters.base import (
        GATEWAY_RESERVATION_PREFIX,
        ReservationRequest,
        SubmissionRejected,
    )
    from adapters.slurm import SlurmBackend
    from tests.backends.slurm.conftest import gid, wait_for
    from tests.backends.slurm.test_slurm_cluster import request

    b = SlurmBackend(dataclasses.replace(backend.settings, account_map="same"))
    name = f"{GATEWAY_RESERVATION_PREFIX}test-{uuid.uuid4().hex[:10]}"
    now = datetime.now(UTC)
    try:
        words = b.reserve(ReservationRequest(name=name, account="team-a", nodes=1, start=now,
                                             end=now + timedelta(minutes=10)))
        how = "slurmrestd (POST /slurm/v0.0.4" if slurm_version >= "25.11" and b.settings.transport == "rest" \
            else "scontrol create reservation"
        assert name in words and how in words, words
        rec = _shown(cluster_env, name)
        assert rec is not None and parse._names(rec["accounts"]) == ["team-a"], rec
        (node,) = parse.expand_hostlist(rec["node_list"])
        assert name in (b.gateway_reservations() or [])
        assert named(pool(b), name) is None  # the gateway plans it as a hold, not as a window
        # Asking again (a sync after a crash) changes nothing.
        b.reserve(ReservationRequest(name=name, account="team-a", nodes=1, start=now,
                                     end=now + timedelta(minutes=10)))
        assert parse.expand_hostlist(_shown(cluster_env, name)["node_list"]) == (node,)

        job = dataclasses.replace(request(gid("resv"), ["true"], gpus=8), account="team-a", reservation=name)
        done = wait_for(b, b.submit(job).backend_job_id, lambda s: s.state.final)
        assert done.state is BackendState.SUCCEEDED and list(done.nodes) == [node], done
        other = dataclasses.replace(request(gid("resv"), ["true"], gpus=8), account="team-b", reservation=name)
        with pytest.raises(SubmissionRejected):
            b.submit(other)
    finally:
        b.unreserve(name)
        b.unreserve(name)  # gone already: no error
    assert _shown(cluster_env, name) is None
    assert name not in (b.gateway_reservations() or [])
    b.close()
