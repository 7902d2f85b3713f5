"""The claim round's decision (gateway/domain/decide.py) over an in-memory snapshot: no database,
no cluster. What the round writes is covered by the other files here, against both."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from types import SimpleNamespace

from adapters.base import Capacity, PoolCapacity
from gateway.domain.decide import Params, Snapshot, decide
from gateway.domain.routing import JobShape, PoolView

NOW = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)


def view(name: str, *, nodes: int, idle: int, gpus_per_node: int = 8) -> PoolView:
    cap = Capacity(backend=name, pools=(PoolCapacity(pool="p", total_nodes=nodes, idle_nodes=idle,
                                                     total_gpus=nodes * gpus_per_node, free_gpus=idle * gpus_per_node,
                                                     gpus_per_node=gpus_per_node),))
    return PoolView(name=name, capacity=cap, free_gpus=idle * gpus_per_node, idle_nodes=idle,
                    total_gpus=nodes * gpus_per_node, total_nodes=nodes, gpus_per_node=gpus_per_node)


def job(jid: str, account: str = "team-a", *, workers: int = 1, pool: str = "auto", time_limit_s: int = 3600):
    return SimpleNamespace(id=jid, account_name=account, requested_pool=pool, workers=workers, gpus_per_worker=8,
                           total_gpus=8 * workers, time_limit_s=time_limit_s, job_set_id=None,
                           spec={"command": ["true"]}, state="pending", state_reason="waiting for dispatch")


class Ledger:
    """The ledger port in memory: verdicts and refusals as the test sets them; reservations recorded."""

    def __init__(self, *, verdicts=None, refuse=None, limited=()):
        self.verdicts = verdicts or {}
        self.refuse = refuse or {}
        self.limited_accounts = set(limited)
        self.reserved: list[tuple[str, str, int]] = []

    def budget_verdict(self, job):
        return self.verdicts.get(job.id)

    def limited(self, account):
        return account in self.limited_accounts

    def known_pools(self):
        return frozenset({"slurm", "kube"})

    def admission_check(self, job, pool, gpus):
        why = self.refuse.get((job.id, pool))
        return why is None, why or ""

    def reserve(self, job, pool, gpus):
        why = self.refuse.get((job.id, pool))
        if why is None:
            self.reserved.append((job.id, pool, gpus))
        return why


def snapshot(**kw) -> Snapshot:
    """A snapshot with each picked job's shape, as the round's read step fills it."""
    shapes = {j.id: JobShape.of_spec(workers=j.workers, gpus_per_worker=j.gpus_per_worker, total_gpus=j.total_gpus,
                                     spec=j.spec) for j in kw["picked"]}
    return Snapshot(shapes=shapes, **kw)


PARAMS = Params(weights=None, queue_depth=0, cost_factor=0.0, reservation_depth=4, max_starts=100)


def test_the_greedy_round_claims_in_fair_share_order_until_the_pools_are_full_and_changes_no_job():
    jobs = [job("j1"), job("j2"), job("j3")]
    ledger = Ledger()
    result = decide(snapshot(now=NOW, picked=jobs, views={"slurm": view("slurm", nodes=2, idle=2)}), ledger, PARAMS)
    assert [(c.job.id, c.pool, c.held_gpus, c.position) for c in result.claims] == [("j1", "slurm", 8, 1),
                                                                                   ("j2", "slurm", 8, 2)]
    assert all(c.reason.startswith("routed to slurm") for c in result.claims)
    assert ledger.reserved == [("j1", "slurm", 8), ("j2", "slurm", 8)]
    [waiting] = result.waiting
    assert waiting.job.id == "j3" and waiting.reason.startswith("waiting for capacity")
    assert waiting.reason.endswith("(fair-share position 3)")
    assert not result.failures and not result.estimates
    # Decided, not written: the jobs are as the snapshot read them.
    assert {(j.state, j.state_reason) for j in jobs} == {("pending", "waiting for dispatch")}


def test_a_budget_that_can_never_pay_fails_the_job_and_one_spent_this_period_holds_it():
    jobs = [job("never"), job("later"), job("ok")]
    ledger = Ledger(verdicts={"never": ("never", "needs 8 GPU-h, budget 1 GPU-h"),
                              "later": ("period", "budget spent until 2026-02-01")})
    result = decide(snapshot(now=NOW, picked=jobs, views={"slurm": view("slurm", nodes=2, idle=2)}), ledger, PARAMS)
    assert [(f.job.id, f.reason) for f in result.failures] == [("never", "cannot run: needs 8 GPU-h, budget 1 GPU-h")]
    assert [(w.job.id, w.reason) for w in result.waiting] == [("later", "held: budget spent until 2026-02-01")]
    assert [c.job.id for c in result.claims] == ["ok"]


def test_a_quota_refusal_leaves_the_capacity_to_the_next_job():
    jobs = [job("refused", "team-q"), job("next")]
    ledger = Ledger(refuse={("refused", "slurm"): "team-q: 8 GPUs held of max_gpus 8"}, limited={"team-q"})
    result = decide(snapshot(now=NOW, picked=jobs, views={"slurm": view("slurm", nodes=1, idle=1)}), ledger, PARAMS)
    assert [(w.job.id, w.reason) for w in result.waiting] == [("refused", "quota: team-q: 8 GPUs held of max_gpus 8")]
    assert [(c.job.id, c.pool) for c in result.claims] == [("next", "slurm")]


def test_the_plan_starts_what_fits_and_gives_the_rest_an_estimate_and_a_reason():
    # One idle node of two: the first gang of two nodes waits for a running gang's end
    # (released in 30 minutes); the single-node job behind it would delay it and is held back.
    from gateway.domain.planner import Release

    gang, small = job("gang", workers=2), job("small", time_limit_s=7200)
    slurm = view("slurm", nodes=2, idle=1)
    unit = 1 if slurm.node_exclusive else 8  # a node, in the pool's planning unit
    snap = snapshot(now=NOW, picked=[gang, small], views={"slurm": slurm}, planned=True,
                    releases=[Release(pool="slurm", units=unit, at=NOW.timestamp() + 1800)],
                    registry_held={"slurm": unit})
    result = decide(snap, Ledger(), dataclasses.replace(PARAMS, reservation_depth=1))
    assert result.claims == []
    estimates = {e.job.id: e for e in result.estimates}
    assert estimates["gang"].pool == "slurm" and estimates["gang"].start == datetime(2026, 1, 5, 12, 30,
                                                                                       tzinfo=UTC)
    assert estimates["gang"].reason.startswith("reserved on slurm: planned start 2026-01-05T12:30:00+00:00")
    reasons = {w.job.id: w.reason for w in result.waiting}
    assert reasons["gang"] == f"waiting for capacity: {estimates['gang'].reason} (fair-share position 1)"
    assert reasons["small"].startswith("waiting for capacity: held back, starting now would delay a higher job's "
                                       "reservation")
    assert reasons["small"].endswith("(fair-share position 2)")
    assert (estimates["small"].start, estimates["small"].pool) == (None, None)
    assert reasons["small"].endswith(f"; {estimates['small'].reason} (fair-share position 2)")


def test_a_planned_round_keeps_a_one_rack_gang_off_a_gpu_pool_whose_racks_have_no_room_for_it():
    # A Kueue-like pool (GPUs placed one by one) with two racks of two 8-GPU nodes: 16 GPUs are
    # free, one whole node in each rack. The gang that requires one rack waits in the gateway
    # (not in Kueue's queue, whatever queue_depth allows); a gang that only prefers one starts.
    kube = dataclasses.replace(view("kube", nodes=4, idle=2), kind="kubernetes",
                               domains={"rack": {"r1": 1, "r2": 1}}, topology_sizes={"rack": 2},
                               domain_gpus={"rack": {"r1": [8, 0], "r2": [0, 8]}})
    required = job("required", workers=2, pool="kube")
    required.spec = {"command": ["true"], "topology": {"required": "rack"}}
    preferred = job("preferred", workers=2, pool="kube")
    preferred.spec = {"command": ["true"], "topology": {"preferred": "rack"}}
    snap = snapshot(now=NOW, picked=[required, preferred], views={"kube": kube}, planned=True)
    result = decide(snap, Ledger(), dataclasses.replace(PARAMS, queue_depth=5))
    assert [c.job.id for c in result.claims] == ["preferred"]
    [waiting] = result.waiting
    assert waiting.job.id == "required"
    assert "no rack of kube has room for 2 workers of 8 GPUs (room: r1 1, r2 1)" in waiting.reason, waiting.reason
    # One rack frees (a gang there ended; more work runs elsewhere and ends later): the gang starts now.
    from gateway.domain.planner import Release

    kube = dataclasses.replace(view("kube", nodes=4, idle=2), kind="kubernetes", topology_sizes={"rack": 2},
                               domains={"rack": {"r1": 2, "r2": 0}}, domain_gpus={"rack": {"r1": [8, 8], "r2": [0, 0]}})
    snap = snapshot(now=NOW, picked=[required], views={"kube": kube}, planned=True,
                    releases=[Release(pool="kube", units=16, at=NOW.timestamp() + 600)], registry_held={"kube": 16})
    result = decide(snap, Ledger(), PARAMS)
    assert [(c.job.id, c.pool) for c in result.claims] == [("required", "kube")], result.waiting
