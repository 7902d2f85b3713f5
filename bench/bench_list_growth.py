"""Reads at a small and a grown registry, side by side in one process (issue #32).

Usage: python bench/bench_list_growth.py [--requests 150] [--rounds 5] [--jobs 1000000] [--pending 50000]

bench/bench_submit_growth.py measures reads through HTTP for 5 s each on the same 2 cores as
the load generator; its reads that cannot depend on the registry's size (one job by id) moved
by 0.76-1.32 between its runs. This one takes the server and the load generator out: two
gateways in this process (the app with its middleware, through Starlette's test client, on
the benchmark Postgres; the dashboard's pages with a session made as its login makes one), one on a registry of `pending` waiting jobs and one page of history
(100 finished jobs), the other grown to `jobs` jobs with the same waiting ones, grown in SQL
as bench_submit_growth.py documents. Each round measures every read `requests` times on one
registry and then on the other, in turns; the figure is the median request time of each read
and the ratio small / grown (>= 0.9 is flat, as the issue asks). Writes docs/benchmarks.md,
section "list-growth".
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from contextlib import ExitStack

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.bench_api import SPEC
from bench.bench_submit_growth import (
    HISTORY_PAGE,
    UI_SECRET,
    dev_tokens,
    grow,
    ui_cookie,
)
from bench.common import fresh_database, machine, write_section

# read: (path, who): alice's bearer token, the admin's, or alice's / the admin's dashboard session.
READS = {"list 50": ("/v1/jobs?limit=50", "user"), "list 50 succeeded": ("/v1/jobs?limit=50&state=succeeded", "user"),
         "list 50 pending": ("/v1/jobs?limit=50&state=pending", "user"),
         "list 50 failed": ("/v1/jobs?limit=50&state=failed", "user"),
         "one job": ("/v1/jobs/{job}", "user"), "events": ("/v1/jobs/{job}/events", "user"),
         "usage report": ("/v1/admin/usage", "admin"), "page: jobs": ("/ui/", "user ui"),
         "page: one job": ("/ui/jobs/{job}", "user ui"), "page: accounts": ("/ui/accounts", "user ui"),
         "page: admin": ("/ui/admin", "admin ui")}


def gateway(stack: ExitStack, url: str, key: str):
    """A started app on ``url`` and the headers of each caller of READS."""
    os.environ.update({"ISTHMUS_DATABASE_URL": url, "ISTHMUS_DEV_MODE": "true", "ISTHMUS_DEV_KEY_PATH": key,
                       "ISTHMUS_LOG_LEVEL": "warning", "ISTHMUS_UI_SESSION_SECRET": UI_SECRET})
    from fastapi.testclient import TestClient

    from gateway.app import create_app
    from gateway.kit.settings import Settings

    client = stack.enter_context(TestClient(create_app(Settings())))
    user, adm = dev_tokens(dict(os.environ))
    headers = {"user": {"Authorization": f"Bearer {user}"}, "admin": {"Authorization": f"Bearer {adm}"}}
    for who, (tok, subject) in {"user ui": (user, "alice"), "admin ui": (adm, "root-admin")}.items():
        name, value = ui_cookie(url, tok, subject).split(": ", 1)  # "Cookie: ..."
        headers[who] = {name: value}
    return client, headers


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=150)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--jobs", type=int, default=1_000_000)
    ap.add_argument("--pending", type=int, default=50_000)
    ap.add_argument("--reads", default="", help="only these reads (comma-separated names of READS)")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    reads = {k: v for k, v in READS.items() if not args.reads or k in args.reads.split(",")}
    key = f"/tmp/bench-list-growth-{os.getpid()}.pem"
    t0 = time.monotonic()
    with ExitStack() as stack:
        sides = {}
        for side in ("small", "grown"):
            url = stack.enter_context(fresh_database(migrated=True))
            client, headers = gateway(stack, url, key)
            first = client.post("/v1/jobs", json=SPEC, headers=headers["user"])
            first.raise_for_status()
            job = first.json()["id"]
            history = HISTORY_PAGE if side == "small" else args.jobs - args.pending - 1
            grow(url, job, history=history, pending=args.pending)
            sides[side] = (client, headers, job)
        times: dict[tuple[str, str], list[float]] = {}
        for _ in range(args.rounds):
            for name, (path, who) in reads.items():
                for side, (client, headers, job) in sides.items():
                    u = path.format(job=job)
                    for _ in range(args.requests):
                        s = time.perf_counter()
                        r = client.get(u, headers=headers[who], follow_redirects=False)
                        times.setdefault((name, side), []).append(time.perf_counter() - s)
                    if r.status_code != 200:
                        raise SystemExit(f"{name} on {side}: {r.status_code} {r.text[:200]}")
    rows = []
    for name in reads:
        small = statistics.median(times[(name, "small")]) * 1e3
        grown = statistics.median(times[(name, "grown")]) * 1e3
        rows.append(f"| {name} | {small:.2f} | {grown:.2f} | {small / grown:.2f} |")
        print(rows[-1], flush=True)
    body = f"""## Reads at a small and a grown registry, in one process (issue #32)

`python bench/bench_list_growth.py --requests {args.requests} --rounds {args.rounds} --jobs {args.jobs} --pending {args.pending}`
({machine()}; run {time.strftime('%Y-%m-%d')}, {time.monotonic() - t0:.0f} s; Postgres of the test stack, nothing else running).
Two gateways in one process through Starlette's test client (no server, no load generator):
small = {args.pending:,} waiting jobs and {HISTORY_PAGE} finished, grown = {args.jobs:,} jobs of which {args.pending:,}
waiting. Median time of one request over {args.rounds} rounds of {args.requests}, the two registries in turns;
small / grown >= 0.9 is flat.

| read | small: median ms | grown: median ms | small / grown |
|---|---|---|---|
""" + "\n".join(rows) + "\n"
    print(body)
    if not args.no_write:
        write_section("list-growth", body)
    if os.path.exists(key):
        os.remove(key)


if __name__ == "__main__":
    main()
