"""The simulator's books (simulate.py): the usage each attempt is charged, decayed for fair
share as the gateway's ledger decays it, and the busy GPU time inside the measured window."""

from __future__ import annotations

import collections
import math
from collections.abc import Iterable, Mapping

from gateway.domain.fairshare import compute_fairshare


class SimLedger:
    """Charges and fair-share factors for one replay.

    Decayed usage is kept as of a fixed epoch ``t0``: a charge at t adds
    gpu_s * 2^((t - t0) / h), and the value at ``now`` is that sum times 2^(-(now - t0) / h).
    O(1) per charge.
    """

    def __init__(self, shares: Mapping[str, int], *, t0: float, window: tuple[float, float],
                 half_life_s: float) -> None:
        self.tree = {a: (None, s) for a, s in shares.items()}
        self.t0 = t0
        self.win = window
        self.decay = math.log(2) / half_life_s
        self.grown: dict[str, float] = collections.defaultdict(float)
        self.window_usage: dict[str, float] = collections.defaultdict(float)
        self.busy = 0.0
        self.used = 0.0
        self.spans: list[tuple[float, float, float]] = []
        self.factors: dict[str, float] = {}
        self.factors_at = -math.inf

    def charge(self, account: str, gpu_s: float, start: float, end: float, now: float) -> None:
        """An attempt ran from ``start`` to ``end`` holding ``gpu_s`` GPU-seconds in all."""
        self.grown[account] += gpu_s * math.exp(self.decay * (now - self.t0))
        self.used += gpu_s
        self.spans.append((start, end, gpu_s))
        lo, hi = max(start, self.win[0]), min(end, self.win[1])
        if hi > lo:
            part = gpu_s * (hi - lo) / (end - start) if end > start else 0.0
            self.busy += part
            self.window_usage[account] += part

    def refresh_factors(self, now: float, running: Iterable[tuple[str, float]]) -> None:
        """Fair-share factors as of ``now``; ``running``: (account, GPU-seconds so far) of each
        running gang, counted as accrual does."""
        k = math.exp(-self.decay * (now - self.t0))
        own = {a: v * k for a, v in self.grown.items()}
        for account, gpu_s in running:
            own[account] = own.get(account, 0.0) + gpu_s
        fs = compute_fairshare(self.tree, own)
        self.factors = {a: f.factor for a, f in fs.items()}
        self.factors_at = now
