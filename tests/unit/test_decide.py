"""The claim round's decision (gateway/domain/decide.py) over an in-memory snapshot: no database,
no cluster. What the round writes is covered by the other files here, against both."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from types import SimpleNamespace

from adapters.base import Capacity, PoolCapacity
from gateway.domain.decide import Params, Snapshot, decide
from gateway.domain.quota import ChainView, Held, PoolTerms, Quota
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


def ledger(*, quotas=None, held=None, charged=None) -> ChainView:
    """The ledger's view of the chains as the round reads it (gateway/ledger/round.py): every
    account a root, the limits and totals the test sets, pools "slurm" and "kube" known."""
    quotas = quotas or {}
    return ChainView(parent=dict.fromkeys(("team-a", "team-b", "team-q", *quotas)), quotas=quotas,
                     held=held or {}, charged=charged or {},
                     pools=PoolTerms(costs={"slurm": 1.0, "kube": 1.0}, routable=("kube", "slurm")))


def snapshot(**kw) -> Snapshot:
    """A snapshot with each picked job's shape, as the round's read step fills it."""
    shapes = {j.id: JobShape.of_spec(workers=j.workers, gpus_per_worker=j.gpus_per_worker, total_gpus=j.total_gpus,
                                     spec=j.spec) for j in kw["picked"]}
    kw.setdefault("quota", ledger())
    return Snapshot(shapes=shapes, **kw)


PARAMS = Params(weights=None, queue_depth=0, cost_factor=0.0, reservation_depth=4, max_starts=100)


def test_the_greedy_round_claims_in_fair_share_order_until_the_pools_are_full_and_changes_no_job():
    jobs = [job("j1"), job("j2"), job("j3")]
    result = decide(snapshot(now=NOW, picked=jobs, views={"slurm": view("slurm", nodes=2, idle=2)}), PARAMS)
    assert [(c.job.id, c.pool, c.held_gpus, c.position) for c in result.claims] == [("j1", "slurm", 8, 1),
                                                                                   ("j2", "slurm", 8, 2)]
    assert all(c.reason.startswith("routed to slurm") for c in result.claims)
    # The reservations it wants written (a chain without limits: nothing to judge again).
    assert [(r.job.id, r.pool, r.gpus, r.committed, r.names, r.limited) for r in result.reservations] == [
        ("j1", "slurm", 8, 8 * 3600, ("team-a",), False), ("j2", "slurm", 8, 8 * 3600, ("team-a",), False)]
    [waiting] = result.waiting
    assert waiting.job.id == "j3" and waiting.reason.startswith("waiting for capacity")
    assert waiting.reason.endswith("(fair-share position 3)")
    assert not result.failures and not result.estimates
    # Decided, not written: the jobs are as the snapshot read them.
    assert {(j.state, j.state_reason) for j in jobs} == {("pending", "waiting for dispatch")}


def test_a_budget_that_can_never_pay_fails_the_job_and_one_spent_this_period_holds_it():
    jobs = [job("never", "tiny"), job("later", "spent"), job("ok")]
    view_ = ledger(quotas={"tiny": Quota(budget_gpu_seconds=3600), "spent": Quota(budget_gpu_seconds=10 * 3600)},
                   charged={"spent": 9 * 3600})
    result = decide(snapshot(now=NOW, picked=jobs, views={"slurm": view("slurm", nodes=2, idle=2)}, quota=view_),
                    PARAMS)
    assert [(f.job.id, f.reason) for f in result.failures] == [(
        "never", ("cannot run: tiny's monthly GPU-hour budget is 1.0 GPU-hours and this job needs 8.0 (8 GPUs x "
                 "1.00 h time limit); ask for fewer GPUs or a shorter time limit"))]
    assert [(w.job.id, w.reason) for w in result.waiting] == [(
        "later", ("held: spent's GPU-hour budget this month has 1.0 of 10.0 GPU-hours left and this job needs 8.0: "
                 "it is held until the budget renews next month or an admin credits the account"))]
    assert [c.job.id for c in result.claims] == ["ok"]


def test_a_quota_refusal_leaves_the_capacity_to_the_next_job():
    jobs = [job("refused", "team-q"), job("next")]
    view_ = ledger(quotas={"team-q": Quota(max_gpus=8)}, held={"team-q": Held(reserved_gpus=8)})
    result = decide(snapshot(now=NOW, picked=jobs, views={"slurm": view("slurm", nodes=1, idle=1)}, quota=view_),
                    PARAMS)
    assert [(w.job.id, w.reason) for w in result.waiting] == [
        ("refused", "quota: team-q: 8 of 8 concurrent GPUs in use, job needs 8")]
    assert [(c.job.id, c.pool) for c in result.claims] == [("next", "slurm")]


def test_the_round_counts_what_it_reserved_before_each_job_and_marks_limited_chains():
    # team-q may hold 16 GPUs: of three 8-GPU gangs that all fit the pool, the third waits for
    # the first two, decided from the round's view (nothing is written until apply).
    jobs = [job("q1", "team-q"), job("q2", "team-q"), job("q3", "team-q"), job("a1")]
    view_ = ledger(quotas={"team-q": Quota(max_gpus=16)})
    result = decide(snapshot(now=NOW, picked=jobs, views={"slurm": view("slurm", nodes=4, idle=4)}, quota=view_),
                    PARAMS)
    assert [c.job.id for c in result.claims] == ["q1", "q2", "a1"]
    assert [(w.job.id, w.reason) for w in result.waiting] == [
        ("q3", "quota: team-q: 16 of 16 concurrent GPUs in use, job needs 8")]
    assert [(r.job.id, r.limited) for r in result.reservations] == [("q1", True), ("q2", True), ("a1", False)]
    assert view_.held == {}  # the snapshot's view is read-only: the tally counted on its own copy


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
    result = decide(snap, dataclasses.replace(PARAMS, reservation_depth=1))
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
    result = decide(snap, dataclasses.replace(PARAMS, queue_depth=5))
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
    result = decide(snap, PARAMS)
    assert [(c.job.id, c.pool) for c in result.claims] == [("required", "kube")], result.waiting
