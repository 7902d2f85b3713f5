"""Node-exclusive Slurm: a gang holds whole nodes (sbatch --exclusive), and the ledger
reserves and charges what it holds, not only the GPUs it asked for (issue #12, finding 2)."""

from __future__ import annotations

from datetime import datetime

import pytest
from sqlalchemy import select

from gateway.kit.timeutil import as_utc
from gateway.ledger import reading as ledger_reading
from gateway.ledger import rules as ledger_rules
from gateway.models.ledger import LedgerEntry, Reservation
from tests.dispatch.conftest import (
    drive_until,
    job_state,
    slurm_backend_options,
    wired_gateway,
)

pytestmark = pytest.mark.slurm("25.11")  # off 22.05, the busiest lane
FINAL = ("succeeded", "failed", "cancelled")


@pytest.fixture
def gw(database_url, dev_key_path, slurm_cluster):
    with wired_gateway(database_url, dev_key_path, {"slurm": slurm_backend_options(slurm_cluster)}) as gw:
        yield gw


def submit(gw, **spec):
    body = {"name": "exclusive", "account": "team-a", "backend": "slurm", "workers": 1, "time_limit": "5m", **spec}
    r = gw.client.post("/v1/jobs", json=body, headers=gw.headers("alice", ("team-a",)))
    assert r.status_code == 202, r.text
    return r.json()["id"]


def _node(gw, name: str) -> dict:
    return next(n for n in gw.app.state.backends["slurm"].transport.nodes() if n.get("name") == name)


@pytest.mark.parametrize("gpus_per_worker", [0, 2])
def test_a_gang_that_asks_fewer_gpus_holds_whole_nodes_and_pays_for_them(gw, gpus_per_worker):
    gpus_per_node = gw.app.state.dispatcher.views(fresh=True)["slurm"].gpus_per_node
    assert gpus_per_node == 8
    job = submit(gw, command=["sleep", "6"], gpus_per_worker=gpus_per_worker)
    running = drive_until(gw, lambda: job_state(gw, job, "running"), timeout_s=60)
    # What the user sees: what they asked, and what they hold (and pay for).
    assert running["total_gpus"] == gpus_per_worker
    assert running["held_gpus"] == gpus_per_node, running
    # The node really is the job's alone: Slurm gave it every CPU of the node, and every GPU
    # it pays for (Slurm's own accounting agrees with the ledger).
    (node_name,) = running["nodes"]
    node = _node(gw, node_name)
    assert int(node["alloc_cpus"]) == int(node["cpus"]), node
    status = gw.app.state.backends["slurm"].status(running["backend_job_id"])
    assert status.allocated_gpus == gpus_per_node, status
    with gw.session() as s:
        r = s.get(Reservation, job)
        assert r.gpus == gpus_per_node
        reserve = s.scalars(select(LedgerEntry).where(LedgerEntry.job_id == job,
                                                      LedgerEntry.kind == "reserve")).one()
        assert reserve.gpus == gpus_per_node and "whole nodes" in reserve.reason, reserve.reason
        # the account's concurrent-GPU total counts the whole node while it runs
        assert ledger_rules.pool_balances(s, "team-a")["slurm"] == gpus_per_node
    done = drive_until(gw, lambda: job_state(gw, job, *FINAL), timeout_s=90)
    assert done["state"] == "succeeded", done
    ran = (as_utc(datetime.fromisoformat(done["ended_at"]))
           - as_utc(datetime.fromisoformat(done["started_at"]))).total_seconds()
    assert ran >= 5
    with gw.session() as s:
        charged = ledger_rules.charged_gpu_seconds(s, job_id=job)
        assert ledger_reading.verify(s) == []
        assert ledger_reading.get_balance(s, "team-a").reserved_gpus == 0
    # Slurm times are whole seconds: charged for every GPU of the node for the whole run.
    assert abs(charged - gpus_per_node * ran) <= gpus_per_node, (charged, ran)
