"""What one job-set request makes the database hold (issue #27 finding 3).

Usage: python bench/bench_set_storage.py [--tasks 100] [--env-kb 500] [--before-tree DIR]
       [--array-tasks 10000] [--array-rounds 2]

On a fresh, migrated Postgres database of the test stack, an in-process gateway (dev
issuer) takes one ``POST /v1/job-sets``: an array of ``--tasks`` tasks whose spec carries
``--env-kb`` KB of env values (4,000 random letters and digits each; the request is about that
size).
Measured before and after, in the same transaction-free way: ``pg_database_size`` and
``pg_total_relation_size`` (heap, TOAST and indexes) of ``job``, ``job_event`` and
``job_set``. With ``--before-tree DIR`` (an exported older tree, e.g. ``git archive
51fde56 | tar -x -C DIR``) the same measurement runs against that code too, in a
subprocess whose imports come from DIR.

Then the cost side: a ``--array-tasks`` array (as bench/bench_arrays.py sends it) through a
real server (``isthmus serve``, 2 workers, fresh database) with each tree, in alternating
turns (``--array-rounds`` turns of 3 requests each), so both see the same machine load.
Writes docs/benchmarks.md section "set-storage".
"""

from __future__ import annotations

import argparse
import json
import os
import random
import string
import subprocess
import sys
import tempfile
from pathlib import Path

if __name__ == "__main__" and "--measure" not in sys.argv:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TABLES = ("job", "job_event", "job_set")


def sizes(engine) -> dict[str, int]:
    from sqlalchemy import text

    with engine.connect() as c:
        out = {t: c.execute(text("SELECT pg_total_relation_size(CAST(:t AS regclass))"), {"t": t}).scalar()
               for t in TABLES}
        out["database"] = c.execute(text("SELECT pg_database_size(current_database())")).scalar()
    return out


