"""Arrays: accepting a 10,000-task array in one request vs the same number of single submissions,
and dispatching 1,000 1-GPU array tasks vs 1,000 single jobs.

Usage: python bench/bench_arrays.py [--part all|accept|dispatch] [--tasks 10000] [--repeats 3]
       [--concurrency 32] [--workers 2] [--dispatch-jobs 1000]
Starts the gateway (uvicorn, Postgres, dev issuer) on loopback against a fresh database,
with the submit caps lifted. Each repeat: one POST /v1/job-sets with `array.count = N`
(timed end to end, and the tasks counted in the database afterwards), then N single
POST /v1/jobs from the compiled load generator `hey` (closed loop, `--concurrency`).
Prints and writes the medians and their ratio to docs/benchmarks.md (section "arrays").

Dispatch (section "arrays-dispatch"): in process, on a fresh Postgres database per
measurement, N 1-GPU jobs are submitted through the API (one array request, or N single
requests), then the gateway's own dispatcher runs rounds until every one was claimed
(fair-share pick, ledger reservation, routing) and submitted to a pool and recorded
`queued`. The pool is a recording stand-in (:class:`RecordingPool`) that accepts every
submission at once: the figure is the gateway's per-job dispatch cost, the same for both
kinds of job, not a cluster's (bench/bench_dispatch.py e2e measures the real pools).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import uuid

import httpx
from sqlalchemy import create_engine, text

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.common import (
    BIN,
    REPO,
    free_port,
    machine,
    median,
    stack_postgres_url,
    wait_ready,
    write_section,
)

HEY = subprocess.run(["bash", str(REPO / "bench/tools.sh")], capture_output=True, text=True,
                     check=True).stdout.strip()
PG = stack_postgres_url()
SPEC = {"name": "bench", "account": "team-a", "command": ["python", "train.py", "--shard", "{{ index }}"],
        "gpus_per_worker": 1, "time_limit": "1h"}
SINGLE = {**SPEC, "command": ["python", "train.py", "--shard", "0"]}


def start(cmd, env, port):
    proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_ready(f"http://127.0.0.1:{port}/healthz", proc)
    return proc


def singles(url: str, token: str, n: int, concurrency: int) -> float:
    """N single submissions through hey; returns accepted jobs per second."""
    out = subprocess.run([HEY, "-n", str(n), "-c", str(concurrency), "-m", "POST", "-T", "application/json",
                          "-H", f"Authorization: Bearer {token}", "-d", json.dumps(SINGLE), url + "/v1/jobs"],
                         capture_output=True, text=True, check=True).stdout
    total = float(re.search(r"Total:\s+([\d.]+) secs", out).group(1))
    codes = {int(c): int(k) for c, k in re.findall(r"\[(\d{3})\]\s+(\d+) responses", out)}
    if codes.get(202, 0) < 0.95 * n:
        raise RuntimeError(f"single submissions: {codes}\n{out}")
    return codes[202] / total  # accepted jobs per second (a few client-side errors under load are not counted)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--part", choices=("all", "accept", "dispatch"), default="all")
    ap.add_argument("--tasks", type=int, default=10000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--workers", type=int, default=2, help="uvicorn worker processes")
    ap.add_argument("--dispatch-jobs", type=int, default=1000)
    args = ap.parse_args()
    if args.part in ("all", "accept"):
        accept(args)
    if args.part in ("all", "dispatch"):
        dispatch(args)


def accept(args) -> None:
    load_before = os.getloadavg()[0]
    db = f"isthmus_bench_{uuid.uuid4().hex[:6]}"
    admin = create_engine(PG, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{db}"'))
    url_db = PG.rsplit("/", 1)[0] + "/" + db
    key = f"/tmp/{db}-dev.pem"
    env = {**os.environ, "ISTHMUS_DATABASE_URL": url_db, "ISTHMUS_DEV_MODE": "true", "ISTHMUS_DEV_KEY_PATH": key,
           "ISTHMUS_LOG_LEVEL": "warning", "ISTHMUS_MAX_ARRAY_TASKS": str(args.tasks),
           # One user submits every job and none starts: lift the submit caps (docs/jobs.md).
           "ISTHMUS_MAX_PENDING_JOBS_PER_USER": "10000000", "ISTHMUS_MAX_PENDING_JOBS_PER_ACCOUNT": "10000000"}
    subprocess.run([str(BIN / "isthmus"), "migrate"], env=env, check=True, capture_output=True, cwd=REPO)
    token = subprocess.run([str(BIN / "isthmus"), "token", "--user", "alice", "--groups", "team-a", "--lifetime",
                            "7200"], env=env, check=True, capture_output=True, text=True).stdout.strip()
    port = free_port()
    gw = start([str(BIN / "isthmus"), "serve", "--dev", "--port", str(port), "--workers", str(args.workers)], env, port)
    url = f"http://127.0.0.1:{port}"
    engine = create_engine(url_db)
    array_s: list[float] = []
    single_rate: list[float] = []
    try:
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=300) as client:
            client.post("/v1/job-sets", json={**SPEC, "array": {"count": 10}}).raise_for_status()  # warm-up
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                r = client.post("/v1/job-sets", json={**SPEC, "array": {"count": args.tasks}})
                array_s.append(time.perf_counter() - t0)
                r.raise_for_status()
                with engine.connect() as c:
                    n = c.execute(text("SELECT count(*) FROM job WHERE job_set_id = :s"), {"s": r.json()["id"]}).scalar()
                    events = c.execute(text("SELECT count(*) FROM job_event e JOIN job j ON j.id = e.job_id "
                                            "WHERE j.job_set_id = :s"), {"s": r.json()["id"]}).scalar()
                assert n == args.tasks and events == args.tasks, (n, events)
                single_rate.append(singles(url, token, args.tasks, args.concurrency))
    finally:
        gw.terminate()
        gw.wait(timeout=30)
        engine.dispose()
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)'))
        admin.dispose()
        if os.path.exists(key):
            os.remove(key)

    load = os.getloadavg()[0]
    array_rate = [args.tasks / s for s in array_s]
    a, s_ = median(array_rate), median(single_rate)
    body = f"""## Arrays: {args.tasks:,} tasks in one request vs {args.tasks:,} single submissions (issue #16)

