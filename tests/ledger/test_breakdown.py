"""The fair-share table's usage per pool (gateway/ledger/breakdown.py): a split of the exact
decayed usage that always adds up to it, weighted by how recent each pool's usage is."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gateway.kit.db import transaction
from gateway.ledger.breakdown import own_pool_weights, raw_usage_by_pool
from gateway.models.ledger import UsageBucket

DAY = 86400.0


def test_parts_add_up_to_the_exact_usage_and_roll_up_to_ancestors():
    tree = {"org": None, "a": "org", "b": "org", "a1": "a"}
    own = {"a": 300.0, "a1": 100.0, "b": 0.0}
    weights = {"a": {"p1": 2.0, "p2": 1.0}, "a1": {"p2": 5.0}, "b": {"p1": 9.0}}
    got = raw_usage_by_pool(tree, own, weights)
    assert got["a1"] == {"p2": pytest.approx(100.0)}
    assert got["a"] == {"p1": pytest.approx(200.0), "p2": pytest.approx(200.0)}  # 300 split 2:1, + a1's 100
    assert sum(got["org"].values()) == pytest.approx(400.0)
    assert got["b"] == {}  # no decayed usage: nothing to split


def test_a_cycle_in_the_tree_does_not_loop():
    got = raw_usage_by_pool({"x": "y", "y": "x"}, {"x": 10.0}, {"x": {"p": 1.0}})
    assert got["x"] == {"p": 10.0} and got["y"] == {"p": 10.0}


def test_older_buckets_weigh_less_by_the_half_life(factory):
    now = datetime(2026, 12, 1, 12, tzinfo=UTC)
    h = 7 * DAY
    with transaction(factory) as s:
        for day, pool, usage in ((now.date(), "new", 1000), ((now - timedelta(days=7)).date(), "old", 1000),
                                 ((now - timedelta(days=400)).date(), "ancient", 10**9),
                                 (now.date(), "", 0)):
            s.add(UsageBucket(account_name="acct", day=day, pool=pool, gpu_seconds=usage, usage_gpu_seconds=usage,
                              adjustment_gpu_seconds=0, jobs=1))
    with transaction(factory) as s:
        w = own_pool_weights(s, now=now, half_life_s=h)
    # today's bucket ends after now: no decay; one ending 6.5 days ago: 2^(-6.5/7)
    assert w["acct"]["new"] == pytest.approx(1000.0)
    assert w["acct"]["old"] == pytest.approx(1000 * 2 ** (-6.5 / 7))
    assert "ancient" not in w["acct"] and "" not in w["acct"]  # beyond 20 half-lives; adjustments
