"""Submission throughput and latency of POST /v1/jobs against Postgres, vs a bare endpoint.

Usage: python bench/bench_api.py [--seconds 10] [--concurrency 32] [--rate 100] [--repeats 3]
Starts, on loopback: the gateway (uvicorn, Postgres, dev issuer) and a bare FastAPI app
with the same server settings; drives both with the same asyncio/httpx load generator.
Prints and writes the figures to docs/benchmarks.md (section "api").
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
import uuid

import httpx
from sqlalchemy import create_engine, text

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.common import BIN, REPO, free_port, machine, median, pct, wait_ready, write_section  # noqa: E402

PG = os.environ.get("ISTHMUS_BENCH_POSTGRES_URL", "postgresql+psycopg://isthmus:isthmus@127.0.0.1:5432/isthmus")
SPEC = {"name": "bench", "account": "team-a", "command": ["python", "train.py"], "workers": 2,
        "gpus_per_worker": 8, "memory_per_worker": "64Gi", "time_limit": "1h"}


async def closed_loop(url: str, headers: dict, seconds: float, concurrency: int) -> tuple[float, list[float], int]:
    lat: list[float] = []
    errors = 0
    stop = time.perf_counter() + seconds
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits, timeout=30) as client:
        async def worker():
            nonlocal errors
            while time.perf_counter() < stop:
                t = time.perf_counter()
                r = await client.post("/v1/jobs", json=SPEC, headers={"Idempotency-Key": uuid.uuid4().hex})
                lat.append(time.perf_counter() - t)
                if r.status_code != 202:
                    errors += 1
        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - t0
    return len(lat) / elapsed, lat, errors


async def open_loop(url: str, headers: dict, seconds: float, rate: float) -> tuple[list[float], int, float]:
    """Fixed arrival rate: latency is measured from the scheduled send time."""
    lat: list[float] = []
    errors = 0
    n = int(seconds * rate)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30,
                                 limits=httpx.Limits(max_connections=200)) as client:
        start = time.perf_counter()

        async def one(i: int):
            nonlocal errors
            scheduled = start + i / rate
            await asyncio.sleep(max(0, scheduled - time.perf_counter()))
            r = await client.post("/v1/jobs", json=SPEC, headers={"Idempotency-Key": uuid.uuid4().hex})
            lat.append(time.perf_counter() - scheduled)
            if r.status_code != 202:
                errors += 1
        await asyncio.gather(*(one(i) for i in range(n)))
        achieved = n / (time.perf_counter() - start)
    return lat, errors, achieved


def start(cmd: list[str], env: dict, port: int) -> subprocess.Popen:
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO)
    wait_ready(f"http://127.0.0.1:{port}/healthz", proc)
    return proc


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--rate", type=float, default=100)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2, help="uvicorn worker processes for both servers")
    args = ap.parse_args()

    db = f"isthmus_bench_{uuid.uuid4().hex[:6]}"
    admin = create_engine(PG, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{db}"'))
    url_db = PG.rsplit("/", 1)[0] + "/" + db
    key = f"/tmp/{db}-dev.pem"
    env = {**os.environ, "ISTHMUS_DATABASE_URL": url_db, "ISTHMUS_DEV_MODE": "true", "ISTHMUS_DEV_KEY_PATH": key,
           "ISTHMUS_LOG_LEVEL": "warning"}
    subprocess.run([str(BIN / "isthmus"), "migrate"], env=env, check=True, capture_output=True, cwd=REPO)
    token = subprocess.run([str(BIN / "isthmus"), "token", "--user", "alice", "--groups", "team-a", "--lifetime", "7200"],
                           env=env, check=True, capture_output=True, text=True).stdout.strip()
    headers = {"Authorization": f"Bearer {token}"}
    gport, bport = free_port(), free_port()
    gw = start([str(BIN / "isthmus"), "serve", "--dev", "--port", str(gport), "--workers", str(args.workers)], env, gport)
    bare = start([str(BIN / "uvicorn"), "bench.bare_app:app", "--port", str(bport), "--workers", str(args.workers),
                  "--log-level", "warning", "--no-access-log"], env, bport)
    results: dict[str, dict[str, list[float]]] = {"gateway": {}, "bare": {}}
    try:
        for name, port in (("gateway", gport), ("bare", bport)):  # warm-up
            asyncio.run(closed_loop(f"http://127.0.0.1:{port}", headers, 2, 8))
        for _ in range(args.repeats):
            for name, port in (("gateway", gport), ("bare", bport)):
                url = f"http://127.0.0.1:{port}"
                rps, lat, err = asyncio.run(closed_loop(url, headers, args.seconds, args.concurrency))
                olat, oerr, achieved = asyncio.run(open_loop(url, headers, args.seconds, args.rate))
                r = results[name]
                for k, v in (("rps", rps), ("p50", pct(lat, 50) * 1e3), ("p99", pct(lat, 99) * 1e3),
                             ("open_p50", pct(olat, 50) * 1e3), ("open_p99", pct(olat, 99) * 1e3),
                             ("errors", err + oerr), ("achieved", achieved)):
                    r.setdefault(k, []).append(v)
                print(f"{name:8} closed {rps:7.1f} req/s p50 {pct(lat,50)*1e3:6.1f} ms p99 {pct(lat,99)*1e3:6.1f} ms | "
                      f"open {args.rate:.0f}/s p50 {pct(olat,50)*1e3:6.1f} ms p99 {pct(olat,99)*1e3:6.1f} ms | errors {err+oerr}",
                      flush=True)
    finally:
        for p in (gw, bare):
            p.terminate()
            p.wait(10)
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)'))
        admin.dispose()

    g, b = ({k: median(v) for k, v in results[n].items()} for n in ("gateway", "bare"))
    body = f"""## Submission API (`POST /v1/jobs`, Postgres)

`python bench/bench_api.py --seconds {args.seconds:g} --concurrency {args.concurrency} --rate {args.rate:g} --repeats {args.repeats}`
({machine()}; uvicorn with {args.workers} workers for both servers; load generator on the same machine;
medians of {args.repeats} repeats; run {time.strftime('%Y-%m-%d')}). Each gateway request validates a
dev-issuer RS256 token, validates the spec, writes the job, its first event and an
idempotency key in one Postgres transaction.

| | gateway | bare FastAPI (no DB, no auth) | gateway / bare |
|---|---|---|---|
| closed loop, {args.concurrency} clients: requests/s | {g['rps']:.0f} | {b['rps']:.0f} | {g['rps']/b['rps']:.2f} |
| closed loop: latency p50 / p99 (ms) | {g['p50']:.1f} / {g['p99']:.1f} | {b['p50']:.1f} / {b['p99']:.1f} | |
| open loop at {args.rate:g} req/s: latency p50 / p99 (ms) | {g['open_p50']:.1f} / {g['open_p99']:.1f} | {b['open_p50']:.1f} / {b['open_p99']:.1f} | |
| errors (non-202) | {g['errors']:.0f} | {b['errors']:.0f} | |

Targets: >= 300 submissions/s sustained ({'met' if g['rps'] >= 300 else 'NOT met'}); p99 <= 50 ms at 100/s ({'met' if g['open_p99'] <= 50 else 'NOT met'}).
"""
    print(body)
    write_section("api", body)


if __name__ == "__main__":
    main()