`python bench/bench_arrays.py --tasks {args.tasks} --repeats {args.repeats}` ({machine()}; uvicorn with
{args.workers} workers, Postgres of the test stack, the load generator on the same machine). One
`POST /v1/job-sets` with `array.count = {args.tasks}` records every task as a job with its first
event in one transaction: two COPY statements, the set's spec stored once on the set and each
task's row only its own values, the rows' shared columns formatted once (gateway/flows/service.py); the reference is the same number of `POST /v1/jobs` from
`hey` with {args.concurrency} connections, in the same run against the same server. Medians of
{args.repeats} repeats.

| | median | repeats |
|---|---|---|
| one array request, {args.tasks:,} tasks | {median(array_s) * 1000:.0f} ms per request = **{a:,.0f} tasks/s** | {", ".join(f"{x:,.0f}" for x in array_rate)} tasks/s |
| {args.tasks:,} single submissions | {args.tasks / s_:.1f} s = **{s_:,.0f} jobs/s** | {", ".join(f"{x:,.0f}" for x in single_rate)} jobs/s |
| ratio (array / singles) | **{a / s_:.1f}x** | |

Load average (1 min) before the run: {load_before:.1f}, when it ended: {load:.1f}, on {os.cpu_count()} cores
(the load generator and the server add their own; other work may share the machine: compare the ratio,
measured under the same load, more than the absolute rates).

