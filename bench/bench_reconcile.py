"""How long a change made on the backend takes to reach the registry: watch vs polling.

Usage: python bench/bench_reconcile.py [--jobs 12]
Writes the section "reconcile-delay" of docs/benchmarks.md.

For each mode a gateway runs its real control loop (1 s poll interval) against the local
Kubernetes control plane: "watch" as configured (the feed plus a 60 s resync), "poll" with
the feed turned off. Jobs are started, then cancelled one by one on the cluster itself
(``KubernetesBackend.cancel``, as an operator would); the delay is from that call's return
to the registry showing ``cancelled``, read every 10 ms from the database.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from pathlib import Path

from sqlalchemy import create_engine, select, text

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.common import REPO, machine, median, pct, stack_postgres_url, write_section

PG = stack_postgres_url()


def wait(predicate, timeout_s: float, what: str, every_s: float = 0.2):
    deadline = time.monotonic() + timeout_s
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out: {what}")
        time.sleep(every_s)
    return value


def run_mode(mode: str, url: str, backends: dict, jobs: int) -> list[float]:
    from fastapi.testclient import TestClient

    from gateway.app import create_app
    from gateway.identity.setup import build_dev_issuer
    from gateway.kit.settings import Settings
    from gateway.models.jobs import Job

    settings = Settings(database_url=url, dev_mode=True, dev_key_path=Path(f"/tmp/{uuid.uuid4().hex}.pem"),
                        dev_accounts="team-a", backends=json.dumps(backends), dispatch_in_serve=False,
                        pool_queue_depth=100, capacity_ttl_s=0)
    app = create_app(settings)
    token = build_dev_issuer(settings).mint(user="alice", groups=["team-a"], lifetime_s=7200)
    h = {"Authorization": f"Bearer {token}"}
    delays: list[float] = []
    with TestClient(app) as client:
        disp, backend = app.state.dispatcher, app.state.backends["kubernetes"]
        if mode == "poll":
            disp.watched = []
        disp.start()
        try:
            if mode == "watch":
                wait(lambda: disp.watch_live("kubernetes"), 300, "feed caught up")
            ids = []
            for i in range(jobs):
                r = client.post("/v1/jobs", headers=h, json={
                    "name": f"bench-{mode}-{i}", "account": "team-a", "backend": "kubernetes", "workers": 1,
                    "gpus_per_worker": 1, "command": ["sleep", "600"], "image": "registry.example/x:1",
                    "time_limit": "10m"})
                assert r.status_code == 202, r.text
                ids.append(r.json()["id"])

            def states():
                with app.state.sessionmaker() as s:
                    return dict(s.execute(select(Job.id, Job.state).where(Job.id.in_(ids))).all())
            wait(lambda: all(v == "running" for v in states().values()), 120, "all running")
            time.sleep(2)
            for job_id in ids:
                with app.state.sessionmaker() as s:
                    backend_job_id = s.get(Job, job_id).backend_job_id
                backend.cancel(backend_job_id)
                t0 = time.monotonic()
                wait(lambda job_id=job_id: states()[job_id] == "cancelled", 30, "cancel seen", every_s=0.01)
                delays.append(time.monotonic() - t0)
                time.sleep(0.3)  # let the rounds fall at random points of the interval
        finally:
            disp.stop()
    return delays


def main() -> None:
    from adapters.envfile import read_env_file as read_env
    from gateway.cli import run_migrations

    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=12)
    args = ap.parse_args()
    kube = read_env(REPO / ".stack" / "kube" / "env")
    backends = {"kubernetes": {"kubeconfig": kube["KUBECONFIG"], "cluster_queue": kube["ISTHMUS_KUBE_CLUSTER_QUEUE"],
                               "local_queue": kube["ISTHMUS_KUBE_LOCAL_QUEUE"]}}
    results = {}
    admin = create_engine(PG, isolation_level="AUTOCOMMIT")
    for mode in ("watch", "poll"):
        db = f"isthmus_bench_{uuid.uuid4().hex[:6]}"
        with admin.connect() as c:
            c.execute(text(f'CREATE DATABASE "{db}"'))
        url = PG.rsplit("/", 1)[0] + "/" + db
        try:
            run_migrations(url)
            results[mode] = run_mode(mode, url, backends, args.jobs)
        finally:
            with admin.connect() as c:
                c.execute(text(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)'))
        print(mode, [round(d * 1000) for d in results[mode]], flush=True)
    rows = "\n".join(f"| {m} | {len(d)} | {median(d) * 1000:.0f} | {pct(d, 90) * 1000:.0f} | {max(d) * 1000:.0f} |"
                     for m, d in results.items())
    write_section("reconcile-delay", f"""`python bench/bench_reconcile.py --jobs {args.jobs}`
({machine()}; Postgres; Kubernetes + Kueue with kwok nodes; {time.strftime('%Y-%m-%d')}).
A Job cancelled on the cluster itself, until the registry shows `cancelled`; poll interval 1 s.

| mode | changes | median (ms) | p90 (ms) | max (ms) |
|---|---|---|---|---|
{rows}""")


if __name__ == "__main__":
    main()
