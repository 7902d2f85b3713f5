"""The dispatch round before/after a change, in ONE run: the two code versions measured in turns.

Usage: python bench/bench_round_ab.py --before REV [--after REV] [--jobs 100000] [--rounds 15] [--pools 10] [--repeats 3]

The "before" code is git revision REV (``git archive`` into a temporary directory), the
"after" code this checkout (with any uncommitted changes), or with ``--after`` another
revision exported the same way (the committed code only: in a working tree that others
edit too, their uncommitted changes would be measured with yours). Each measurement runs in its own
Python process with that tree first on ``sys.path``, and uses that tree's own
``bench/bench_dispatch_round.py`` (``_seed`` and ``_rounds``) on a fresh Postgres database
migrated by that tree's own migrations, so a schema change between the two (a renamed
column) is measured as each version really runs. The repeats alternate before, after,
before, after ..., so a slow spell of the shared host hits both. Medians of all rounds (each
run's first round, which warms caches, left out) and the ratio go to docs/benchmarks.md
(section "dispatch-round-ab").
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.common import REPO, dirty, export_rev, machine, short_rev, write_section

# Runs inside the measured tree: its own models, migrations, dispatcher and bench helpers.
_DRIVER = """
import json, sys
sys.path.insert(0, {tree!r})
from bench import bench_dispatch_round as b
from bench.common import fresh_database
with fresh_database(migrated=True) as url:
    b._seed(url, {jobs})
    ms = b._rounds(url, {pools}, {rounds} + 1)[1:]
print("RESULT " + json.dumps({{"ms": ms, "cpu": b.CPU[{pools}][1:], "statements": b.STATEMENTS[1:]}}))
"""


def _run(tree: str, *, jobs: int, pools: int, rounds: int) -> dict:
    env = {**os.environ, "PYTHONPATH": tree, "ISTHMUS_LOG_LEVEL": "warning"}
    code = _DRIVER.format(tree=tree, jobs=jobs, pools=pools, rounds=rounds)
    out = subprocess.run([sys.executable, "-c", code], cwd=tree, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"the round failed in {tree}:\n{out.stderr[-3000:]}")
    [line] = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
    return json.loads(line[len("RESULT "):])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", required=True, help="git revision of the 'before' code")
    ap.add_argument("--after", help="git revision of the 'after' code (default: this checkout as it is)")
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--pools", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    before_rev, after_rev = short_rev(a.before), short_rev(a.after or "HEAD")
    changed = "" if a.after else dirty()
    results = {"before": {"ms": [], "cpu": [], "statements": [], "runs": []},
               "after": {"ms": [], "cpu": [], "statements": [], "runs": []}}
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="isthmus-round-ab-") as tmp:
        before_tree = export_rev(before_rev, os.path.join(tmp, "before"))
        after_tree = export_rev(after_rev, os.path.join(tmp, "after")) if a.after else str(REPO)
        trees = (("before", before_tree), ("after", after_tree))
        for repeat in range(a.repeats):
            for name, tree in trees:
                got = _run(tree, jobs=a.jobs, pools=a.pools, rounds=a.rounds)
                r = results[name]
                r["ms"] += got["ms"]
                r["cpu"] += got["cpu"]
                r["statements"] += got["statements"]
                r["runs"].append(statistics.median(got["ms"]))
                print(f"{name:6} repeat {repeat + 1}: median {r['runs'][-1]:.1f} ms/round", flush=True)
    b, n = results["before"], results["after"]
    med = {k: statistics.median(v["ms"]) for k, v in results.items()}
    ratio = med["after"] / med["before"]
    after_label = f"{after_rev}{' + uncommitted changes' if changed else ''}"
    body = "\n".join([
        "## One dispatch round, before / after (`bench/bench_round_ab.py`)",
        "",
        (f"`python bench/bench_round_ab.py --before {before_rev}{f' --after {after_rev}' if a.after else ''} --jobs {a.jobs} --rounds {a.rounds} "
        f"--pools {a.pools} --repeats {a.repeats}` ({machine()}; Postgres; run {time.strftime('%Y-%m-%d %H:%M')} UTC; "
        f"load average {load_before:.1f} at the start and {os.getloadavg()[0]:.1f} at the end). The round of "
        "`bench/bench_dispatch_round.py` (100 of the pending jobs claimed over "
        f"{a.pools} stand-in pools, routed and reserved), each version running its own code, migrations and "
        f"seed on a fresh database, in turns. *before* is `{before_rev}`, *after* is `{after_label}`."),
        "",
        "| | before | after | after / before |",
        "|---|---|---|---|",
        f"| median ms / round | {med['before']:.1f} | {med['after']:.1f} | {ratio:.2f} |",
        (f"| each run's median ms | {', '.join(f'{m:.1f}' for m in b['runs'])} | "
        f"{', '.join(f'{m:.1f}' for m in n['runs'])} | |"),
        (f"| median CPU ms / round (gateway process) | {statistics.median(b['cpu']):.1f} | "
        f"{statistics.median(n['cpu']):.1f} | {statistics.median(n['cpu']) / statistics.median(b['cpu']):.2f} |"),
        (f"| SQL statements / round (median) | {statistics.median(b['statements']):.0f} | "
        f"{statistics.median(n['statements']):.0f} | |"),
    ])
    print(body)
    write_section("dispatch-round-ab", body)


if __name__ == "__main__":
    main()
