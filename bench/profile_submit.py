"""Where a submission's time goes (issue #46): ``POST /v1/jobs`` profiled in one process.

Usage: python bench/profile_submit.py [--jobs 20000] [--pending 1000] [--requests 600] [--concurrency 32]
       [--top 25]

One gateway in this process on a fresh database of the benchmark Postgres grown as
bench/bench_submit_growth.py grows it, driven through httpx's ASGI transport with
``concurrency`` submissions in flight (so that the group commit batches them as under load),
without an Idempotency-Key, as the benchmark's load generator sends them. Prints the submissions per second as served, then profiles
``requests`` more with cProfile in this thread's CPU time (the thread pool's work inline) and
sums the functions' own time by where their code lives, as bench/profile_reads.py does; then
the statements per submission. Prints only.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.bench_api import SPEC
from bench.bench_submit_growth import UI_SECRET, dev_tokens, grow
from bench.common import fresh_database
from bench.profile_reads import inline_thread_pool, report


async def submit_all(app, headers: dict, n: int, concurrency: int, profile: bool) -> dict:
    import httpx
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    sql: dict[str, int] = {}

    def count(_conn, _cursor, statement, *_a):
        key = " ".join(statement.split())[:110]
        sql[key] = sql.get(key, 0) + 1

    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://bench") as client:
        async def one() -> None:
            r = await client.post("/v1/jobs", json=SPEC, headers=headers)
            if r.status_code not in (200, 202):
                raise SystemExit(f"submit: {r.status_code} {r.text[:200]}")

        async def burst(count_: int) -> None:
            for start in range(0, count_, concurrency):
                await asyncio.gather(*(one() for _ in range(min(concurrency, count_ - start))))

        await burst(4 * concurrency)  # warm-up
        prof = cProfile.Profile(time.thread_time) if profile else None
        if profile:
            event.listen(Engine, "before_cursor_execute", count)
            prof.enable()
        started = time.perf_counter()
        await burst(n)
        took = time.perf_counter() - started
        if profile:
            prof.disable()
            event.remove(Engine, "before_cursor_execute", count)
    return {"ms": took / n * 1e3, "bytes": 0, "profile": prof, "sql": sql}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--pending", type=int, default=1_000)
    ap.add_argument("--requests", type=int, default=600)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    key = f"/tmp/bench-profile-submit-{os.getpid()}.pem"
    with fresh_database(migrated=True) as url:
        os.environ.update({"ISTHMUS_DATABASE_URL": url, "ISTHMUS_DEV_MODE": "true", "ISTHMUS_DEV_KEY_PATH": key,
                           "ISTHMUS_LOG_LEVEL": "warning", "ISTHMUS_UI_SESSION_SECRET": UI_SECRET,
                           "ISTHMUS_DISPATCH_IN_SERVE": "false", "ISTHMUS_MAX_PENDING_JOBS_PER_USER": "10000000",
                           "ISTHMUS_MAX_PENDING_JOBS_PER_ACCOUNT": "10000000"})
        from fastapi.testclient import TestClient

        from gateway.app import create_app
        from gateway.kit.settings import Settings

        user, _adm = dev_tokens(dict(os.environ))
        headers = {"Authorization": f"Bearer {user}"}
        with TestClient(create_app(Settings())) as tc:
            first = tc.post("/v1/jobs", json=SPEC, headers=headers)
            first.raise_for_status()
        grow(url, first.json()["id"], history=max(0, args.jobs - args.pending - 1), pending=args.pending)
        served = asyncio.run(submit_all(create_app(Settings()), headers, args.requests, args.concurrency, False))
        print(f"served: {1e3 / served['ms']:.0f} submissions/s ({args.concurrency} in flight, one process)")
        inline_thread_pool()
        profiled = asyncio.run(submit_all(create_app(Settings()), headers, args.requests, args.concurrency, True))
        report("POST /v1/jobs", {**profiled, "ms": served["ms"]}, args.requests, args.top)


if __name__ == "__main__":
    main()
