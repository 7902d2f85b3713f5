"""Routing over N pools (#13, 3): kind, GPU type, state and cost (pure logic on snapshots;
the real clusters are exercised by tests/dispatch)."""

from __future__ import annotations

import dataclasses

from adapters.base import Capacity, PoolCapacity
from gateway.domain.routing import (
    JobShape,
    PoolView,
    check_pinned,
    held_gpus,
    ranked,
    route,
)


def view(name: str, kind: str, *, nodes: int = 4, idle: int = 4, gpus_per_node: int = 8, gpu_types=("a100",),
         state: str = "active", cost: float = 1.0, weight: float = 1.0) -> PoolView:
    cap = Capacity(backend=kind, pools=(PoolCapacity(pool="p", total_nodes=nodes, idle_nodes=idle,
                                                     total_gpus=nodes * gpus_per_node, free_gpus=idle * gpus_per_node,
                                                     gpus_per_node=gpus_per_node),))
    return PoolView(name=name, capacity=cap, free_gpus=idle * gpus_per_node, idle_nodes=idle,
                    total_gpus=nodes * gpus_per_node, total_nodes=nodes, gpus_per_node=gpus_per_node,
                    gpu_types=frozenset(gpu_types), kind=kind, state=state, cost=cost, weight=weight)


def five(**changes) -> dict[str, PoolView]:
    views = {"slurm-22": view("slurm-22", "slurm"), "slurm-24": view("slurm-24", "slurm"),
             "slurm-26": view("slurm-26", "slurm", gpu_types=("h100",)),
             "kube-a100": view("kube-a100", "kubernetes"), "kube-h100": view("kube-h100", "kubernetes",
                                                                             gpu_types=("h100",))}
    for name, kw in changes.items():
        views[name] = dataclasses.replace(views[name], **kw)
    return views


def shape(gpus=8, workers=1, gpu_type=None, pool_kind=None) -> JobShape:
    return JobShape(workers=workers, gpus_per_worker=gpus, total_gpus=gpus * workers, image=None, gpu_type=gpu_type,
                    pool_kind=pool_kind)


def test_node_exclusivity_comes_from_the_kind_never_the_name():
    odd = view("kubernetes", "slurm")  # a Slurm pool that happens to be called "kubernetes"
    assert odd.node_exclusive and held_gpus(shape(gpus=2), odd) == 8
    assert not view("slurm", "kubernetes").node_exclusive


def test_gpu_type_picks_the_pools_that_have_it_and_the_reason_names_every_pool():
    d = route(shape(gpu_type="h100"), "auto", five())
    assert d.pool in ("slurm-26", "kube-h100")
    for name in ("slurm-22", "slurm-24", "kube-a100"):
        assert f"{name}: cannot run this job (no h100 GPUs (has a100))" in d.reason
    assert "slurm-26" in d.reason and "kube-h100" in d.reason


def test_pool_kind_constrains_auto_routing_and_a_pinned_mismatch_is_refused():
    d = route(shape(pool_kind="kubernetes"), "auto", five())
    assert d.pool == "kube-a100" or d.pool == "kube-h100"
    assert "slurm-22: cannot run this job (a slurm pool; the job asks for kubernetes)" in d.reason
    assert check_pinned(shape(pool_kind="kubernetes"), "slurm-22", five()) == \
        "slurm-22: a slurm pool; the job asks for kubernetes"


def test_the_cheaper_pool_wins_when_several_fit_and_the_factor_turns_cost_off():
    views = {"kube-a100": view("kube-a100", "kubernetes", cost=3.0), "kube-cheap": view("kube-cheap", "kubernetes")}
    assert route(shape(), "auto", views).pool == "kube-cheap"
    views["kube-a100"] = dataclasses.replace(views["kube-a100"], weight=1.5)  # a heavier weight does not beat 3x the cost
    assert route(shape(), "auto", views, cost_factor=1.0).pool == "kube-cheap"
    assert route(shape(), "auto", views, cost_factor=0.0).pool == "kube-a100"


def test_capacity_decides_between_pools_of_equal_cost():
    d = route(shape(gpus=8, workers=3), "auto", five(**{"slurm-22": {"idle_nodes": 1, "free_gpus": 8},
                                                       "slurm-24": {"idle_nodes": 1, "free_gpus": 8},
                                                       "slurm-26": {"idle_nodes": 1, "free_gpus": 8},
                                                       "kube-a100": {"idle_nodes": 0, "free_gpus": 0},
                                                       "kube-h100": {"free_gpus": 24}}))
    assert d.pool == "kube-h100", d.reason


def test_draining_and_disabled_pools_get_nothing_new():
    views = five(**{"slurm-22": {"state": "draining"}, "slurm-24": {"state": "disabled"}})
    for _ in range(20):
        d = route(shape(), "auto", views)
        assert d.pool not in ("slurm-22", "slurm-24")
    assert "slurm-22: draining (takes no new jobs)" in d.reason and "slurm-24: disabled (takes no new jobs)" in d.reason
    pinned = route(shape(), "slurm-22", views)
    assert pinned.pool is None and not pinned.rejected and "slurm-22: draining" in pinned.reason


def test_a_typed_job_never_goes_to_a_pool_whose_gpus_have_no_type():
    """Slurm refuses gpu:h100 on untyped GRES: such a pool cannot run the job (found on the
    five real pools, where the Slurm clusters report no GPU type)."""
    views = five(**{name: {"gpu_types": frozenset()} for name in ("slurm-22", "slurm-24", "slurm-26")})
    d = route(shape(gpu_type="h100"), "auto", views)
    assert d.pool == "kube-h100", d.reason
    assert "slurm-22: cannot run this job (no h100 GPUs (has none of a known type))" in d.reason
    assert route(shape(), "auto", views).pool is not None  # untyped jobs still go anywhere


def test_the_planner_order_follows_kind_state_and_cost():
    """ranked() is route()'s rules for the reservation planner: the pools a job may use, best
    first (the planner used to try every pool in name order, whatever its kind, state or cost)."""
    views = five(**{"slurm-24": {"state": "draining"}, "slurm-26": {"cost": 0.5}})
    assert ranked(shape(pool_kind="slurm"), "auto", views) == ["slurm-26", "slurm-22"]
    assert ranked(shape(), "auto", views)[0] == "slurm-26"
    assert ranked(shape(gpu_type="h100"), "auto", views) == ["slurm-26", "kube-h100"]
    assert ranked(shape(), "slurm-24", views) == []  # pinned to a draining pool: waits


def test_the_planners_pool_is_chosen_but_the_reason_names_every_pool():
    d = route(shape(), "auto", five(), only="slurm-24")
    assert d.pool == "slurm-24" and d.reason.startswith("routed to slurm-24; ")
    assert all(name in d.reason for name in ("slurm-22", "slurm-26", "kube-a100", "kube-h100")), d.reason