Target: ≥ 5,000 tasks/s accepted (10x Slurm's published sustained 500 jobs/s): {"met" if a >= 5000 else "NOT met"}.
"""
    print(body)
    write_section("arrays", body)


class RecordingPool:
    """A stand-in pool that accepts every submission at once and remembers it (no cluster)."""

    def __new__(cls, name: str = "kubernetes"):
        from adapters.base import (
            Backend,
            BackendState,
            Capacity,
            JobStatus,
            PoolCapacity,
            SubmitResult,
        )

        class _Pool(Backend):
            def __init__(self) -> None:
                self.submitted: dict[str, str] = {}

            def submit(self, request):
                backend_id = self.submitted.setdefault(request.gateway_job_id, f"rec-{len(self.submitted)}")
                return SubmitResult(backend_job_id=backend_id)

            def status(self, backend_job_id):
                return JobStatus(backend_job_id=backend_job_id, gateway_job_id=None, state=BackendState.QUEUED)

            def cancel(self, backend_job_id):
                pass

            def capacity(self):
                return Capacity(backend=name, pools=(PoolCapacity(
                    pool="bench", total_nodes=10_000, idle_nodes=10_000, total_gpus=80_000, free_gpus=80_000,
                    gpus_per_node=8, memory_mib_per_node=1 << 20, cpus_per_node=128),))

            def find_by_gateway_id(self, gateway_job_id, *, request=None):
                return None

        _Pool.name = name
        return _Pool()


def dispatch_once(kind: str, n: int) -> float:
    """Submit n 1-GPU jobs as one array or n singles, then dispatch them all; returns jobs/s dispatched."""
    from fastapi.testclient import TestClient
    from sqlalchemy import func, select

    from bench.common import fresh_database
    from gateway.app import create_app
    from gateway.dispatch.dispatcher import Dispatcher
    from gateway.identity.setup import build_dev_issuer
    from gateway.kit.settings import Settings
    from gateway.models.jobs import Job

    with fresh_database(migrated=True) as url_db:
        key = f"/tmp/isthmus-bench-dispatch-{uuid.uuid4().hex[:6]}.pem"
        settings = Settings(database_url=url_db, dev_mode=True, dev_key_path=key, dev_accounts="team-a",
                            log_level="warning", max_array_tasks=max(n, 10), max_pending_jobs_per_user=10_000_000,
                            max_pending_jobs_per_account=10_000_000)
        app = create_app(settings)
        try:
            with TestClient(app) as client:
                h = {"Authorization": "Bearer " + build_dev_issuer(settings).mint(user="alice", groups=["team-a"])}
                body = {**SINGLE, "gpus_per_worker": 1}
                if kind == "array":
                    client.post("/v1/job-sets", json={**body, "array": {"count": n}}, headers=h).raise_for_status()
                else:
                    for _ in range(n):
                        client.post("/v1/jobs", json=body, headers=h).raise_for_status()
                pool = RecordingPool()
                disp = Dispatcher(sessions=app.state.sessionmaker, backends={pool.name: pool}, settings=settings.dispatch)

                def left() -> int:
                    with app.state.sessionmaker() as s:
                        return s.scalar(select(func.count()).select_from(Job).where(Job.state != "queued"))

                assert left() == n
                t0 = time.perf_counter()
                rounds = 0
                while True:
                    rounds += 1
                    if not disp.dispatch_round() and left() == 0:
                        break
                    if rounds > 10 * n:
                        raise RuntimeError(f"{left()} jobs never dispatched")
                elapsed = time.perf_counter() - t0
                assert len(pool.submitted) == n, len(pool.submitted)
        finally:
            if os.path.exists(key):
                os.remove(key)
    return n / elapsed


def dispatch(args) -> None:
    load_before = os.getloadavg()[0]
    n = args.dispatch_jobs
    arrays: list[float] = []
    singles_: list[float] = []
    for r in range(args.repeats):
        for kind in (("array", "single") if r % 2 == 0 else ("single", "array")):  # alternate the order
            rate = dispatch_once(kind, n)
            (arrays if kind == "array" else singles_).append(rate)
            print(kind, f"{rate:.0f} jobs/s", flush=True)
    a, s_ = median(arrays), median(singles_)
    load = os.getloadavg()[0]
    body = f"""## Arrays: dispatching {n:,} 1-GPU array tasks vs {n:,} single jobs (issue #16)

`python bench/bench_arrays.py --part dispatch --dispatch-jobs {n} --repeats {args.repeats}` ({machine()};
Postgres of the test stack; in process). Each measurement starts from a fresh database: {n:,} 1-GPU jobs are
submitted through the API (one `POST /v1/job-sets` with `array.count = {n}`, or {n:,} `POST /v1/jobs`), then
the gateway's dispatcher (`dispatch_round`, default batch and concurrency) runs until every job was claimed
(fair-share pick, ledger reservation, routing, `dispatching`) and submitted, and recorded `queued`. The pool
is a **recording stand-in** that accepts every submission at once (no cluster): the figure is the gateway's
own per-job dispatch cost; `bench/bench_dispatch.py e2e` measures the real pools. Medians of {args.repeats}
repeats, the order of the two kinds alternating.

| | median | repeats |
|---|---|---|
| {n:,} array tasks | **{a:,.0f} jobs/s** | {", ".join(f"{x:,.0f}" for x in arrays)} |
| {n:,} single jobs | **{s_:,.0f} jobs/s** | {", ".join(f"{x:,.0f}" for x in singles_)} |
| ratio (array tasks / singles) | **{a / s_:.2f}** | |

Load average (1 min) before the run: {load_before:.1f}, when it ended: {load:.1f}, on {os.cpu_count()} cores.
Both kinds run the same claim and submission code (a task is an ordinary job row); the spread between
repeats is larger than the difference between the kinds, so read a ratio near 1 as "the same cost".

Target: ratio ≥ 1 (an array task costs the dispatcher no more than a single job): {"met" if a / s_ >= 1 else "NOT met"}.
"""
    print(body)
    write_section("arrays-dispatch", body)


if __name__ == "__main__":
    main()
