"""The admin page's quotas: every account's effective limits read at once (issue #46) are what
``effective_quota`` says for each account alone, inherited values and per-pool limits included."""

from __future__ import annotations

import dataclasses

from gateway.accounts import service as accounts
from gateway.kit.db import transaction
from gateway.models.accounts import AccountPoolQuota
from tests.ledger.dbfixtures import add_account


def test_all_effective_quotas_at_once_match_each_alone(factory):
    with transaction(factory) as s:
        add_account(s, "org", max_gpus=64, budget_gpu_seconds=10**6, budget_period="month")
        add_account(s, "lab", parent="org", max_gpus=32)
        add_account(s, "team", parent="lab", budget_gpu_seconds=5000, budget_period="rolling", budget_window_days=7)
        add_account(s, "solo", max_queued_jobs=3)
        add_account(s, "bare", parent="team")
        s.add_all([AccountPoolQuota(account_name="org", pool="slurm", max_gpus=16, guaranteed_gpus=8),
                   AccountPoolQuota(account_name="team", pool="slurm", max_gpus=4),
                   AccountPoolQuota(account_name="lab", pool="kube", guaranteed_gpus=2)])
    with transaction(factory) as s:
        every = accounts.effective_quotas(s, accounts.load_tree(s))
        alone = {name: accounts.effective_quota(s, name) for name in accounts.load_tree(s)}

    def plain(eff):
        return {k: ({p: dataclasses.astuple(v) for p, v in val.items()} if isinstance(val, dict) else
                    dataclasses.astuple(val) if dataclasses.is_dataclass(val) else val) for k, val in eff.items()}

    assert set(every) == {"org", "lab", "team", "solo", "bare"} <= set(alone)
    assert {n: plain(e) for n, e in every.items()} == {n: plain(alone[n]) for n in every}
    bare = every["bare"]
    assert (bare["max_gpus"].value, bare["max_gpus"].source) == (32, "lab")
    assert (bare["budget_gpu_seconds"].source, bare["budget_period"], bare["budget_window_days"]) == ("team", "rolling", 7)
    assert {p: (v.value, v.source) for p, v in bare["max_gpus_per_pool"].items()} == {"slurm": (4, "team")}
    assert {p: (v.value, v.source) for p, v in bare["guaranteed_gpus_per_pool"].items()} == {"kube": (2, "lab"),
                                                                                               "slurm": (8, "org")}
