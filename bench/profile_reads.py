"""Where a read's time goes (issue #46): the reads of bench/bench_list_growth.py, profiled in one thread.

Usage: python bench/profile_reads.py [--jobs 20000] [--pending 1000] [--requests 300] [--reads "list 50,one job"]
       [--top 12]

One gateway in this process, on a fresh database of the benchmark Postgres grown in SQL as
bench/bench_submit_growth.py documents (``jobs`` jobs, ``pending`` of them waiting), driven
through httpx's ASGI transport on this thread's event loop: no server, no load generator.
For each read it prints the median request time as served (the thread pool as in production),
then profiles ``requests`` more with cProfile, the thread pool's work run inline so that one
profiler sees all of it, timed in this thread's CPU time (what the gateway's process spends;
Postgres's own time and the load of other processes on the host are not in it), and sums the
functions' own time by where their code lives: SQLAlchemy, the driver (psycopg), pydantic,
FastAPI and Starlette, Jinja2, json, the gateway's own code, the rest; then the statements
each request sent. Prints only; docs/benchmarks.md
("Reads as cheap as writes (issue #46)") holds the figures of a run.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import os
import pstats
import re
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.bench_api import SPEC
from bench.bench_list_growth import READS
from bench.bench_submit_growth import UI_SECRET, dev_tokens, grow, ui_cookie
from bench.common import fresh_database

# Where a function's code lives -> the bucket its own time is summed into (first match wins).
BUCKETS = (("psycopg", "driver (psycopg)"), ("sqlalchemy", "SQLAlchemy (ORM, Core, pool)"),
           ("pydantic", "pydantic"), ("fastapi", "FastAPI"), ("starlette", "Starlette"), ("jinja2", "Jinja2"),
           ("markupsafe", "Jinja2"), ("/json/", "json"), ("httpx", "test client (httpx)"),
           ("/gateway/", "gateway"), ("asyncio", "event loop"), ("anyio", "event loop"))


def bucket(filename: str) -> str:
    for needle, name in BUCKETS:
        if needle in filename:
            return name
    if filename.startswith("~") or filename.startswith("<"):
        return "builtins (C calls)"
    return "other"


def inline_thread_pool() -> None:
    """Run what FastAPI and the gateway send to the thread pool on the calling thread."""
    import contextlib

    import fastapi.dependencies.utils as deps
    import fastapi.routing as routing
    import starlette.concurrency as sc

    import gateway.identity.dependency as dependency

    async def run_inline(func, *args, **kwargs):
        return func(*args, **kwargs)

    @contextlib.asynccontextmanager
    async def cm_inline(cm):
        with cm as value:
            yield value

    for mod in (routing, deps, sc, dependency):
        if hasattr(mod, "run_in_threadpool"):
            mod.run_in_threadpool = run_inline
    deps.contextmanager_in_threadpool = cm_inline
    # The reads' own threads (kit/db.py in_read_thread), wherever it was imported by name.
    import gateway.kit.db as db
    import gateway.ui.router as ui_router

    db.in_read_thread = ui_router.in_read_thread = run_inline


async def measure(app, headers: dict, reads: dict, job: str, n: int, top: int, profile: bool) -> dict:
    import httpx
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    out = {}
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://bench") as client:
        for name, (path, who) in reads.items():
            url = path.format(job=job)
            for _ in range(20):  # warm-up: compiled statements, caches
                r = await client.get(url, headers=headers[who], follow_redirects=False)
                if r.status_code != 200:
                    raise SystemExit(f"{name}: {r.status_code} {r.text[:200]}")
            times = []
            for _ in range(n):
                s = time.perf_counter()
                await client.get(url, headers=headers[who], follow_redirects=False)
                times.append(time.perf_counter() - s)
            out[name] = {"ms": statistics.median(times) * 1e3, "bytes": len(r.content)}
            if profile:
                sql: dict[str, int] = {}

                def count(_conn, _cursor, statement, *_a, _sql=sql):
                    key = " ".join(statement.split())[:110]
                    _sql[key] = _sql.get(key, 0) + 1

                event.listen(Engine, "before_cursor_execute", count)
                # Reads sent as compiled text (kit/db.py CompiledRead) pass no engine event.
                from gateway.kit.db import CompiledRead

                plain = CompiledRead.tuples

                def counted(read, session, params, _sql=sql, _plain=plain):
                    if read.sql is not None and not session.in_transaction():
                        key = "(compiled) " + " ".join(read.sql.split())[:99]
                        _sql[key] = _sql.get(key, 0) + 1
                    return _plain(read, session, params)

                CompiledRead.tuples = counted
                prof = cProfile.Profile(time.thread_time)  # CPU time: no Postgres, no other process's load
                prof.enable()
                for _ in range(n):
                    await client.get(url, headers=headers[who], follow_redirects=False)
                prof.disable()
                event.remove(Engine, "before_cursor_execute", count)
                CompiledRead.tuples = plain
                out[name].update(profile=prof, sql=sql)
    return out


def report(name: str, res: dict, n: int, top: int) -> None:
    print(f"\n== {name}: median {res['ms']:.2f} ms per request as served, {res['bytes']:,} bytes")
    prof = res.get("profile")
    if prof is None:
        return
    st = pstats.Stats(prof)
    sums: dict[str, float] = {}
    total = 0.0
    for (filename, _line, _fn), (_cc, _nc, tt, _ct, _callers) in st.stats.items():
        sums[bucket(filename)] = sums.get(bucket(filename), 0.0) + tt
        total += tt
    print(f"profiled (CPU time, thread pool inline, cProfile's own overhead included): {total / n * 1e3:.2f} ms "
          f"per request, {sum(v[1] for v in st.stats.values()) / n:,.0f} function calls")
    for b, t in sorted(sums.items(), key=lambda kv: -kv[1]):
        print(f"  {b:42} {t / n * 1e3:6.2f} ms  {t / total:5.1%}")
    for order, where in (("tottime", ""), ("cumulative", "/gateway/")):
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats(order).print_stats(where, top)
        lines = [ln for ln in buf.getvalue().splitlines() if re.match(r"\s+[\d/]+\s+[\d.]+\s+[\d.]+\s+[\d.]+", ln)]
        print(f"  top by {order}{' (gateway code)' if where else ''}, ms per request (own / cumulative):")
        for ln in lines[:top]:
            parts = ln.split(None, 5)
            print(f"    {float(parts[1]) / n * 1e3:6.2f} {float(parts[3]) / n * 1e3:6.2f}  {_short(parts[5])}")
    for stmt, count in sorted(res.get("sql", {}).items(), key=lambda kv: -kv[1]):
        print(f"  SQL x{count / n:.1f}: {stmt}")


def _short(where: str) -> str:
    return re.sub(r".*site-packages/|.*/work/main/", "", where)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--pending", type=int, default=1_000)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--reads", default="list 50,one job,page: jobs,page: one job,page: accounts,page: admin")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--no-profile", action="store_true")
    args = ap.parse_args()
    reads = {k: v for k, v in READS.items() if k in args.reads.split(",")}
    key = f"/tmp/bench-profile-reads-{os.getpid()}.pem"
    with fresh_database(migrated=True) as url:
        os.environ.update({"ISTHMUS_DATABASE_URL": url, "ISTHMUS_DEV_MODE": "true", "ISTHMUS_DEV_KEY_PATH": key,
                           "ISTHMUS_LOG_LEVEL": "warning", "ISTHMUS_UI_SESSION_SECRET": UI_SECRET})
        from fastapi.testclient import TestClient

        from gateway.app import create_app
        from gateway.kit.settings import Settings

        user, adm = dev_tokens(dict(os.environ))
        with TestClient(create_app(Settings())) as tc:  # one job the API accepted: the growth's template
            first = tc.post("/v1/jobs", json=SPEC, headers={"Authorization": f"Bearer {user}"})
            first.raise_for_status()
            job = first.json()["id"]
        grow(url, job, history=max(0, args.jobs - args.pending - 1), pending=args.pending)
        headers = {"user": {"Authorization": f"Bearer {user}"}, "admin": {"Authorization": f"Bearer {adm}"}}
        for who, (tok, subject) in {"user ui": (user, "alice"), "admin ui": (adm, "root-admin")}.items():
            name, value = ui_cookie(url, tok, subject).split(": ", 1)
            headers[who] = {name: value}
        served = asyncio.run(measure(create_app(Settings()), headers, reads, job, args.requests, args.top, False))
        if not args.no_profile:
            inline_thread_pool()
            profiled = asyncio.run(measure(create_app(Settings()), headers, reads, job, args.requests, args.top, True))
        for name in reads:
            res = {**served[name], **({} if args.no_profile else
                                      {k: profiled[name][k] for k in ("profile", "sql")})}
            report(name, res, args.requests, args.top)
    if os.path.exists(key):
        os.remove(key)


if __name__ == "__main__":
    main()
