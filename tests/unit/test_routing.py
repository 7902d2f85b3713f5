"""Routing decisions on capacity snapshots (pure logic; the pools' real figures are covered by
tests/dispatch against the real Slurm cluster and Kueue)."""

from __future__ import annotations

import dataclasses

from adapters.base import Capacity, PoolCapacity
from gateway.domain.routing import JobShape, PoolView, ranked, route, take


def view(name: str, *, nodes: int, idle: int, gpus_per_node: int = 8, depth: int = 0) -> PoolView:
    cap = Capacity(backend=name, pools=(PoolCapacity(pool="p", total_nodes=nodes, idle_nodes=idle,
                                                     total_gpus=nodes * gpus_per_node, free_gpus=idle * gpus_per_node,
                                                     gpus_per_node=gpus_per_node),))
    return PoolView(name=name, capacity=cap, free_gpus=idle * gpus_per_node, idle_nodes=idle,
                    total_gpus=nodes * gpus_per_node, total_nodes=nodes, gpus_per_node=gpus_per_node,
                    queue_depth=depth)


GANG = JobShape(workers=2, gpus_per_worker=8, total_gpus=16, image=None, gpu_type=None)


def test_waits_in_the_gateway_when_no_pool_has_room():
    d = route(GANG, "auto", {"slurm": view("slurm", nodes=4, idle=1),
                             "kubernetes": view("kubernetes", nodes=4, idle=1)})
    assert d.pool is None and not d.rejected
    assert d.reason.startswith("waiting for capacity") and "1 of 4 nodes idle" in d.reason


def test_queue_depth_lets_a_pool_take_jobs_beyond_free_capacity():
    views = {"slurm": view("slurm", nodes=4, idle=0)}
    assert route(GANG, "slurm", views, queue_depth=2).pool == "slurm"
    take(GANG, views["slurm"])
    take(GANG, views["slurm"])
    assert views["slurm"].queue_depth == 2
    assert route(GANG, "slurm", views, queue_depth=2).pool is None  # depth used up


def test_a_snapshot_is_not_handed_out_twice():
    views = {"slurm": view("slurm", nodes=4, idle=2)}
    assert route(GANG, "slurm", views).pool == "slurm"
    take(GANG, views["slurm"])
    assert route(GANG, "slurm", views).pool is None


def test_pinned_job_that_can_never_fit_is_rejected_with_reason():
    huge = JobShape(workers=8, gpus_per_worker=8, total_gpus=64, image=None, gpu_type=None)
    d = route(huge, "slurm", {"slurm": view("slurm", nodes=4, idle=4)})
    assert d.rejected and "8 whole nodes" in d.reason


def test_quota_refusal_sends_an_auto_job_to_the_other_pool():
    views = {"slurm": view("slurm", nodes=4, idle=4), "kubernetes": view("kubernetes", nodes=4, idle=4)}
    d = route(GANG, "auto", views, quota_refusals={"kubernetes": "team-a: 32 of 32 in pool kubernetes"})
    assert d.pool == "slurm" and "kubernetes: quota" in d.reason


def test_a_round_reusing_its_views_gives_each_shape_its_own_reasons_and_sees_what_it_took():
    """Whether a pool can ever take a shape is worked out once per round (views are reused job after job):
    another shape still gets its own verdict, and capacity taken in between still shows."""
    views = {"slurm": view("slurm", nodes=4, idle=2), "small": view("small", nodes=4, idle=4, gpus_per_node=4)}
    first = route(GANG, "auto", views)
    assert first.pool == "slurm" and "small: cannot run this job (a worker asks 8 GPUs; nodes have 4)" in first.reason
    take(GANG, views["slurm"])
    again = route(GANG, "auto", views)
    assert again.pool is None and "slurm: 0 of 4 nodes idle" in again.reason
    narrow = JobShape(workers=1, gpus_per_worker=4, total_gpus=4, image=None, gpu_type=None)
    assert route(narrow, "auto", views).pool == "small"
    typed = JobShape(workers=1, gpus_per_worker=4, total_gpus=4, image=None, gpu_type="h100")
    assert route(typed, "auto", views).rejected  # no typed GPUs anywhere: its own verdict, not narrow's


def _pair(**slurm_kw) -> dict[str, PoolView]:
    a, b = view("a", nodes=4, idle=4), view("b", nodes=4, idle=4)
    for k, v in slurm_kw.items():
        setattr(a, k, v)
    return {"a": a, "b": b}


