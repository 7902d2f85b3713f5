"""Maintenance windows in the scheduling simulator (issue #31): what the planner's backfill
before a window saves against draining the pool ahead, and that nothing runs across a window.

    .venv/bin/python bench/simulate_windows.py [--jobs 12000] [--load 0.8] [--seeds 1,2,3] [--no-write]

The trace and pools are bench/simulate.py's. Windows, placed in the middle of the trace:

* ``slurm-h100``: the whole pool in maintenance for 4 h;
* ``slurm-a100``: 16 of its 64 nodes in maintenance for 2 h, starting 6 h later.

Two ways to keep jobs off them, each replayed through the planner (gateway/domain/planner.py):

* **drain ahead**, what operators do without a planner that knows the window: drain the nodes
  one longest time limit before the window (``scontrol update state=drain``), so that
  whatever runs there has ended when the window starts. Modelled as the same window
  starting that much earlier;
* **planner**: the window itself; jobs short enough to end before it still start (backfill).

Measures, per seed: idle GPU-hours of the window's capacity in the lead-up (from one longest
time limit before the window to its start); how many jobs ran across a window (0 by the
rule); gang waits (median, p99); overall GPU utilisation. Medians over the seeds, and the
ratio of the two ways, measured in the same run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import machine, pct, write_section
from bench.simulate import POOLS, make_trace
from gateway.domain.planner import Hold, Outage
from gateway.domain.sim_result import SimResult
from gateway.domain.simulate import simulate


def windows(trace) -> list[tuple[str, int, float, float]]:
    """(pool, nodes, start, end): the scenario's windows, in the middle of the trace."""
    mid = trace[len(trace) // 2].arrival
    return [("slurm-h100", 32, mid, mid + 4 * 3600), ("slurm-a100", 16, mid + 6 * 3600, mid + 8 * 3600)]


def longest_limit(trace, pool: str) -> float:
    kind = next(p.kind for p in POOLS if p.name == pool)
    return max(j.time_limit_s for j in trace if kind in j.kinds)


def outages(trace, *, drain: bool) -> list[Outage]:
    out = []
    for pool, nodes, start, end in windows(trace):
        lead = longest_limit(trace, pool) if drain else 0.0
        out.append(Outage(pool, nodes, start - lead, end, f"{pool} maintenance"))
    return out


def lead_up_busy_gpu_h(res: SimResult, trace) -> float:
    """GPU-hours the windows' pools ran, from one longest limit before each window to its start,
    the window's share of each pool (its nodes over the pool's)."""
    total = 0.0
    for pool, nodes, start, _ in windows(trace):
        p = next(p for p in POOLS if p.name == pool)
        lo = start - longest_limit(trace, pool)
        busy = 0.0
        for o in res.outcomes:
            if o.pool != pool or o.start is None:
                continue
            end = o.end if o.end is not None else start
            a, b = max(o.start, lo), min(end, start)
            if b > a:
                busy += o.held_gpus * (b - a)
        total += nodes / p.nodes * busy / 3600
    return total


def crossed(res: SimResult, trace) -> int:
    """Jobs whose run overlapped a window on its pool (whole-pool windows: any; partial: none
    can be told apart here, so only whole-pool windows are counted)."""
    n = 0
    for pool, nodes, start, end in windows(trace):
        if nodes != next(p.nodes for p in POOLS if p.name == pool):
            continue
        n += sum(1 for o in res.outcomes if o.pool == pool and o.start is not None
                 and o.start < end and (o.end if o.end is not None else float("inf")) > start)
    return n


def hold_of(trace, shares) -> tuple[Hold, str]:
    """The scenario's advance reservation: 16 of slurm-a100's 64 nodes for 24 h from a third of
    the trace, for the largest-share account (first by name)."""
    account = min(shares, key=lambda a: (-shares[a], a))
    start = trace[len(trace) // 3].arrival
    return Hold("deadline", "slurm-a100", frozenset({account}), 16, start, start + 24 * 3600,
                f"16 nodes of slurm-a100 held for {account}"), account


def waits_in(res: SimResult, account: str, lo: float, hi: float) -> list[float]:
    """Waits of ``account``'s gangs that arrived in [lo, hi)."""
    return [o.start - o.job.arrival for o in res.outcomes
            if o.job.account == account and o.job.workers >= 2 and lo <= o.job.arrival < hi and o.start is not None]


def gang_waits(res: SimResult) -> list[float]:
    return [o.start - o.job.arrival for o in res.outcomes if o.start is not None and o.job.workers >= 2]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=12_000)
    ap.add_argument("--accounts", type=int, default=24)
    ap.add_argument("--load", type=float, default=0.8)
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args()
    rows: dict[str, list[dict]] = {"no window (reference)": [], "drain ahead": [], "planner": []}
    t0 = time.monotonic()
    for seed in (int(s) for s in a.seeds.split(",")):
        trace, shares = make_trace(a.jobs, a.load, seed, a.accounts)
        ref_busy = None
        for label, drain in (("no window (reference)", None), ("drain ahead", True), ("planner", False)):
            res = simulate(trace, POOLS, shares, outages=() if drain is None else outages(trace, drain=drain))
            busy = lead_up_busy_gpu_h(res, trace)
            ref_busy = busy if drain is None else ref_busy
            waits = gang_waits(res)
            rows[label].append({"lost": ref_busy - busy, "crossed": crossed(res, trace),
                                "p50": statistics.median(waits), "p99": pct(waits, 99), "util": res.utilisation})
    holds_rows: dict[str, list[dict]] = {"without the reservation": [], "with the reservation": []}
    for seed in (int(s) for s in a.seeds.split(",")):
        trace, shares = make_trace(a.jobs, a.load, seed, a.accounts)
        h, account = hold_of(trace, shares)
        for label, held in (("without the reservation", ()), ("with the reservation", (h,))):
            res = simulate(trace, POOLS, shares, holds=held)
            waits = waits_in(res, account, h.start, h.end - 3600)
            holds_rows[label].append({
                "honoured": res.holds_honoured.get(h.id), "p50": statistics.median(waits) if waits else 0.0,
                "used": res.hold_used_gpu_s.get(h.id, 0.0) / 3600, "util": res.utilisation})
    elapsed = time.monotonic() - t0

    def med(label: str, key: str) -> float:
        return statistics.median(r[key] for r in rows[label])

    def h(s: float) -> str:
        return f"{s / 3600:.1f} h"

    drain_lost, plan_lost = med("drain ahead", "lost"), med("planner", "lost")
    lines = []
    for label in rows:
        lines.append(f"| {label} | {med(label, 'lost'):,.0f} | {max(r['crossed'] for r in rows[label])} | "
                     f"{h(med(label, 'p50'))} | {h(med(label, 'p99'))} | {med(label, 'util'):.1%} |")
    trace, _ = make_trace(a.jobs, a.load, int(a.seeds.split(",")[0]), a.accounts)
    lead = {pool: longest_limit(trace, pool) for pool, *_ in windows(trace)}
    body = f"""## Maintenance windows in the simulator (`bench/simulate_windows.py`, issue #31)

{machine()}. bench/simulate.py's pools and trace generator: {a.jobs:,} jobs, offered load
{a.load:g}, {a.accounts} accounts, seeds {a.seeds} (medians over the seeds; {elapsed:.0f} s in all).
Windows in the middle of each trace: all 32 nodes of `slurm-h100` for 4 h, then 16 of the 64
nodes of `slurm-a100` for 2 h starting 6 h later. **drain ahead** drains the window's nodes one
longest time limit before it (seed {a.seeds.split(",")[0]}: {", ".join(f"{p} {h(s)}" for p, s in lead.items())}), as an
operator does without a planner that knows the window; **planner** gives the planner the window
itself, so jobs that end in time still start before it (backfill). Every start is decided by
`gateway/domain/planner.py`, as in the dispatcher.

| keeping jobs off the windows | GPU-h lost on the windows' nodes in the lead-up | jobs run across a whole-pool window (max over seeds) | gang wait p50 | gang wait p99 | GPU utilisation |
|---|---:|---:|---:|---:|---:|
{chr(10).join(lines)}

"Lost" is the GPU-hours the windows' nodes ran in the lead-up (one longest time limit before
each window, to its start) in the reference replay without windows, less what they ran with
the windows: work the windows pushed off those nodes. The planner loses **{plan_lost:,.0f}**
GPU-hours where draining ahead loses **{drain_lost:,.0f}** ({plan_lost / drain_lost:.2f}x, same
traces, same run). No job ran across a whole-pool window under either (by the rule: a start is
planned only where its time limit ends by the window; the reference row shows how many would
have without one). What the planner still loses is lead-up time no waiting job was short enough
to use.
"""
    hold_lines = []
    held_total = 16 * 8 * 24
    for label, got in holds_rows.items():
        honoured = "-" if got[0]["honoured"] is None else \
            f"{sum(1 for r in got if r['honoured'])} of {len(got)}"
        used = "-" if got[0]["honoured"] is None else \
            f"{statistics.median(r['used'] for r in got):,.0f} of {held_total:,}"
        hold_lines.append(f"| {label} | {honoured} | {used} | {h(statistics.median(r['p50'] for r in got))} | "
                          f"{statistics.median(r['util'] for r in got):.1%} |")
    body += f"""
**Advance reservation.** The same traces with 16 of `slurm-a100`'s 64 nodes (128 GPUs) held for
24 h, from a third of the way through the trace, for the account with the largest share. The
gateway holds it in its planner (`Hold`). "Honoured" means no other account's gang held any of
its nodes at its start. Its account's gangs run in it when their whole time limit fits inside
it. Idle held capacity is not lent to others.

| | honoured at its start (seeds) | GPU-h its account ran in it (of those held) | that account's gang wait p50 (arrived while held) | GPU utilisation |
|---|---:|---:|---:|---:|
{chr(10).join(hold_lines)}
"""
    print(body)
    if not a.no_write:
        write_section("simulate-windows", body)


if __name__ == "__main__":
    main()
