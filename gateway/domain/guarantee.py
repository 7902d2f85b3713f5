"""Guaranteed and borrowed GPUs (docs/recovery.md): one rule, pure.

An administrator may give an account a guarantee beside its limit: ``guaranteed_gpus``
over all pools, and per pool. Like a limit, a guarantee set on an account covers its
whole subtree. A gang runs **within its guarantee** when at least one account of its
chain (the account and its ancestors) sets a guarantee that applies to the pool it goes
to, and every such guarantee still has room for it: the GPUs the subtree already holds
as guaranteed work plus the gang's stay within it. Any other gang runs **borrowed**: on
GPUs nobody guaranteed it, which work within a guarantee may reclaim.

The dispatcher asks :meth:`Guarantees.within` before each claim (the answer is recorded
on the job) and :meth:`Guarantees.may_be_within` to order a round: work that may run
within a guarantee is placed before borrowed work.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence


@dataclasses.dataclass
class Guarantees:
    """The guarantees in force and what guaranteed work holds now, for one round.

    ``chains``: each account the round asks about, with its ancestors, root first (the
    account tree's one walk, gateway/accounts/tree.py ``walk_up``). ``overall`` and
    ``per_pool``: the guarantees set (account -> GPUs; (account, pool) -> GPUs).
    ``held`` / ``held_pool``: GPUs that work within a guarantee holds now, per account
    (its own gangs only: the subtree sums are made here) and per (account, pool).
    """

    chains: Mapping[str, Sequence[str]]
    overall: Mapping[str, int]
    per_pool: Mapping[tuple[str, str], int] = dataclasses.field(default_factory=dict)
    held: dict[str, int] = dataclasses.field(default_factory=dict)
    held_pool: dict[tuple[str, str], int] = dataclasses.field(default_factory=dict)
    _sub: dict[str, int] = dataclasses.field(default_factory=dict, init=False, repr=False)
    _sub_pool: dict[tuple[str, str], int] = dataclasses.field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        # Subtree sums: every account of a holder's chain holds what the holder holds.
        for account, gpus in self.held.items():
            for a in self.chains.get(account, (account,)):
                self._sub[a] = self._sub.get(a, 0) + gpus
        for (account, pool), gpus in self.held_pool.items():
            for a in self.chains.get(account, (account,)):
                self._sub_pool[(a, pool)] = self._sub_pool.get((a, pool), 0) + gpus

    def applying(self, account: str, pool: str) -> list[tuple[str, str, int, int]]:
        """The guarantees that cover a gang of ``account`` in ``pool``, leaf first:
        (account they are set on, "overall" or the pool, GPUs guaranteed, GPUs held)."""
        out = []
        for a in reversed(tuple(self.chains.get(account, (account,)))):
            if a in self.overall:
                out.append((a, "overall", self.overall[a], self._sub.get(a, 0)))
            if (a, pool) in self.per_pool:
                out.append((a, pool, self.per_pool[(a, pool)], self._sub_pool.get((a, pool), 0)))
        return out

    def within(self, account: str, pool: str, gpus: int) -> bool:
        """Whether a gang of ``gpus`` GPUs of ``account`` in ``pool`` runs within its guarantee."""
        applying = self.applying(account, pool)
        return bool(applying) and all(held + gpus <= guaranteed for _, _, guaranteed, held in applying)

    def may_be_within(self, account: str, pools: Sequence[str], gpus: int) -> bool:
        """Whether the gang would run within its guarantee in at least one of ``pools``."""
        return any(self.within(account, pool, gpus) for pool in pools)

    def take(self, account: str, pool: str, gpus: int) -> None:
        """A gang within its guarantee was claimed this round: its chain now holds it."""
        for a in self.chains.get(account, (account,)):
            self._sub[a] = self._sub.get(a, 0) + gpus
            self._sub_pool[(a, pool)] = self._sub_pool.get((a, pool), 0) + gpus

    def words(self, account: str, pool: str, gpus: int) -> str:
        """Why the gang runs within its guarantee or borrowed, for its events."""
        applying = self.applying(account, pool)
        if not applying:
            return f"borrowed: no guarantee of {account}'s covers pool {pool}"
        full = [(a, where, g, h) for a, where, g, h in applying if h + gpus > g]
        if full:
            a, where, g, h = full[0]
            scope = "over all pools" if where == "overall" else f"in pool {where}"
            return f"borrowed: {a}'s guarantee {scope} is {g} GPUs and its work holds {h} within it"
        a, where, g, h = applying[0]
        scope = "over all pools" if where == "overall" else f"in pool {where}"
        return f"within {a}'s guarantee of {g} GPUs {scope} ({h} held before it)"
