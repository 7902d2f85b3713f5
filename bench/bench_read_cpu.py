"""Server CPU per request of the reads against the bare endpoint (issue #46).

Usage: python bench/bench_read_cpu.py [SECONDS]

On a host whose other load moves every throughput figure (docs/benchmarks.md, "Reads as cheap
as writes"), the CPU time the server's processes spend per request moves far less. This starts
the gateway and the bare app (bench/bare_app.py) as bench/bench_submit_growth.py does, on a
registry of 22,000 jobs grown in SQL the same way, drives each read with `hey` (32 clients,
SECONDS each, once) and prints its requests/s and the CPU seconds of the server's process tree
(/proc) per request, and beside it the CPU per request of the load generator (`hey`, this
process's child) and of the Postgres backends serving the benchmark's database: on 2 cores the
three share the machine, and their sum says how many requests/s the CPU allows at most (2
cores / the sum): where the measured figure is near that, the host's CPU is the limit, and
the client's share shows how much of it the load generator takes (issue #46). First the
gateway's CPU while idle. Prints only.
"""

from __future__ import annotations

import glob
import os
import resource
import sys
import time

import httpx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.bench_api import PG, SPEC, start
from bench.bench_submit_growth import UI_SECRET, dev_tokens, grow, hey, ui_cookie
from bench.common import BIN, free_port, fresh_database

TICK = os.sysconf("SC_CLK_TCK")


def _stat(path: str) -> list[str] | None:
    try:
        with open(path) as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def tree_cpu(root: int) -> float:
    """CPU seconds (user + system) of ``root`` and its descendants."""
    kids: dict[int, list[tuple[int, float]]] = {}
    for path in glob.glob("/proc/[0-9]*/stat"):
        f = _stat(path)
        if f is not None:
            kids.setdefault(int(f[1]), []).append((int(path.split("/")[2]), (int(f[11]) + int(f[12])) / TICK))
    f = _stat(f"/proc/{root}/stat")
    total = (int(f[11]) + int(f[12])) / TICK if f else 0.0
    todo, seen = [root], set()
    while todo:
        for kid, cpu in kids.get(todo.pop(), []):
            if kid not in seen:
                seen.add(kid)
                total += cpu
                todo.append(kid)
    return total


def client_cpu() -> float:
    """CPU seconds of this process's children that have ended (each `hey` run)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def backends_cpu(url_db: str) -> dict[int, float]:
    """CPU seconds of each Postgres backend connected to ``url_db``'s database, by pid (the
    server runs on this host: /proc)."""
    from sqlalchemy import create_engine, text

    eng = create_engine(url_db)
    try:
        with eng.connect() as c:
            pids = [r[0] for r in c.execute(text(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"))]
    finally:
        eng.dispose()
    out = {}
    for pid in pids:
        f = _stat(f"/proc/{pid}/stat")
        if f is not None:
            out[pid] = (int(f[11]) + int(f[12])) / TICK
    return out


def main() -> None:
    secs = float(sys.argv[1]) if len(sys.argv) > 1 else 5
    with fresh_database(PG, migrated=True) as url_db:
        key = f"/tmp/{url_db.rsplit('/', 1)[1]}-dev.pem"
        env = {**os.environ, "ISTHMUS_DATABASE_URL": url_db, "ISTHMUS_DEV_MODE": "true", "ISTHMUS_DEV_KEY_PATH": key,
               "ISTHMUS_LOG_LEVEL": "warning", "ISTHMUS_UI_SESSION_SECRET": UI_SECRET}
        user, adm = dev_tokens(env)
        gport, bport = free_port(), free_port()
        servers = [start([str(BIN / "isthmus"), "serve", "--dev", "--port", str(gport), "--workers", "2"], env, gport),
                   start([str(BIN / "uvicorn"), "bench.bare_app:app", "--workers", "2", "--log-level", "warning",
                          "--no-access-log", "--timeout-keep-alive", "5", "--port", str(bport), "--http", "h11"],
                         env, bport)]
        try:
            g, b = f"http://127.0.0.1:{gport}", f"http://127.0.0.1:{bport}"
            job = httpx.post(g + "/v1/jobs", json=SPEC, headers={"Authorization": f"Bearer {user}"},
                             timeout=30).json()["id"]
            grow(url_db, job, history=20000, pending=2000)
            cookie, adm_cookie = ui_cookie(url_db, user, "alice"), ui_cookie(url_db, adm, "root-admin")
            hey(b + "/v1/jobs", user, seconds=2, concurrency=8, post=True)  # warm-up
            hey(g + "/v1/jobs?limit=50", user, seconds=2, concurrency=8, post=False)
            c0 = tree_cpu(servers[0].pid)
            time.sleep(5)
            print(f"idle gateway CPU {(tree_cpu(servers[0].pid) - c0) / 5 * 1e3:.0f} ms/s", flush=True)
            reads = {"bare": (b + "/v1/jobs", user, True), "list 50": (g + "/v1/jobs?limit=50", user, False),
                     "one job": (f"{g}/v1/jobs/{job}", user, False),
                     "events": (f"{g}/v1/jobs/{job}/events", user, False), "healthz": (g + "/healthz", user, False),
                     "page: jobs": (g + "/ui/", cookie, False), "page: one job": (f"{g}/ui/jobs/{job}", cookie, False),
                     "page: accounts": (g + "/ui/accounts", cookie, False),
                     "page: admin": (g + "/ui/admin", adm_cookie, False), "bare again": (b + "/v1/jobs", user, True)}
            for name, (u, tok, post) in reads.items():
                server = servers[1] if name.startswith("bare") else servers[0]
                c0, h0, p0 = tree_cpu(server.pid), client_cpu(), backends_cpu(url_db)
                r = hey(u, tok, seconds=secs, concurrency=32, post=post)
                n = r["rps"] * secs
                cpu = (tree_cpu(server.pid) - c0) / n * 1e3
                client = (client_cpu() - h0) / n * 1e3
                p1 = backends_cpu(url_db)
                pg = sum(v - p0.get(pid, 0.0) for pid, v in p1.items()) / n * 1e3
                print(f"{name:14} {r['rps']:7.1f} req/s p50 {r['p50']:6.1f} p99 {r['p99']:6.1f} errors {r['errors']}  "
                      f"CPU ms/request: server {cpu:.2f} client {client:.2f} postgres {pg:.2f}; "
                      f"2 cores allow {2e3 / (cpu + client + pg):.0f} req/s", flush=True)
        finally:
            for p in servers:
                p.terminate()
                p.wait(10)
            if os.path.exists(key):
                os.remove(key)


if __name__ == "__main__":
    main()