def test_auto_chooses_by_weight_then_cost_then_name():
    assert route(GANG, "auto", _pair()).pool == "a"  # a tie: by name
    assert route(GANG, "auto", _pair(cost=2.0)).pool == "b"  # dearer
    assert route(GANG, "auto", _pair(cost=2.0), cost_factor=0.0).pool == "a"  # cost not counted
    assert route(GANG, "auto", _pair(cost=2.0, weight=3.0)).pool == "a"  # weight outweighs cost
    assert route(GANG, "auto", _pair(), weights={"a": 0.5}).pool == "b"


def test_auto_skips_draining_pools_and_pools_of_another_kind():
    d = route(GANG, "auto", _pair(state="draining"))
    assert d.pool == "b" and "a: draining (takes no new jobs)" in d.reason
    kube = dataclasses.replace(GANG, pool_kind="kubernetes")
    views = _pair(kind="kubernetes")
    assert route(kube, "auto", views).pool == "a"
    assert ranked(kube, "auto", views) == ["a"]


def test_a_view_from_stored_limits_refuses_what_the_live_view_refuses():
    """What a process without a dispatcher judges submissions by (gateway/pools/service.py
    stored_views): the same never-fits reasons, nothing about free capacity."""
    from gateway.domain.routing import check_pinned

    live = dataclasses.replace(view("slurm", nodes=4, idle=0), kind="slurm", gpu_types=frozenset({"h100"}),
                               image_unsupported="this Slurm pool runs no container images")
    stored = PoolView.from_limits("slurm", live.limits(), {"kind": "slurm", "state": "active"})
    shapes = [JobShape(workers=5, gpus_per_worker=8, total_gpus=40, image=None, gpu_type=None),
              JobShape(workers=1, gpus_per_worker=16, total_gpus=16, image=None, gpu_type=None),
              JobShape(workers=1, gpus_per_worker=8, total_gpus=8, image=None, gpu_type="a100"),
              JobShape(workers=1, gpus_per_worker=8, total_gpus=8, image="trainer:1", gpu_type=None),
              JobShape(workers=4, gpus_per_worker=8, total_gpus=32, image=None, gpu_type="H100")]
    verdicts = [check_pinned(s, "slurm", {"slurm": live}) for s in shapes]
    assert verdicts == [check_pinned(s, "slurm", {"slurm": stored}) for s in shapes]
    assert [v is None for v in verdicts] == [False, False, False, False, True]
    assert stored.free_gpus == 0 and stored.idle_nodes == 0  # never a basis for routing
    assert PoolView(name="x", capacity=None).limits() is None  # no snapshot: nothing known


# ---------------------------------------------------------------- topology (docs/planning.md)


def topo_view(name: str, idle_per_domain: dict[str, int], size: int = 2, level: str = "block") -> PoolView:
    v = view(name, nodes=size * len(idle_per_domain), idle=sum(idle_per_domain.values()))
    return dataclasses.replace(v, kind="slurm", domains={level: dict(idle_per_domain)}, topology_sizes={level: size})


def test_a_gang_that_requires_one_domain_waits_for_one_and_takes_the_fullest_that_fits():
    from gateway.domain.routing import check_pinned, domains_needed, fits_now

    one_block = JobShape(workers=2, gpus_per_worker=8, total_gpus=16, image=None, gpu_type=None,
                         topology="block", topology_required=True)
    scattered = {"s": topo_view("s", {"b1": 1, "b2": 1})}
    assert not fits_now(one_block, scattered["s"]) and scattered["s"].idle_nodes == 2
    assert fits_now(dataclasses.replace(one_block, topology_required=False), scattered["s"])  # preferred: spans
    d = route(one_block, "s", scattered)
    assert d.pool is None and not d.rejected  # waits in the gateway, not refused
    assert "no block of s has 2 idle nodes (idle: b1 1, b2 1)" in d.reason
    v = topo_view("s", {"b1": 2, "b2": 3, "b3": 4}, size=4)
    assert fits_now(one_block, v)
    take(one_block, v)
    assert v.domains["block"] == {"b1": 0, "b2": 3, "b3": 4}  # best fit: the fullest that holds it
    assert domains_needed(dataclasses.replace(one_block, workers=5), v) == 2
    # A level the pool does not have, or whose largest domain is too small: refused with the reason
    rack = dataclasses.replace(one_block, topology="rack")
    assert "no network domains of level 'rack' (levels: block)" in check_pinned(rack, "s", scattered)
    three = dataclasses.replace(one_block, workers=3, total_gpus=24)
    assert "one block of 3 nodes; the largest has 2" in check_pinned(three, "s", scattered)
    assert check_pinned(dataclasses.replace(three, topology_required=False), "s", scattered) is None


