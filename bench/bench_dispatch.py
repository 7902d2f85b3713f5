"""Dispatcher benchmarks: picking the next jobs, and end-to-end dispatch to real backends.

Usage: python bench/bench_dispatch.py pick [--pending 100000 --accounts 1000 --repeats 20]
Writes the section "dispatch-pick" of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
import uuid
from datetime import timedelta

from sqlalchemy import create_engine, insert, text

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.common import machine, median, pct, write_section  # noqa: E402

PG = os.environ.get("ISTHMUS_BENCH_POSTGRES_URL", "postgresql+psycopg://isthmus:isthmus@127.0.0.1:5432/isthmus")


def pick(args) -> None:
    from gateway.accounts.models import Account
    from gateway.cli import run_migrations
    from gateway.dispatch.service import pending_order
    from gateway.jobs.models import Job
    from gateway.kit.db import make_engine, make_sessionmaker
    from gateway.kit.timeutil import new_id, utcnow
    from gateway.ledger import service as ledger

    db = f"isthmus_bench_{uuid.uuid4().hex[:6]}"
    admin = create_engine(PG, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{db}"'))
    url = PG.rsplit("/", 1)[0] + "/" + db
    try:
        run_migrations(url)
        engine = make_engine(url)
        sessions = make_sessionmaker(engine)
        now = utcnow()
        rnd = random.Random(7)
        accounts = [f"acct-{i:05d}" for i in range(args.accounts)]
        with engine.begin() as conn:
            conn.execute(insert(Account), [{"name": a, "shares": rnd.randint(1, 10)} for a in accounts])
            batch = []
            for i in range(args.pending):
                jid = new_id()
                batch.append(dict(
                    id=jid, name=f"j{i}", account_name=rnd.choice(accounts), submitted_by="bench", username="alice",
                    requested_backend="auto", backend=None, state="pending", state_reason="", spec={"command": ["true"]},
                    workers=1, gpus_per_worker=8, total_gpus=8, time_limit_s=3600, priority=rnd.randint(-5, 5),
                    routing_reason="", dispatch_attempts=0, created_at=now - timedelta(seconds=args.pending - i),
                    updated_at=now))
                if len(batch) == 5000:
                    conn.execute(insert(Job), batch)
                    batch = []
            if batch:
                conn.execute(insert(Job), batch)
        with engine.begin() as conn:
            conn.execute(text("ANALYZE"))
        pick_ms, fs_ms = [], []
        for _ in range(args.repeats):
            with sessions() as s, s.begin():
                t = time.perf_counter()
                factors = {n: f.factor for n, f in ledger.fairshare(s, now=now).items()}
                t1 = time.perf_counter()
                jobs = pending_order(s, now=now, limit=100, lock=True, factors=factors)
                t2 = time.perf_counter()
                assert len(jobs) == 100
                s.rollback()
            fs_ms.append((t1 - t) * 1e3)
            pick_ms.append((t2 - t1) * 1e3)
        engine.dispose()
    finally:
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)'))
        admin.dispose()
    body = f"""## Dispatcher: picking the next 100 jobs

`python bench/bench_dispatch.py pick --pending {args.pending} --accounts {args.accounts} --repeats {args.repeats}`
({machine()}; Postgres 15 on loopback; run {time.strftime('%Y-%m-%d')}). {args.pending:,} pending jobs spread over
{args.accounts:,} accounts with random priorities. "Pick" is `pending_order`: the next 100 jobs in
fair-share order (accounts by factor, then priority, then age), locked `FOR UPDATE SKIP LOCKED`.
The fair-share factors (one `ledger.fairshare` call per dispatch round) are timed separately.

| | median | p90 |
|---|---|---|
| pick next 100 of {args.pending:,} pending (ms) | {median(pick_ms):.1f} | {pct(pick_ms, 90):.1f} |
| fair-share factors for {args.accounts:,} accounts (ms) | {median(fs_ms):.1f} | {pct(fs_ms, 90):.1f} |

Target: pick <= 50 ms ({'met' if median(pick_ms) <= 50 else 'NOT met'}).
"""
    print(body)
    write_section("dispatch-pick", body)


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="what", required=True)
    p = sub.add_parser("pick")
    p.add_argument("--pending", type=int, default=100_000)
    p.add_argument("--accounts", type=int, default=1000)
    p.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    if args.what == "pick":
        pick(args)


if __name__ == "__main__":
    main()
