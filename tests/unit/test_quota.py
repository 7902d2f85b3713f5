"""The quota rules (gateway/domain/quota.py) over in-memory views: the words users read when a
gang does not fit, and the apply step's second judgement. The same functions judge a single
job's reservation, the submit path and the dispatch round (tests/ledger/ run them on SQLite
and Postgres)."""

from __future__ import annotations

from types import SimpleNamespace

from gateway.domain import quota
from gateway.domain.quota import ChainView, Held, PoolTerms, Quota, Tally

POOLS = PoolTerms(costs={"slurm": 2.0, "kube": None}, routable=("kube", "slurm"),
                  weights={("slurm", "h100"): 3.0, ("kube", "*"): 0.5})


def chain_view(**kw) -> ChainView:
    return ChainView(parent={"org": None, "team": "org"}, pools=POOLS, **kw)


def gang(jid: str, gpus: int = 8, hours: float = 1.0):
    return SimpleNamespace(id=jid, account_name="team", total_gpus=gpus, time_limit_s=int(hours * 3600))


def test_billing_weight_is_the_types_then_the_pools_default_then_its_cost_then_one():
    assert POOLS.weight("slurm", "H100") == 3.0  # types compare in lower case
    assert POOLS.weight("slurm", "a100") == 2.0  # no weight for the type: the pool's cost
    assert POOLS.weight("kube", "a100") == 0.5  # the pool's default "*"
    assert POOLS.weight("elsewhere", None) == 1.0
    assert POOLS.cheapest("h100") == 0.5


def test_the_first_failing_limit_leaf_first_names_the_account_and_the_numbers():
    v = chain_view(quotas={"org": Quota(max_gpus=16), "team": Quota(max_gpus=32)},
                   held={"org": Held(12), "team": Held(12)})
    assert quota.refusal(v, ("org", "team"), gpus=8, pools=["slurm"], committed=1) == \
        "org: 12 of 16 concurrent GPUs in use, job needs 8"
    assert quota.refusal(v, ("org", "team"), gpus=4, pools=["slurm"], committed=1) is None


def test_a_per_pool_limit_refuses_only_when_it_blocks_every_pool_asked():
    v = chain_view(pool_limits={("team", "slurm"): 8}, pool_held={("team", "slurm"): 8})
    assert quota.refusal(v, ("org", "team"), gpus=8, pools=["slurm", "kube"], committed=1) is None
    assert quota.refusal(v, ("org", "team"), gpus=8, pools=["slurm"], committed=1) == \
        "team: 8 of 8 concurrent GPUs in use in pool slurm, job needs 8"


def test_a_budget_counts_what_was_charged_this_period_and_what_is_committed():
    v = chain_view(quotas={"team": Quota(budget_gpu_seconds=10 * 3600, budget_period="window", budget_window_days=7)},
                   held={"team": Held(0, 3 * 3600)}, charged={"team": 6 * 3600})
    assert quota.refusal(v, ("org", "team"), gpus=8, pools=["slurm"], committed=2 * 3600) == (
        "team: GPU-hour budget in the last 7 days: 6.0 used + 3.0 committed of 10.0 GPU-hours, job needs 2.0")
    assert quota.refusal(v, ("org", "team"), gpus=8, pools=["slurm"], committed=3600) is None


def test_a_chain_that_cannot_be_walked_is_refused_with_its_name_not_guessed():
    t = Tally(ChainView(parent={"team": "gone"}, pools=POOLS))
    assert t.limited("team")
    assert t.reserve(gang("j"), "slurm", 8, None) == "the account chain of 'team' cannot be read (removed, or a cycle)"
    assert t.reservations == []


def test_the_apply_step_judges_the_limited_chains_again_over_fresh_totals():
    t = Tally(chain_view(quotas={"team": Quota(max_gpus=16)}))
    assert t.reserve(gang("j1"), "slurm", 8, None) is None
    assert t.reserve(gang("j2"), "slurm", 8, None) is None
    [r1, _r2] = t.reservations
    assert (r1.committed, r1.weight, r1.limited) == (16 * 3600, 2.0, True)
    # Nothing moved: both still fit. Another writer took 8 GPUs meanwhile: the second no longer does.
    assert quota.recheck(chain_view(quotas={"team": Quota(max_gpus=16)}), t.reservations) is None
    moved = chain_view(quotas={"team": Quota(max_gpus=16)}, held={"team": Held(8)})
    assert quota.recheck(moved, t.reservations) == "job j2: team: 16 of 16 concurrent GPUs in use, job needs 8"


def test_never_admissible_names_the_tightest_limit_of_every_pool():
    v = chain_view(quotas={"org": Quota(max_gpus=64)}, pool_limits={("team", "slurm"): 16, ("org", "kube"): 8})
    assert quota.never_admissible(v, ("org", "team"), account="team", total_gpus=16, pools=["slurm", "kube"]) is None
    assert quota.never_admissible(v, ("org", "team"), account="team", total_gpus=32, pools=["slurm", "kube"]) == (
        "this job can never run: it asks 32 GPUs at once, more than the concurrent-GPU limit of account team on "
        "every pool it may use (slurm: max_gpus_per_pool[slurm] = 16 (set on account team); kube: "
        "max_gpus_per_pool[kube] = 8 (set on account org))")
    assert quota.never_admissible(v, ("org", "team"), account="team", total_gpus=128, pools=["slurm"]).endswith(
        "on every pool (max_gpus = 64, set on account org)")


def test_the_caps_count_what_was_read_and_what_the_batch_admitted_before():
    read = quota.CapRead(chain=[], counts={("user", "ana"): 3, ("tree", "org"): 8},
                         checks=[(("user", "ana"), 5, "user ana has {n} of 5 pending jobs allowed per user", True),
                                 (("tree", "org"), 10, "org: {n} of 10 pending jobs (max_queued_jobs of org)", True)],
                         touches=(("user", "ana"), ("tree", "org")), key_counter=None)
    tally = quota.CapTally()
    assert quota.cap_refusal(read, tally, adding=2) is None
    quota.count(read, tally, adding=2)
    assert quota.cap_refusal(read, tally) == (
        "user ana has 5 of 5 pending jobs allowed per user; wait for jobs to start or cancel some")
    read.counts[("user", "ana")] = 0  # the user's cap leaves room: the subtree's is the first to refuse
    assert quota.cap_refusal(read, quota.CapTally(), adding=3) == (
        "org: 8 of 10 pending jobs (max_queued_jobs of org); this request adds 3; wait for jobs to start or cancel "
        "some")