def test_auto_routing_prefers_the_pool_where_the_gang_spans_fewer_domains():
    gang = JobShape(workers=2, gpus_per_worker=8, total_gpus=16, image=None, gpu_type=None)
    views = {"a": topo_view("a", {"b1": 1, "b2": 1, "b3": 2}), "b": topo_view("b", {"b1": 2, "b2": 1, "b3": 1})}
    assert route(gang, "auto", views).pool == "a"  # both fit it in one block: the tie goes by name
    views["a"].domains["block"]["b3"] = 1
    views["a"].idle_nodes = 3  # the free share is left alone: only the spans differ
    assert route(gang, "auto", views).pool == "b"  # b: one block; a: two


def test_topology_is_a_stored_limit_and_reads_from_a_spec():
    from gateway.domain.routing import check_pinned

    live = topo_view("s", {"b1": 2, "b2": 2})
    stored = PoolView.from_limits("s", live.limits(), {"kind": "slurm", "state": "active"})
    shape = JobShape.of_spec(workers=3, gpus_per_worker=8, total_gpus=24, spec={"topology": {"required": "block"}})
    assert (shape.topology, shape.topology_required) == ("block", True)
    assert check_pinned(shape, "s", {"s": stored}) == check_pinned(shape, "s", {"s": live}) is not None
    assert JobShape.of_spec(workers=1, gpus_per_worker=8, total_gpus=8, spec={}).topology == ""


def gpu_topo_view(name: str, free_per_domain: dict[str, list[int]], gpus_per_node: int = 8) -> PoolView:
    """A pool that places GPUs one by one (Kueue TAS): each domain's nodes with their free GPUs."""
    nodes = sum(len(f) for f in free_per_domain.values())
    v = view(name, nodes=nodes, idle=sum(f == gpus_per_node for fs in free_per_domain.values() for f in fs))
    return dataclasses.replace(
        v, kind="kubernetes", free_gpus=sum(sum(f) for f in free_per_domain.values()),
        domains={"rack": {d: sum(f == gpus_per_node for f in fs) for d, fs in free_per_domain.items()}},
        domain_gpus={"rack": {d: list(fs) for d, fs in free_per_domain.items()}},
        topology_sizes={"rack": max(len(f) for f in free_per_domain.values())})


def test_on_a_gpu_pool_a_domains_room_is_whole_workers_per_node():
    from gateway.domain.plan_inputs import domains
    from gateway.domain.routing import check_pinned, fits_now, room

    one_rack = JobShape(workers=2, gpus_per_worker=8, total_gpus=16, image=None, gpu_type=None,
                        topology="rack", topology_required=True)
    # 16 GPUs free in r1, but no node has 8 of them; one whole node in each rack.
    scattered = {"k": gpu_topo_view("k", {"r1": [4, 4, 8], "r2": [8, 0, 0]})}
    assert room(one_rack, scattered["k"], "rack") == {"r1": 1, "r2": 1}
    assert not fits_now(one_rack, scattered["k"]) and scattered["k"].free_gpus >= 16
    d = route(one_rack, "k", scattered, queue_depth=5)  # waits in the gateway, not in Kueue's queue
    assert d.pool is None and not d.rejected
    assert "no rack of k has room for 2 workers of 8 GPUs (room: r1 1, r2 1)" in d.reason, d.reason
    half = dataclasses.replace(one_rack, gpus_per_worker=4, total_gpus=8)
    assert room(half, scattered["k"], "rack") == {"r1": 4, "r2": 2} and fits_now(half, scattered["k"])
    assert domains(scattered) == {"k": {"rack": {"r1": 16, "r2": 8}}}  # the planner's bound, in GPUs
    # A gang takes its domain's GPUs node by node, so the next of the round sees them gone.
    v = gpu_topo_view("k", {"r1": [8, 8], "r2": [8, 8, 8]})
    assert route(one_rack, "k", {"k": v}).pool == "k"
    take(one_rack, v)
    assert v.domain_gpus["rack"] == {"r1": [0, 0], "r2": [8, 8, 8]} and v.domains["rack"]["r1"] == 0
    assert not fits_now(one_rack, dataclasses.replace(v, free_gpus=24, domain_gpus={"rack": {"r1": [0, 0], "r2": [8, 0, 0]}}))
    # More workers than the largest domain can ever hold: refused with the reason.
    big = dataclasses.replace(one_rack, workers=4, total_gpus=32)
    assert "4 workers of 8 GPUs need one rack; the largest has 3 nodes of 8 GPUs" in check_pinned(big, "k", {"k": v})


def test_a_pools_domains_in_words():
    from gateway.domain.routing import topology_words

    assert topology_words([("rack", "r1", 1, 2), ("rack", "r2", 2, 2), ("host", "n1", 0, 1)]) == \
        "rack: r1 1/2 idle, r2 2/2 idle; host: n1 0/1 idle"
    assert topology_words([]) == ""
