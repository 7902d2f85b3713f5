"""Flaky nodes in the scheduling simulator (issue #48, item 4): GPU-hours lost to node failures
with and without the node-health rule keeping retries and gangs off the nodes that fail them.

    .venv/bin/python bench/simulate_flaky.py [--jobs 12000] [--load 0.8] [--seeds 1,2,3,4,5] [--no-write]

The trace and pools are bench/simulate.py's. The failure model is gateway/domain/sim_failures.py's
(its docstring): named nodes on the Slurm (node-exclusive) pools, ``--flaky`` flaky nodes per
such pool drawn from the seed, a gang on a flaky node failing after an exponential run time
with mean ``--flaky-mttf-h``, on a healthy node with mean ``--healthy-mttf-days``; a failed
attempt loses its work since its last checkpoint and is retried by the gateway's retry rule;
its record names the node that failed (Slurm's DOWN node), which the rule alone blames.
Policies replayed through the planner on the same traces and seeds:

* **none**: a retry may land anywhere, flaky nodes keep getting gangs;
* **avoidance**: a retry keeps off the nodes that failed it for 6 h (``nodehealth.avoided``);
* **avoidance + quarantine**: also, nodes ``nodehealth.verdicts`` finds suspect (failures of
  2 accounts within 1 h) get no gang and leave the planner's capacity until the simulated
  admin clears them ``--clear-h`` later; cleared, a flaky node is as flaky as before;
* **... cleared nodes repaired**: the same, the admin's clear mending a flaky node;
* **... the rule's window 6 h**: quarantine with ``Thresholds(window_s=6 h)`` instead of 1 h
  (not the default: what a longer window would catch);
* **... backend does not say which node failed**: quarantine with ``FailureModel(blame_gang=True)``:
  the record names no failed node, so the rule blames every node of the gang (a Kubernetes
  node deleted with its pods).

Measures per seed, medians over the seeds; the ratio of lost GPU-hours against "none" is taken
per seed (same trace, same run) and its median given.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import machine, pct, write_section
from bench.simulate import POOLS, make_trace
from gateway.domain.nodehealth import Thresholds
from gateway.domain.sim_failures import (
    AVOID,
    NONE,
    QUARANTINE,
    FailureModel,
    simulate_failures,
)
from gateway.domain.sim_result import SimResult

HOUR = 3600.0
WINDOW = "avoidance + quarantine, the rule's window 6 h"
GANG = "avoidance + quarantine, backend does not say which node failed"
VARIANTS = {  # label -> (policy, repair on clear, the rule's window in s, the whole gang blamed)
    "none": (NONE, False, 3600.0, False),
    "avoidance": (AVOID, False, 3600.0, False),
    "avoidance + quarantine": (QUARANTINE, False, 3600.0, False),
    "avoidance + quarantine, cleared nodes repaired": (QUARANTINE, True, 3600.0, False),
    WINDOW: (QUARANTINE, False, 6 * 3600.0, False),
    GANG: (QUARANTINE, False, 3600.0, True),
}


def gang_waits(res: SimResult) -> list[float]:
    """Each started gang's whole wait: to its first start, and from each failure to its retry."""
    attempts = collections.defaultdict(list)
    for jid, _, _, start, end, outcome in res.attempt_log:
        attempts[jid].append((start, end, outcome))
    out = []
    for o in res.outcomes:
        if o.job.workers < 2 or o.start is None:
            continue
        ready, wait = o.job.arrival, 0.0
        for start, end, _ in sorted(attempts.get(o.job.id, [(o.start, o.end, "")])):
            wait += start - ready
            ready = end
        out.append(wait)
    return out


