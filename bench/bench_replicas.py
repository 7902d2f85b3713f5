"""Throughput with replicas (issue #47, item 7): do locks serialise the replicas?

    .venv/bin/python bench/bench_replicas.py [--seconds 10] [--repeats 2] [--jobs 20000] [--claims 3000]

Two measurements on the benchmark Postgres (bench/common.py), each side by side in turns
(one, many, many, one, ... so that a slow spell of the shared host hits both):

- **API**: submissions/s of ONE ``isthmus serve`` process against THREE, each with one
  uvicorn worker and no dispatcher (``ISTHMUS_DISPATCH_IN_SERVE=false``: an API replica), on
  one database. ``hey`` drives each with 32 closed-loop clients in all (32 on the one; 11,
  11 and 10 on the three, at once), one user of one account: every submission takes the same
  account's cap row and the same caller's idempotency count, the worst case for locks.
- **Dispatch**: jobs claimed per second by ONE dispatcher process against TWO, on a database
  seeded with ``jobs`` pending jobs of 50 accounts, until ``claims`` jobs are claimed. The
  dispatchers are real ``gateway.dispatch.Dispatcher`` objects in their own processes over
  10 in-process stand-in pools (adapters/standin.py, named as such: a fixed capacity, nothing
  to submit to; the submission itself is left out as in bench_dispatch_round.py), so the
  figure is the rounds' own work and their locks (the pick's ``FOR UPDATE SKIP LOCKED``, the
  ledger chains locked root first). After each run: no job claimed twice, ``verify()`` empty.

This machine has 2 cores: more processes cannot be faster here; the goal is that they are
not slower (issue #47: at least 0.9 of one). Writes the section "replicas" of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bench_api import start
from bench.bench_dispatch_round import _pools, _seed
from bench.bench_submit_growth import dev_tokens, hey
from bench.common import BIN, free_port, fresh_database, machine, write_section


def _hey_all(urls: list[str], token: str, seconds: float, concurrency: int) -> float:
    """Submissions/s summed over ``urls``, ``concurrency`` clients split between them, all at once
    (bench_submit_growth.py's ``hey`` per replica, each in its own thread)."""
    from concurrent.futures import ThreadPoolExecutor

    shares = [concurrency // len(urls) + (1 if i < concurrency % len(urls) else 0) for i in range(len(urls))]
    with ThreadPoolExecutor(len(urls)) as pool:
        runs = list(pool.map(lambda uc: hey(uc[0] + "/v1/jobs", token, seconds=seconds, concurrency=uc[1], post=True),
                             zip(urls, shares, strict=True)))
    bad = sum(r["errors"] for r in runs)
    if bad:
        raise SystemExit(f"{bad} submissions failed")
    return sum(r["rps"] for r in runs)


def api(args) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"one": [], "three": []}
    with fresh_database(migrated=True) as url:
        key = f"/tmp/{url.rsplit('/', 1)[1]}-dev.pem"
        env = {**os.environ, "ISTHMUS_DATABASE_URL": url, "ISTHMUS_DEV_MODE": "true", "ISTHMUS_DEV_KEY_PATH": key,
               "ISTHMUS_LOG_LEVEL": "warning", "ISTHMUS_DISPATCH_IN_SERVE": "false",
               "ISTHMUS_MAX_PENDING_JOBS_PER_USER": "10000000", "ISTHMUS_MAX_PENDING_JOBS_PER_ACCOUNT": "10000000"}
        user, _adm = dev_tokens(env)
        ports = [free_port() for _ in range(3)]
        servers = []
        try:
            for port in ports:
                servers.append(start([str(BIN / "isthmus"), "serve", "--dev", "--port", str(port), "--workers", "1"],
                                     env, port))
            urls = [f"http://127.0.0.1:{p}" for p in ports]
            _hey_all(urls, user, 2, 12)  # warm-up, every replica
            for _ in range(args.repeats):
                for label, chosen in (("one", urls[:1]), ("three", urls), ("three", urls), ("one", urls[:1])):
                    rps = _hey_all(chosen, user, args.seconds, 32)
                    out[label].append(rps)
                    print(f"api {label}: {rps:.0f} submissions/s", flush=True)
        finally:
            for s in servers:
                s.terminate()
            for s in servers:
                s.wait(timeout=30)
    return out


def _dispatch_worker(url: str, pools: int, target: int, ready, go, result) -> None:
    from sqlalchemy import func, select

    from adapters.standin import StandInPool
    from gateway.dispatch import Dispatcher
    from gateway.kit.db import make_engine, make_sessionmaker
    from gateway.kit.settings import Settings
    from gateway.models.jobs import Job

    engine = make_engine(url, pool_size=4)
    sessions = make_sessionmaker(engine)
    settings = Settings(database_url=url, dispatch_batch=100, capacity_ttl_s=0, routing_weights="{}")
    dispatcher = Dispatcher(sessions=sessions, backends={n: StandInPool(k, t, nodes=2000) for n, k, t, _ in _pools(pools)},
                            settings=settings.dispatch)
    dispatcher.submitter.submit_all = lambda *a, **kw: None  # stand-ins: nothing to submit to
    ready.set()
    go.wait()
    claimed = rounds = 0
    while True:
        with sessions() as s:
            done = s.scalar(select(func.count()).select_from(Job).where(Job.state == "dispatching"))
        if done >= target:
            break
        got = dispatcher.dispatch_round()
        rounds += 1
        claimed += len(got)
    result.put((claimed, rounds))
    engine.dispose()


def dispatch(args) -> dict[str, list[float]]:
    from sqlalchemy import delete, func, select

    from gateway.kit.db import make_engine, make_sessionmaker
    from gateway.ledger import reading as ledger_reading
    from gateway.models.jobs import Job
    from gateway.models.pools import Pool
    from gateway.pools.config import PoolConfig
    from gateway.pools.service import reconcile

    out: dict[str, list[float]] = {"one": [], "two": []}
    ctx = mp.get_context("spawn")
    for _ in range(args.repeats):
        for label, n in (("one", 1), ("two", 2), ("two", 2), ("one", 1)):
            with fresh_database(migrated=True) as url:
                _seed(url, args.jobs)
                engine = make_engine(url, pool_size=2)
                sessions = make_sessionmaker(engine)
                with sessions.begin() as s:
                    s.execute(delete(Pool))
                    reconcile(s, [PoolConfig(name=p, kind=k, settings=None, gpu_types=(t,), cost=c)
                                  for p, k, t, c in _pools(10)])
                ready = [ctx.Event() for _ in range(n)]
                go, result = ctx.Event(), ctx.Queue()
                procs = [ctx.Process(target=_dispatch_worker, args=(url, 10, args.claims, r, go, result)) for r in ready]
                for p in procs:
                    p.start()
                for r in ready:
                    r.wait(120)
                started = time.perf_counter()
                go.set()
                got = [result.get(timeout=600) for _ in procs]
                took = time.perf_counter() - started
                for p in procs:
                    p.join(60)
                with sessions() as s:
                    claimed = s.scalar(select(func.count()).select_from(Job).where(Job.state == "dispatching"))
                    assert ledger_reading.verify(s) == [], "the ledger must match the claims"
                assert claimed == sum(c for c, _ in got), (claimed, got)  # no job claimed twice
                engine.dispose()
                rate = claimed / took
                out[label].append(rate)
                print(f"dispatch {label}: {claimed} claimed in {took:.2f} s = {rate:.0f}/s, rounds {[r for _, r in got]}",
                      flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--claims", type=int, default=3_000)
    args = ap.parse_args()
    load = os.getloadavg()[0]
    a = api(args)
    d = dispatch(args)
    load_after = os.getloadavg()[0]
    med = {k: statistics.median(v) for k, v in {**{f"api {k}": v for k, v in a.items()},
                                                 **{f"dispatch {k}": v for k, v in d.items()}}.items()}
    api_ratio, dispatch_ratio = med["api three"] / med["api one"], med["dispatch two"] / med["dispatch one"]
    runs = lambda v: ", ".join(f"{x:.0f}" for x in v)  # noqa: E731
    body = "\n".join([
        "## Throughput with replicas (issue #47)",
        "",
        (f"`python bench/bench_replicas.py --seconds {args.seconds:g} --repeats {args.repeats} --jobs {args.jobs} "
         f"--claims {args.claims}` ({machine()}; Postgres; load average {load:.1f} before, {load_after:.1f} after). "
         "Each configuration measured in turns with the other (one, many, many, one), medians of the runs. "
         "API: `isthmus serve` processes of one uvicorn worker without a dispatcher, 32 closed-loop `hey` "
         "clients in all, one user and account (every submission takes the same cap rows). Dispatch: real "
         "`Dispatcher` processes over 10 in-process stand-in pools (adapters/standin.py: fixed capacity, "
         f"submission left out), {args.jobs:,} pending jobs of 50 accounts, until {args.claims:,} are claimed; "
         "no job claimed twice and `verify()` empty after every run."),
        "",
        "| | one | many | many / one | goal | runs (one; many) |",
        "|---|---|---|---|---|---|",
        (f"| API submissions/s, 1 vs 3 replicas | {med['api one']:.0f} | {med['api three']:.0f} | "
         f"**{api_ratio:.2f}** | >= 0.9: {'met' if api_ratio >= 0.9 else 'not met'} | {runs(a['one'])}; {runs(a['three'])} |"),
        (f"| jobs claimed/s, 1 vs 2 dispatchers | {med['dispatch one']:.0f} | {med['dispatch two']:.0f} | "
         f"**{dispatch_ratio:.2f}** | >= 0.9: {'met' if dispatch_ratio >= 0.9 else 'not met'} | "
         f"{runs(d['one'])}; {runs(d['two'])} |"),
    ])
    write_section("replicas", body)
    print(body)


if __name__ == "__main__":
    main()
