"""Guaranteed and borrowed GPUs (gateway/domain/guarantee.py) and reclaim in the round's decision
(gateway/domain/decide.py): in memory, no database, no cluster. The same rules run on real
Slurm and Kueue in tests/recovery/test_reclaim.py."""

from __future__ import annotations

from gateway.domain.decide import decide
from gateway.domain.guarantee import Guarantees
from gateway.domain.preempt import Running
from tests.unit.test_decide import NOW, PARAMS, job, snapshot, view

CHAINS = {"org": ("org",), "team-a": ("org", "team-a"), "team-b": ("org", "team-b"), "team-c": ("team-c",)}


def test_a_gang_is_within_its_guarantee_only_while_every_guarantee_over_it_has_room():
    g = Guarantees(chains=CHAINS, overall={"team-a": 16, "org": 24}, per_pool={("team-b", "kube"): 8},
                   held={"team-a": 8, "team-b": 8}, held_pool={("team-a", "slurm"): 8, ("team-b", "kube"): 8})
    assert g.within("team-a", "slurm", 8)  # 8 of 16 held; org 16 of 24
    assert not g.within("team-a", "slurm", 16)  # team-a's own 16 would be exceeded
    assert not g.within("team-b", "kube", 8)  # its pool guarantee is full
    assert g.within("team-b", "slurm", 8)  # no guarantee of team-b's own covers slurm, but org's does
    assert g.applying("team-b", "slurm") == [("org", "overall", 24, 16)]
    assert not g.within("team-c", "slurm", 1)  # no guarantee anywhere over team-c: borrowed
    assert "no guarantee of team-c's covers pool slurm" in g.words("team-c", "slurm", 1)
    g.take("team-a", "slurm", 8)  # org now holds 24 within its guarantee
    assert not g.within("team-b", "slurm", 8)
    assert g.words("team-a", "slurm", 8).startswith("borrowed: team-a's guarantee over all pools is 16 GPUs")


def test_work_within_a_guarantee_goes_first_and_claims_are_marked_borrowed_or_not():
    g = Guarantees(chains=CHAINS, overall={"team-a": 8})
    b1, a1 = job("b1", "team-b"), job("a1", "team-a")
    result = decide(snapshot(now=NOW, picked=[b1, a1], views={"slurm": view("slurm", nodes=1, idle=1)},
                             guarantees=g), PARAMS)
    assert [(c.job.id, c.borrowed) for c in result.claims] == [("a1", False)]  # before b1, in fair-share order
    assert result.claims[0].guarantee.startswith("within team-a's guarantee of 8 GPUs")
    [waiting] = result.waiting
    assert waiting.job.id == "b1" and waiting.reason.startswith("waiting for capacity")
    borrowed = decide(snapshot(now=NOW, picked=[job("b2", "team-b")], views={"slurm": view("slurm", nodes=1, idle=1)},
                               guarantees=g), PARAMS)
    assert [(c.job.id, c.borrowed) for c in borrowed.claims] == [("b2", True)]


def running(jid: str, account: str = "team-b", *, ran_s: float = 3600, checkpoint_ago_s: float | None = None,
            pool: str = "slurm", nodes: int = 1) -> Running:
    start = NOW.timestamp() - ran_s
    return Running(id=jid, account=account, pool=pool, gpus=8 * nodes, nodes=nodes, borrowed=True, started_at=start,
                   checkpoint_at=None if checkpoint_ago_s is None else NOW.timestamp() - checkpoint_ago_s)


def test_a_guaranteed_gang_that_fits_nowhere_reclaims_the_cheapest_borrowed_gang_old_enough():
    g = Guarantees(chains=CHAINS, overall={"team-a": 16})
    victims = [running("fresh-ckpt", checkpoint_ago_s=60), running("no-ckpt"), running("young", ran_s=30),
               running("mine", "team-a")]
    gang = job("gang", "team-a", workers=1)
    snap = snapshot(now=NOW, picked=[gang], views={"slurm": view("slurm", nodes=4, idle=0)}, guarantees=g,
                    running=victims)
    result = decide(snap, PARAMS)
    assert result.claims == []
    [reclaim] = result.reclaims
    assert reclaim.job is gang and [v.id for v in reclaim.eviction.victims] == ["fresh-ckpt"]
    [waiting] = result.waiting
    assert waiting.reason.startswith("reclaiming borrowed GPUs to start team-a's gang (8 GPUs) within its "
                                     "guarantee on slurm: stops 1 borrowed job of team-b")
    # Victims still stopping for it: it waits for them, nothing more is chosen.
    again = decide(snapshot(now=NOW, picked=[gang], views={"slurm": view("slurm", nodes=4, idle=0)}, guarantees=g,
                            running=victims[1:], reclaiming={"gang": ("fresh-ckpt",)}), PARAMS)
    assert again.reclaims == []
    assert [w.reason for w in again.waiting] == [
        "reclaiming borrowed GPUs: waiting for the jobs it stops (fresh-ckpt) to give them back"]


def test_borrowed_work_never_reclaims_and_a_full_guarantee_does_not_either():
    g = Guarantees(chains=CHAINS, overall={"team-a": 8}, held={"team-a": 8})
    snap = snapshot(now=NOW, picked=[job("a2", "team-a"), job("c1", "team-c")],
                    views={"slurm": view("slurm", nodes=2, idle=0)}, guarantees=g,
                    running=[running("b1"), running("b2")])
    assert decide(snap, PARAMS).reclaims == []


def test_the_rate_limit_per_pool_holds_within_a_round():
    g = Guarantees(chains=CHAINS, overall={"team-a": 64})
    jobs = [job(f"a{i}", "team-a") for i in range(3)]
    snap = snapshot(now=NOW, picked=jobs, views={"slurm": view("slurm", nodes=3, idle=0)}, guarantees=g,
                    running=[running(f"b{i}") for i in range(3)])
    params = PARAMS.__class__(**{**PARAMS.__dict__, "preempt_max_per_pool_per_minute": 2})
    result = decide(snap, params)
    assert [r.job.id for r in result.reclaims] == ["a0", "a1"]
    assert len({v.id for r in result.reclaims for v in r.eviction.victims}) == 2  # never the same victim twice