def measure(res: SimResult, horizon: float) -> dict:
    waits = gang_waits(res)
    quarantined = res.quarantine_log
    return {"lost": res.failed_gpu_hours, "lost_share": res.failed_gpu_hours * HOUR / res.used_gpu_seconds,
            "fails": res.failed_attempts, "flaky_fails": sum(o.flaky_failures for o in res.outcomes),
            "repeat": sum(1 for o in res.outcomes if o.flaky_failures >= 2),
            "gave_up": sum(1 for o in res.outcomes if o.gave_up),
            "p50": statistics.median(waits), "p99": pct(waits, 99), "util": res.utilisation,
            "quarantines": len(quarantined), "healthy_q": sum(1 for q in quarantined if not q[4]),
            "q_node_h": sum(min(q[3], horizon) - q[2] for q in quarantined) / HOUR}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=12_000)
    ap.add_argument("--accounts", type=int, default=24)
    ap.add_argument("--load", type=float, default=0.8)
    ap.add_argument("--seeds", default="1,2,3,4,5")
    ap.add_argument("--flaky", type=int, default=2, help="flaky nodes per Slurm pool")
    ap.add_argument("--flaky-mttf-h", type=float, default=4.0)
    ap.add_argument("--healthy-mttf-days", type=float, default=250.0)
    ap.add_argument("--checkpoint-min", type=float, default=30.0, help="0: jobs never checkpoint")
    ap.add_argument("--clear-h", type=float, default=4.0)
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args()
    seeds = [int(s) for s in a.seeds.split(",")]
    rows: dict[str, list[dict]] = {label: [] for label in VARIANTS}
    t0 = time.monotonic()
    days = []
    for seed in seeds:
        trace, shares = make_trace(a.jobs, a.load, seed, a.accounts)
        last = trace[-1].arrival
        days.append(last / 86400)
        window, horizon = (0.1 * last, last), last + 7 * 86400
        for label, (policy, repair, window_s, gang) in VARIANTS.items():
            m = FailureModel(policy=policy, seed=seed, flaky_per_pool=a.flaky, flaky_mttf_s=a.flaky_mttf_h * HOUR,
                             thresholds=Thresholds(window_s=window_s),
                             healthy_mttf_s=a.healthy_mttf_days * 86400, clear_after_s=a.clear_h * HOUR,
                             checkpoint_every_s=a.checkpoint_min * 60 or None, repair_on_clear=repair,
                             blame_gang=gang)
            t = time.perf_counter()
            res = simulate_failures(trace, POOLS, shares, m, window=window, horizon=horizon)
            got = measure(res, horizon)
            none = rows["none"][-1]["lost"] if label != "none" else got["lost"]
            got["ratio"] = got["lost"] / none if none else 1.0
            rows[label].append(got)
            print(f"seed {seed} {label:62} {time.perf_counter() - t:5.1f} s "
                  + " ".join(f"{k} {v:.3g}" for k, v in got.items()), flush=True)
    elapsed = time.monotonic() - t0

    def med(label: str, key: str) -> float:
        return statistics.median(r[key] for r in rows[label])

    def h(s: float) -> str:
        return f"{s / HOUR:.1f} h" if s >= HOUR else f"{s / 60:.0f} min"

    def ratio(label: str) -> str:
        if label == "none":
            return "1.00x"
        got = [r["ratio"] for r in rows[label]]
        return f"{statistics.median(got):.2f}x ({min(got):.2f}-{max(got):.2f})"

    lines = [f"| {label} | {med(label, 'lost'):,.0f} ({med(label, 'lost_share'):.2%}) | "
             f"{ratio(label)} | {med(label, 'fails'):.0f} ({med(label, 'flaky_fails'):.0f}) | "
             f"{med(label, 'repeat'):.0f} | {med(label, 'gave_up'):.0f} | {h(med(label, 'p50'))} | "
             f"{h(med(label, 'p99'))} | {med(label, 'util'):.1%} | "
             f"{med(label, 'quarantines'):.0f} ({med(label, 'healthy_q'):.0f}) | {med(label, 'q_node_h'):,.0f} |"
             for label in VARIANTS]
    def rel(label: str, to: str) -> float:
        """Median over the seeds of ``label``'s lost GPU-hours over ``to``'s."""
        pairs = zip(rows[label], rows[to], strict=True)
        return statistics.median(x["lost"] / y["lost"] if y["lost"] else 1.0 for x, y in pairs)

    def wins(label: str, to: str) -> int:
        return sum(1 for x, y in zip(rows[label], rows[to], strict=True) if x["lost"] < y["lost"])

    def p99s(label: str) -> str:
        got = [r["p99"] for r in rows[label]]
        return f"{h(min(got))}-{h(max(got))}"

    slurm = [p for p in POOLS if p.kind == "slurm"]
    q, qr, av = "avoidance + quarantine", "avoidance + quarantine, cleared nodes repaired", "avoidance"
    flaky_node_h = len(slurm) * a.flaky * statistics.median(days) * 24
    body = f"""## Flaky nodes in the simulator (`bench/simulate_flaky.py`, issue #48)

{machine()}. bench/simulate.py's pools and trace generator: {a.jobs:,} jobs, offered load {a.load:g},
{a.accounts} accounts, seeds {a.seeds} ({statistics.median(days):.1f} days of arrivals each; medians over
the seeds; {elapsed:.0f} s in all). Every start is decided by `gateway/domain/planner.py`, as in the
dispatcher; the failure model and the policies are `gateway/domain/sim_failures.py`'s.

**Failure model.** The nodes of the Slurm pools ({", ".join(f"`{p.name}` {p.nodes}" for p in slurm)}
nodes) are named; a gang takes the lowest-numbered idle nodes it may use, as Slurm's node
order does. {a.flaky} nodes of each are **flaky**, drawn from the seed. A gang running on a
flaky node fails after an exponential run time with mean **{a.flaky_mttf_h:g} h**; on a healthy node
with mean **{a.healthy_mttf_days:g} days** (about the rate the Llama 3 report gives: 419 unexpected
interruptions in 54 days on 16,384 GPUs, one per some 260 days of an 8-GPU node). A gang fails
at the first of its nodes' draws, and the draws are a function of (seed, job, attempt, node),
so the same attempt on the same node fails at the same time under every policy. The Kubernetes
pools (which place GPUs, not nodes, and run every 1-GPU job) never fail here. A failed attempt
(`node_failure`) is charged for its run, loses its work since its last checkpoint
({f"every {a.checkpoint_min:g} minutes of run" if a.checkpoint_min else "none: its whole attempt"}), and is run again by the gateway's retry rule (`retry.verdict`,
at most 3 attempts, the default), waiting again in its original place in line; after the third
failure the job fails. The record of a failure is the gateway's: an `AttemptEnd` naming the
attempt's nodes and, in `failed_nodes`, the node that failed, as Slurm reports that node DOWN;
the rule (`AttemptEnd.blamed`) blames that node alone, for avoidance, quarantine and cost.

**Policies.** **none**: a retry may land anywhere. **avoidance**: a retry takes no node that
`nodehealth.avoided` names for it (the nodes its failures are blamed on, for 6 h); when too few
others are idle it waits, as Slurm holds a job with `--exclude`. **avoidance + quarantine**: also,
after each failure `nodehealth.verdicts` (defaults: failures of 2 accounts within 1 h) judges the
node it is blamed on; a suspect node gets no gang and leaves its pool's capacity for the planner
until the simulated admin clears it **{a.clear_h:g} h** later; cleared, a flaky node is as flaky as
before (the admin found nothing). **... cleared nodes repaired**: the admin's clear mends it.
**... the rule's window 6 h**: not the default, the rule with `Thresholds(window_s=6 h)`: what a
longer window would catch. **... backend does not say which node failed**: quarantine with
`FailureModel(blame_gang=True)`: the record names no failed node, so the rule blames every node of
the gang, as the gateway must when a Kubernetes node is deleted with its pods (and as this
simulator did before `failed_nodes`: this row is the earlier "avoidance + quarantine" row).

| policy | GPU-h lost to failures (share of GPU time used) | lost against none, same seed: median (range) | failed attempts (on a flaky node) | jobs failed on a flaky node more than once | jobs failed for good (3 failures) | gang wait p50 | gang wait p99 | GPU utilisation | nodes quarantined (healthy ones) | node-hours in quarantine |
|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|
{chr(10).join(lines)}

Lost GPU-hours are the work failed attempts threw away (since their last checkpoint); the
attempts' whole runs are charged and counted in utilisation. A gang's wait is its whole wait:
to its first start, and from each failure to its retry's start. The loss under no policy varies
a lot between seeds (which jobs land on the flaky nodes), hence the per-seed ratios.

Avoidance alone loses {med(av, 'ratio'):.2f}x what no policy loses: it keeps a job off the node that
failed it (jobs failed on a flaky node more than once: {med(av, 'repeat'):.0f} against {med('none', 'repeat'):.0f}; jobs
failed for good: {med(av, 'gave_up'):.0f} against {med('none', 'gave_up'):.0f}, which is why utilisation, failed runs included, is
higher), but the node stays in service and fails the next job placed there. Since only the
failed node is avoided, a retry is not held for a whole gang's worth of other nodes: the gangs'
p99 wait is {h(med(av, 'p99'))}, as with no policy ({h(med('none', 'p99'))}).

Quarantine loses {med(q, 'ratio'):.2f}x what no policy loses, {rel(q, av):.2f}x what avoidance alone
loses (less in {wins(q, av)} of {len(seeds)} seeds), and takes out only nodes that failed: {med(q, 'quarantines'):.0f}
quarantines, {med(q, 'healthy_q'):.0f} of a healthy node, {med(q, 'q_node_h'):,.0f} node-hours out of service. Blaming
the whole gang (last row) quarantines {med(GANG, 'quarantines'):.0f} times, {med(GANG, 'healthy_q'):.0f} of them a healthy node
that shared a failed gang with a flaky one, takes {med(GANG, 'q_node_h'):,.0f} node-hours out of service, and
saves nothing over avoidance ({rel(GANG, av):.2f}x what avoidance blaming the failed node loses). Naming
the failed node turns quarantine from no gain into a modest one; it still saves little, for two
reasons. The rule is slow to catch a
node that fails a gang every {a.flaky_mttf_h:g} h of run on average: it needs two accounts' failures on
it within 1 h, so the {len(slurm) * a.flaky} flaky nodes were quarantined {med(q, 'quarantines') - med(q, 'healthy_q'):.0f} times in
{statistics.median(days):.1f} days, out of service {med(q, 'q_node_h') / flaky_node_h:.0%} of the time, failing gangs the rest. And
each is back {a.clear_h:g} h later, as flaky. When the admin's clear mends the node, quarantine loses
{med(qr, 'ratio'):.2f}x: repair, not the quarantine, is what removes the loss. A 6 h window catches
more often ({med(WINDOW, 'quarantines'):.0f} quarantines, {med(WINDOW, 'healthy_q'):.0f} of healthy nodes) and loses {rel(WINDOW, q):.2f}x
what the 1 h window loses (less in {wins(WINDOW, q)} of {len(seeds)} seeds; {med(WINDOW, 'ratio'):.2f}x against none).
The gangs' p99 wait is {h(med(q, 'p99'))} with quarantine against {h(med(av, 'p99'))} with avoidance alone, but
per seed the two overlap ({p99s(q)} against {p99s(av)}): the p99 of a few hundred gangs moves a lot
between seeds. A quarantined node leaves its pool for {a.clear_h:g} h, which can hold a gang that needs
nearly the whole pool.
"""
    print(body)
    if not a.no_write:
        write_section("simulate-flaky", body)


if __name__ == "__main__":
    main()
