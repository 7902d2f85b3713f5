"""Submission path before/after a change, in ONE run: two gateways side by side, measured in turns.

Usage: python bench/bench_api_ab.py --before REV [--seconds 8] [--concurrency 32] [--rate 100] [--repeats 3]
The "before" gateway runs the code of git revision REV (``git archive`` into a temporary
directory, put first on PYTHONPATH; same virtualenv), the "after" gateway this checkout.
Each has its own fresh Postgres database (the stack's server). Every repeat measures
before, then after, with the same load generators as bench/bench_api.py (hey closed loop,
vegeta open loop at a constant rate), so both see the same machine load. Medians go to
docs/benchmarks.md (section "api-ab").
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import uuid

from sqlalchemy import create_engine, text

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.bench_api import PG, hey, vegeta
from bench.common import (
    BIN,
    REPO,
    dirty,
    export_rev,
    free_port,
    machine,
    median,
    short_rev,
    wait_ready,
    write_section,
)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", required=True, help="git revision of the 'before' code")
    ap.add_argument("--seconds", type=float, default=8)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--rate", type=float, default=100)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    rev, after_rev = short_rev(args.before), short_rev("HEAD")
    changed = dirty()
    admin = create_engine(PG, isolation_level="AUTOCOMMIT")
    procs: list[subprocess.Popen] = []
    dbs: list[str] = []
    results: dict[str, dict[str, list[float]]] = {"before": {}, "after": {}}
    with tempfile.TemporaryDirectory(prefix="isthmus-ab-") as tmp:
        code = export_rev(rev, os.path.join(tmp, "before"))
        try:
            servers = {}
            for name, pythonpath in (("before", code), ("after", str(REPO))):
                db = f"isthmus_ab_{uuid.uuid4().hex[:6]}"
                with admin.connect() as c:
                    c.execute(text(f'CREATE DATABASE "{db}"'))
                dbs.append(db)
                env = {**os.environ, "PYTHONPATH": pythonpath, "ISTHMUS_DATABASE_URL": PG.rsplit("/", 1)[0] + "/" + db,
                       "ISTHMUS_DEV_MODE": "true", "ISTHMUS_DEV_KEY_PATH": os.path.join(tmp, f"{db}.pem"),
                       "ISTHMUS_LOG_LEVEL": "warning",
                       "ISTHMUS_MAX_PENDING_JOBS_PER_USER": "10000000",
                       "ISTHMUS_MAX_PENDING_JOBS_PER_ACCOUNT": "10000000"}
                cwd = code if name == "before" else str(REPO)
                subprocess.run([str(BIN / "isthmus"), "migrate"], env=env, check=True, capture_output=True, cwd=cwd)
                token = subprocess.run([str(BIN / "isthmus"), "token", "--user", "alice", "--groups", "team-a",
                                        "--lifetime", "7200"], env=env, check=True, capture_output=True,
                                       text=True, cwd=cwd).stdout.strip()
                port = free_port()
                proc = subprocess.Popen([str(BIN / "isthmus"), "serve", "--dev", "--port", str(port), "--workers",
                                         str(args.workers)], env=env, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL, cwd=cwd)
                procs.append(proc)
                wait_ready(f"http://127.0.0.1:{port}/healthz", proc, timeout_s=240)
                servers[name] = (f"http://127.0.0.1:{port}", token)
            for url, token in servers.values():  # warm-up
                hey(url, token, seconds=2, concurrency=8)
            for _ in range(args.repeats):
                for name, (url, token) in servers.items():
                    closed = hey(url, token, seconds=args.seconds, concurrency=args.concurrency)
                    opened = vegeta(url, token, seconds=args.seconds, rate=args.rate)
                    r = results[name]
                    for k, v in (("rps", closed["rps"]), ("p50", closed["p50"]), ("p99", closed["p99"]),
                                 ("open_p50", opened["p50"]), ("open_p99", opened["p99"]),
                                 ("errors", closed["errors"] + opened["errors"])):
                        r.setdefault(k, []).append(v)
                    print(f"{name:7} closed {closed['rps']:7.1f} req/s p50 {closed['p50']:6.1f} ms p99 "
                          f"{closed['p99']:6.1f} ms | open p50 {opened['p50']:6.1f} ms p99 {opened['p99']:6.1f} ms"
                          f" | errors {r['errors'][-1]}", flush=True)
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                try:
                    p.wait(20)
                except subprocess.TimeoutExpired:
                    p.kill()
            with admin.connect() as c:
                for db in dbs:
                    c.execute(text(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)'))
            admin.dispose()

    b, a = ({k: median(v) for k, v in results[n].items()} for n in ("before", "after"))
    after_label = f"{after_rev}{' + uncommitted changes' if changed else ''}"
    body = f"""## Submission path, before / after (`bench/bench_api_ab.py`)

`python bench/bench_api_ab.py --before {rev} --seconds {args.seconds:g} --concurrency {args.concurrency} --rate {args.rate:g} --repeats {args.repeats}`
({machine()}; both gateways up at once, uvicorn with {args.workers} workers each, measured in turns
(before, after) in each of {args.repeats} repeats, so they share the same machine load; medians;
run {time.strftime('%Y-%m-%d %H:%M')} UTC; host load average at the end {os.getloadavg()[0]:.1f}).
*before* is `{rev}`, *after* is `{after_label}`.

| | before | after | after / before |
|---|---|---|---|
| closed loop, {args.concurrency} clients: requests/s | {b['rps']:.0f} | {a['rps']:.0f} | {a['rps'] / b['rps']:.2f} |
| closed loop: latency p50 / p99 (ms) | {b['p50']:.1f} / {b['p99']:.1f} | {a['p50']:.1f} / {a['p99']:.1f} | |
| open loop at {args.rate:g} req/s, evenly spaced: latency p50 / p99 (ms) | {b['open_p50']:.1f} / {b['open_p99']:.1f} | {a['open_p50']:.1f} / {a['open_p99']:.1f} | |
| errors (non-202) | {b['errors']:.0f} | {a['errors']:.0f} | |
"""
    print(body)
    write_section("api-ab", body)


if __name__ == "__main__":
    main()
