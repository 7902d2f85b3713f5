"""One dispatch round as the pending queue grows: 10k, 100k, 1M pending jobs over 100 pools (issue #46).

    .venv/bin/python bench/bench_round_scale.py [--jobs 10000,100000,1000000] [--pools 100] [--rounds 15]

The round of bench/bench_dispatch_round.py (the real ``Dispatcher.dispatch_round()``: the
capacity snapshot, fair share, the pick of the window, the ledger read, routing and the
plan over every pool, the claims and reservations; submission stubbed) on a fresh Postgres
database per size, with the same accounts and pools at every size: only the number of jobs
that wait changes. A round claims 100 jobs, so its cost should follow the jobs it looks at
(the window of 128), not the jobs that wait. Per round: wall and CPU milliseconds, SQL
statements, and rows read by Postgres (sequentially scanned rows plus index entries read,
over every table and index, from ``pg_stat_get_xact_tuples_returned`` just before each of
the round's transactions commits). Target (#46): a round at 1,000,000 pending jobs over 100
pools in <= 500 ms. The section "dispatch-round-scale" of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_dispatch_round import (
    ACCOUNTS,
    _dispatcher,
    _host_speed,
    _round_trip_ms,
)
from bench.common import fresh_database, machine, pct, write_section

# Rows read by the transaction so far: sequentially scanned heap rows plus index entries
# returned, over every relation of the database's own schema (pending, not yet flushed stats).
_ROWS_READ = """
SELECT coalesce(sum(pg_stat_get_xact_tuples_returned(c.oid)), 0)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'public' AND c.relkind IN ('r', 'i')
"""


def _seed(url: str, jobs: int) -> None:
    """``ACCOUNTS`` accounts and ``jobs`` pending jobs, as bench_dispatch_round seeds them, written by
    Postgres itself (``generate_series``): a million rows in a minute, not ten."""
    from sqlalchemy import create_engine, text

    from gateway.kit.timeutil import utcnow
    from gateway.models.accounts import Account

    engine = create_engine(url)
    now = utcnow()
    with engine.begin() as conn:
        conn.execute(Account.__table__.insert(), [{"name": f"acct-{i:02d}", "parent_name": None, "shares": 1 + i % 3,
                                                   "description": "", "created_at": now} for i in range(ACCOUNTS)])
    step = 100_000
    for lo in range(0, jobs, step):
        with engine.begin() as conn:  # ids in submission order, as new_id() makes them
            conn.execute(text("""
INSERT INTO job (id, name, account_name, submitted_by, username, requested_pool, pool, state, state_reason,
                 spec, workers, gpus_per_worker, total_gpus, time_limit_s, priority, routing_reason,
                 dispatch_attempts, created_at, updated_at)
SELECT format('%s-0000-7000-8000-000000000000', lpad(to_hex(g), 8, '0')), 'j',
       'acct-' || lpad((g % :accounts)::text, 2, '0'), 'dev:alice', 'alice', 'auto', NULL, 'pending', '',
       json_build_object('command', json_build_array('true'),
                         'gpu_type', (ARRAY['a100', 'h100', NULL])[g % 3 + 1],
                         'cpus_per_worker', 1, 'memory_per_worker', '4Gi'),
       1, 8, 8, 3600, g % 5, '', 0, :now, :now