def measure(tasks: int, env_kb: int) -> dict:
    """One set request on a fresh database, with the code on sys.path; sizes before and after."""
    from fastapi.testclient import TestClient
    from sqlalchemy import create_engine, text
    from sqlalchemy.pool import NullPool

    from gateway.app import create_app
    from gateway.identity.setup import build_dev_issuer
    from gateway.kit.settings import Settings
    from stack.databases import server_url, temporary_database

    # Random letters: Postgres compresses what it TOASTs, and a run of one letter would hide the cost.
    rand = random.Random(27)
    env = {f"V{i}": "".join(rand.choices(string.ascii_letters + string.digits, k=4000))
           for i in range(env_kb * 1000 // 4000)}
    body = {"name": "big", "account": "team-a", "command": ["train", "--shard", "{{ index }}"], "env": env,
            "gpus_per_worker": 1, "time_limit": "1h", "array": {"count": tasks}}
    with tempfile.TemporaryDirectory() as tmp, \
            temporary_database(server_url(), prefix="isthmus_bench_storage", migrated=True) as url:
        settings = Settings(database_url=url, dev_mode=True, dev_key_path=Path(tmp) / "k.pem",
                            dev_accounts="team-a", max_pending_jobs_per_user=10_000_000,
                            max_pending_jobs_per_account=10_000_000)
        app = create_app(settings)
        engine = create_engine(url, poolclass=NullPool)
        try:
            with TestClient(app) as client:
                headers = {"Authorization": f"Bearer {build_dev_issuer(settings).mint(user='alice', groups=['team-a'])}"}
                # Warm: the first request's one-off rows (the account's balance, ...) are not the set's.
                client.post("/v1/job-sets", json={**body, "env": {}, "array": {"count": 1}}, headers=headers)
                before = sizes(engine)
                raw = json.dumps(body).encode()
                r = client.post("/v1/job-sets", content=raw, headers={**headers, "Content-Type": "application/json"})
                assert r.status_code == 202, r.text
                after = sizes(engine)
                with engine.connect() as c:
                    n = c.execute(text("SELECT count(*) FROM job WHERE job_set_id = :s"), {"s": r.json()["id"]}).scalar()
                assert n == tasks, n
        finally:
            engine.dispose()
    return {"request_bytes": len(raw), "tasks": tasks, "before": before, "after": after}


ARRAY_SPEC = {"name": "bench", "account": "team-a", "command": ["python", "train.py", "--shard", "{{ index }}"],
              "gpus_per_worker": 1, "time_limit": "1h"}


def array_rates(tree: Path, tasks: int, repeats: int = 3) -> list[float]:
    """Tasks/s of ``repeats`` one-request arrays through a server running the code of ``tree``."""
    import time
    import uuid

    import httpx
    from sqlalchemy import create_engine, text

    from bench.common import free_port, stack_postgres_url, wait_ready

    pg = stack_postgres_url()
    db = f"isthmus_bench_{uuid.uuid4().hex[:6]}"
    admin = create_engine(pg, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{db}"'))
    key = f"/tmp/{db}-dev.pem"
    env = {**os.environ, "PYTHONPATH": str(tree), "ISTHMUS_DATABASE_URL": pg.rsplit("/", 1)[0] + "/" + db,
           "ISTHMUS_DEV_MODE": "true", "ISTHMUS_DEV_KEY_PATH": key, "ISTHMUS_LOG_LEVEL": "warning",
           "ISTHMUS_MAX_ARRAY_TASKS": str(tasks), "ISTHMUS_MAX_PENDING_JOBS_PER_USER": "10000000",
           "ISTHMUS_MAX_PENDING_JOBS_PER_ACCOUNT": "10000000"}
    cli = [sys.executable, "-c", "from gateway.cli import main; main()"]
    rates: list[float] = []
    proc = None
    try:
        subprocess.run(cli + ["migrate"], env=env, check=True, capture_output=True, cwd=tree)
        token = subprocess.run(cli + ["token", "--user", "alice", "--groups", "team-a", "--lifetime", "7200"],
                               env=env, check=True, capture_output=True, text=True, cwd=tree).stdout.strip()
        port = free_port()
        proc = subprocess.Popen(cli + ["serve", "--dev", "--port", str(port), "--workers", "2"], env=env, cwd=tree,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_ready(f"http://127.0.0.1:{port}/healthz", proc)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {token}"},
                          timeout=300) as client:
            client.post("/v1/job-sets", json={**ARRAY_SPEC, "array": {"count": 10}}).raise_for_status()  # warm-up
            for _ in range(repeats):
                t0 = time.perf_counter()
                client.post("/v1/job-sets", json={**ARRAY_SPEC, "array": {"count": tasks}}).raise_for_status()
                rates.append(tasks / (time.perf_counter() - t0))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)'))
        admin.dispose()
        if os.path.exists(key):
            os.remove(key)
    return rates


def growth(m: dict) -> dict[str, int]:
    return {k: m["after"][k] - m["before"][k] for k in m["after"]}


def mb(n: int) -> str:
    return f"{n / 1e6:,.2f} MB"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=100)
    ap.add_argument("--env-kb", type=int, default=500)
    ap.add_argument("--before-tree", type=Path)
    ap.add_argument("--array-tasks", type=int, default=10000)
    ap.add_argument("--array-rounds", type=int, default=2)
    ap.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)  # the subprocess's mode
    args = ap.parse_args()
    if args.measure:
        print(json.dumps(measure(args.tasks, args.env_kb)))
        return
    from bench.common import REPO, machine, median, write_section

    runs = {}
    if args.before_tree:
        # This file, with the older tree's packages first on the path (its own migrations too).
        out = subprocess.run([sys.executable, os.path.abspath(__file__), "--measure",
                              "--tasks", str(args.tasks), "--env-kb", str(args.env_kb)],
                             env={**os.environ, "PYTHONPATH": str(args.before_tree)}, cwd=args.before_tree,
                             capture_output=True, text=True, check=False)
        if out.returncode:
            raise SystemExit(out.stderr)
        runs["before (one spec per task)"] = json.loads(out.stdout.strip().splitlines()[-1])
    runs["after (the set's spec stored once)"] = measure(args.tasks, args.env_kb)
    rows = []
    for label, m in runs.items():
        g = growth(m)
        rows.append(f"| {label} | {mb(m['request_bytes'])} | {mb(g['database'])} | {mb(g['job'])} | "
                    f"{mb(g['job_event'])} | {mb(g['job_set'])} | {g['database'] / m['request_bytes']:,.1f} |")
    last = runs["after (the set's spec stored once)"]
    per_task = (growth(last)["job"] + growth(last)["job_event"]) / args.tasks
    body = f"""## One job-set request: what the database holds (issue #27 finding 3)

`python bench/bench_set_storage.py --tasks {args.tasks} --env-kb {args.env_kb}{' --before-tree DIR' if args.before_tree else ''}`
({machine()}; Postgres of the test stack). A fresh migrated database, an in-process gateway; one
`POST /v1/job-sets` of {args.tasks} array tasks whose spec carries {args.env_kb} KB of env values. Growth of
`pg_database_size` and of `pg_total_relation_size` (heap, TOAST, indexes) per table across that request.
"Before" is the code at the commit before the change (`git archive` of it as DIR).

| code | request | database | `job` | `job_event` | `job_set` | database / request |
|---|---|---|---|---|---|---|
{chr(10).join(rows)}

Before, every task's row held the whole rendered spec (TOAST-compressed, but a spec of
random-looking values does not compress). Now the spec is stored once on `job_set` and a task's
`job.spec` holds only its own values (`{{}}` for an array task, its parameters for a sweep's),
so a request writes at most its own size once plus a fixed cost per task, here about
{per_task:,.0f} bytes of `job` and `job_event` (row, event, indexes; pages are allocated in 8 KB steps,
so small growths are coarse).
"""
    trees = {"after": REPO, **({"before": args.before_tree} if args.before_tree else {})}
    rates: dict[str, list[float]] = {name: [] for name in trees}
    for _ in range(args.array_rounds):
        for name, tree in trees.items():
            rates[name] += array_rates(tree, args.array_tasks)
    load = os.getloadavg()[0]
    body += f"""
The cost side: one `POST /v1/job-sets` of {args.array_tasks:,} array tasks through `isthmus serve` (2 workers, a
fresh database each), each tree in turn, {args.array_rounds} turns of 3 requests (load average at the end:
{load:.1f} on 2 cores, other sessions sharing the machine).

| code | median | requests |
|---|---|---|
""" + "".join(f"| {name} | **{median(xs):,.0f} tasks/s** | {', '.join(f'{x:,.0f}' for x in xs)} |\n"
              for name, xs in reversed(list(rates.items())))
    print(body)
    write_section("set-storage", body)


if __name__ == "__main__":
    main()
