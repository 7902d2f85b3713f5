"""Fair-share maths (Slurm's classic algorithm over the account tree; docs/ledger.md).

Numbers in, numbers out: the ledger (gateway/ledger/service.py::fairshare) reads the
decayed usage and shares, the simulator (gateway/domain/simulate.py) keeps its own.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime


def decay(value: float, since: datetime, until: datetime, half_life_s: float) -> float:
    return value * 2.0 ** (-(until - since).total_seconds() / half_life_s)


@dataclasses.dataclass
class FairShare:
    account: str
    parent: str | None
    shares: int  # raw shares of the account
    level_shares: int  # sum of raw shares of the account and its siblings
    norm_shares: float  # S: product down the tree of shares / level_shares
    raw_usage: float  # decayed GPU-seconds of the subtree at `now`
    norm_usage: float  # U_A: raw_usage / total decayed usage
    effective_usage: float  # U_E (classic: children of the root use U_A)
    factor: float  # F = 2^(-U_E / S)


def compute_fairshare(tree: dict[str, tuple[str | None, int]], own_usage: dict[str, float]) -> dict[str, FairShare]:
    """Slurm's classic fair-share over a tree (pure function; docs/ledger.md)."""
    kids: dict[str | None, list[str]] = {}
    for name, (parent, _) in tree.items():
        kids.setdefault(parent if parent in tree else None, []).append(name)
    raw: dict[str, float] = {}
    order: list[str] = []
    stack = list(kids.get(None, []))
    while stack:  # pre-order; reversed gives children before parents
        n = stack.pop()
        order.append(n)
        stack.extend(kids.get(n, []))
    for n in reversed(order):
        raw[n] = own_usage.get(n, 0.0) + sum(raw[k] for k in kids.get(n, []))
    total = sum(raw[k] for k in kids.get(None, []))
    # Each level's share sum once per parent, not once per child: O(accounts), not
    # O(accounts x siblings) (1,000 siblings under one root cost 220 ms per round).
    level_of = {parent: sum(tree[s][1] for s in siblings) for parent, siblings in kids.items()}
    out: dict[str, FairShare] = {}
    for n in order:  # parents before children
        parent, shares = tree[n]
        parent = parent if parent in tree else None
        level = level_of[parent]
        frac = shares / level if level > 0 else 0.0
        norm_s = frac * (out[parent].norm_shares if parent else 1.0)
        ua = raw[n] / total if total > 0 else 0.0
        ue = ua if parent is None else ua + (out[parent].effective_usage - ua) * frac
        factor = 2.0 ** (-ue / norm_s) if norm_s > 0 else 0.0
        out[n] = FairShare(account=n, parent=parent, shares=shares, level_shares=level, norm_shares=norm_s,
                           raw_usage=raw[n], norm_usage=ua, effective_usage=ue, factor=factor)
    return out