FROM generate_series(CAST(:lo AS bigint), CAST(:hi AS bigint) - 1) AS g
"""), {"accounts": ACCOUNTS, "now": now, "lo": lo, "hi": min(jobs, lo + step)})
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE"))  # as autovacuum would have by the time a queue is this long
    engine.dispose()


def _rounds(url: str, pools: int, rounds: int) -> dict[str, list[float]]:
    """``rounds`` rounds of the dispatcher over ``pools`` stand-in pools: ms, CPU ms, statements, rows read."""
    from sqlalchemy import event

    engine, sessions, dispatcher = _dispatcher(url, pools)
    seen: list[int] = []
    read: list[int] = []

    def rows_read(conn) -> int:
        # On the DBAPI cursor: not a statement of the round, not counted as one.
        with conn.connection.dbapi_connection.cursor() as cur:
            cur.execute(_ROWS_READ)
            return int(cur.fetchone()[0])

    # Postgres 15's "xact" counters hold everything since the backend last flushed its
    # statistics (at most once a second, between transactions), not only this transaction:
    # the difference between its start and its commit is the transaction's own.
    def begin(conn) -> None:
        read.append(-rows_read(conn))

    def before_commit(conn) -> None:
        read.append(rows_read(conn))

    event.listen(engine, "before_cursor_execute", lambda *a: seen.append(1))
    event.listen(engine, "begin", begin)
    event.listen(engine, "commit", before_commit)
    out: dict[str, list[float]] = {"ms": [], "cpu": [], "statements": [], "rows": []}
    for _ in range(rounds):
        seen.clear()
        read.clear()
        t0, c0 = time.perf_counter(), time.process_time()
        claimed = dispatcher.dispatch_round()
        out["ms"].append((time.perf_counter() - t0) * 1000)
        out["cpu"].append((time.process_time() - c0) * 1000)
        out["statements"].append(len(seen))
        out["rows"].append(sum(read))
        assert len(claimed) == 100, len(claimed)
    event.remove(engine, "begin", begin)
    event.remove(engine, "commit", before_commit)
    with sessions() as s:
        from gateway.ledger import reading as ledger_reading

        assert ledger_reading.verify(s) == [], "the batched reservations must match the ledger entries"
    engine.dispose()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", default="10000,100000,1000000", help="pending jobs, comma-separated")
    ap.add_argument("--pools", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--no-write", action="store_true", help="print the section, leave docs/benchmarks.md as it is")
    a = ap.parse_args()
    sizes = [int(x) for x in a.jobs.split(",")]
    load_before, speed_before = os.getloadavg()[0], _host_speed()
    results: dict[int, dict[str, list[float]]] = {}
    trips: list[float] = []
    for jobs in sizes:
        with fresh_database(migrated=True) as url:
            t0 = time.perf_counter()
            _seed(url, jobs)
            seeded_s = time.perf_counter() - t0
            trips.append(_round_trip_ms(url))
            got = _rounds(url, a.pools, a.rounds + 1)
        results[jobs] = {k: v[1:] for k, v in got.items()}  # the first round warms caches
        r = results[jobs]
        print(f"{jobs:>9} pending: median {statistics.median(r['ms']):.1f} ms, CPU {statistics.median(r['cpu']):.1f} ms, "
              f"{statistics.median(r['statements']):.0f} statements, {statistics.median(r['rows']):.0f} rows read "
              f"(seeded in {seeded_s:.0f} s)", flush=True)
    load_after, speed_after = os.getloadavg()[0], _host_speed()
    med = {j: {k: statistics.median(v) for k, v in r.items()} for j, r in results.items()}
    top = max(sizes)
    ok = med[top]["ms"] <= 500
    body = "\n".join([
        "## One dispatch round as the queue grows (`bench/bench_round_scale.py`, #46)",
        "",
        (f"`python bench/bench_round_scale.py --jobs {a.jobs} --pools {a.pools} --rounds {a.rounds}` "
         f"({machine()}; Postgres 15 of the test stack; run {time.strftime('%Y-%m-%d %H:%M')} UTC). The round of "
         f"`bench/bench_dispatch_round.py` (the real `dispatch_round()`: 100 jobs claimed, routed over {a.pools} "
         f"stand-in pools and reserved; the reservation policy's window of 128, at most 16 per account) on a "
         f"fresh database per size, with the same {ACCOUNTS} accounts and {a.pools} pools: only the jobs that wait "
         f"change. Medians of {a.rounds} rounds per size (the first, which warms caches, left out). Rows read: "
         "heap rows scanned plus index entries read by Postgres in the round's transactions, every table and index."),
        "",
        ("| pending jobs | median ms / round | p90 ms | median CPU ms / round (gateway process) | "
         "SQL statements / round | rows read / round |"),
        "|---|---|---|---|---|---|",
        *(f"| {j:,} | {med[j]['ms']:.1f} | {pct(results[j]['ms'], 90):.1f} | "
          f"{med[j]['cpu']:.1f} | {med[j]['statements']:.0f} | {med[j]['rows']:,.0f} |" for j in sizes),
        "",
        (f"Target: a round at {top:,} pending jobs over {a.pools} pools in <= 500 ms: "
         f"**{'met' if ok else 'NOT met'}** ({med[top]['ms']:.1f} ms; {med[top]['ms'] / med[min(sizes)]['ms']:.2f} "
         f"times the round at {min(sizes):,}). For scale, Armada reports about 1.27 s per scheduling cycle at "
         f"320,000 jobs. Load average (1 min) {load_before:.1f} before and {load_after:.1f} after, on "
         f"{os.cpu_count()} CPUs; a fixed pure-Python workload took {speed_before:.1f} ms before and "
         f"{speed_after:.1f} ms after; one `SELECT 1` round trip {statistics.median(trips):.3f} ms (median)."),
    ])
    print(body)
    if not a.no_write:
        write_section("dispatch-round-scale", body)


if __name__ == "__main__":
    main()
