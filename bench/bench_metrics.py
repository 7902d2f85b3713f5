"""The cost of metrics on the submission path: submissions/s with and without /metrics scrapes.

Usage: python bench/bench_metrics.py [--seconds 15] [--concurrency 32] [--repeats 3]

There is no switch that turns metrics off: nothing is counted on the submission path (the
metrics are computed from the registry at scrape time, docs/operations.md), so their whole
cost is the scrapes. One gateway (uvicorn, 2 workers, Postgres, dev issuer) takes the same
closed-loop submit load (`hey`, as bench/bench_api.py) under three conditions, in one run,
interleaved and rotated each repeat so drift (the job table grows) hits all three alike:
  - no scraper (the reference);
  - a scraper polling GET /metrics every 15 s (Prometheus's default scrape_interval);
  - a scraper every 1 s (stress: more often than the 5 s metrics cache, ISTHMUS_METRICS_TTL_S).
The scraper starts at a random phase in the first interval. Every run starts from the same
empty registry (the job tables truncated before it): with the registry growing across runs,
submissions/s fell by a third within one benchmark (148 -> 95/s), far more than the conditions
differ, and a run's position decided its figure. The ratio of a condition is the median over the
repeats of its run divided by the reference run of the same repeat. Writes docs/benchmarks.md
(section "metrics").
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import threading
import time

import httpx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.bench_api import hey
from bench.common import (
    BIN,
    REPO,
    free_port,
    fresh_database,
    machine,
    median,
    wait_ready,
    write_section,
)


class Scraper(threading.Thread):
    def __init__(self, url: str, interval_s: float):
        super().__init__(daemon=True)
        self.url, self.interval_s = url, interval_s
        self.stop = threading.Event()
        self.durations: list[float] = []
        self.errors = 0

    def run(self) -> None:
        with httpx.Client(timeout=30) as client:
            if self.stop.wait(random.uniform(0, self.interval_s)):
                return
            while not self.stop.is_set():
                t0 = time.perf_counter()
                try:
                    r = client.get(self.url)
                    if r.status_code != 200 or b"isthmus_jobs" not in r.content:
                        self.errors += 1
                except httpx.HTTPError:
                    self.errors += 1
                self.durations.append((time.perf_counter() - t0) * 1e3)
                self.stop.wait(self.interval_s)


def start(cmd: list[str], env: dict, port: int, log: str) -> subprocess.Popen:
    with open(log, "w") as out:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
    try:
        wait_ready(f"http://127.0.0.1:{port}/healthz", proc, timeout_s=300)  # a loaded 2-core machine
    except Exception:
        proc.terminate()
        proc.wait(30)
        raise
    return proc


# What submissions write (and what the metrics count): emptied before every run, so each run
# starts from the same registry. Accounts, quotas and pools stay.
_REGISTRY_TABLES = ("job", "job_event", "idempotency_key", "job_set", "job_dependency", "webhook_delivery")


def reset_registry(url: str) -> None:
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {', '.join(_REGISTRY_TABLES)} CASCADE"))
    engine.dispose()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=15)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2, help="uvicorn worker processes")
    ap.add_argument("--metrics-ttl", type=float, default=5.0, help="the gateway's ISTHMUS_METRICS_TTL_S")
    args = ap.parse_args()
    conditions = [("none", 0.0), ("15 s", 15.0), ("1 s", 1.0)]
    results: dict[str, dict[str, list[float]]] = {name: {} for name, _ in conditions}

    with fresh_database(migrated=True) as url_db:
        key = f"/tmp/isthmus-bench-metrics-{os.getpid()}-dev.pem"
        env = {**os.environ, "ISTHMUS_DATABASE_URL": url_db, "ISTHMUS_DEV_MODE": "true", "ISTHMUS_DEV_KEY_PATH": key,
               "ISTHMUS_LOG_LEVEL": "warning", "ISTHMUS_METRICS_TTL_S": f"{args.metrics_ttl:g}", "ISTHMUS_ACCESS_LOG": "false",
               "ISTHMUS_MAX_PENDING_JOBS_PER_USER": "10000000", "ISTHMUS_MAX_PENDING_JOBS_PER_ACCOUNT": "10000000"}
        token = subprocess.run([str(BIN / "isthmus"), "token", "--user", "alice", "--groups", "team-a",
                                "--lifetime", "7200"], env=env, check=True, capture_output=True, text=True,
                               cwd=REPO).stdout.strip()
        port = free_port()
        gw = start([str(BIN / "isthmus"), "serve", "--dev", "--port", str(port), "--workers", str(args.workers),
                    "--no-migrate"], env, port, f"/tmp/isthmus-bench-metrics-{os.getpid()}.log")
        base = f"http://127.0.0.1:{port}"
        try:
            hey(base, token, seconds=2, concurrency=8)  # warm-up
            assert httpx.get(f"{base}/metrics", timeout=30).status_code == 200
            for rep in range(args.repeats):
                order = conditions[rep % 3:] + conditions[:rep % 3]
                for name, interval in order:
                    reset_registry(url_db)
                    time.sleep(args.metrics_ttl)  # no run sees the cached metrics of the one before
                    scraper = Scraper(f"{base}/metrics", interval) if interval else None
                    if scraper:
                        scraper.start()
                    run = hey(base, token, seconds=args.seconds, concurrency=args.concurrency)
                    if scraper:
                        scraper.stop.set()
                        scraper.join(35)
                    r = results[name]
                    r.setdefault("jobs", []).append(run["rps"] * args.seconds)
                    for k, v in (("rps", run["rps"]), ("p50", run["p50"]), ("p99", run["p99"]),
                                 ("errors", run["errors"] + (scraper.errors if scraper else 0)),
                                 ("scrapes", len(scraper.durations) if scraper else 0),
                                 ("scrape_ms", median(scraper.durations) if scraper and scraper.durations else 0.0)):
                        r.setdefault(k, []).append(v)
                    print(f"scrape {name:5} {run['rps']:7.1f} req/s p50 {run['p50']:6.1f} ms p99 {run['p99']:6.1f} ms"
                          f" | scrapes {r['scrapes'][-1]}, median {r['scrape_ms'][-1]:.1f} ms | errors {r['errors'][-1]}",
                          flush=True)
            with httpx.Client() as c:
                jobs = sum(float(line.split()[-1]) for line in c.get(f"{base}/metrics", timeout=30).text.splitlines()
                           if line.startswith("isthmus_job_submissions_total{"))
                assert jobs > 0, "the last run's submissions must show in /metrics"
        finally:
            gw.terminate()
            gw.wait(10)
            if os.path.exists(key):
                os.unlink(key)

    m = {name: {k: median(v) for k, v in results[name].items()} for name, _ in conditions}
    # Each condition against the reference run of its own repeat, then the median over repeats.
    ratio = {name: median([a / b for a, b in zip(results[name]["rps"], results["none"]["rps"], strict=True)])
             for name, _ in conditions}
    per_repeat = {name: ", ".join(f"{a / b:.2f}" for a, b in zip(results[name]["rps"], results["none"]["rps"], strict=True))
                  for name, _ in conditions}

    def row(name: str) -> str:
        v = m[name]
        label = "no scraper (reference)" if name == "none" else f"GET /metrics every {name}"
        scrapes = "" if name == "none" else f"{v['scrapes']:.0f}, {v['scrape_ms']:.0f} ms"
        return (f"| {label} | {v['rps']:.0f} | {ratio[name]:.2f} | {'' if name == 'none' else per_repeat[name]} | "
                f"{v['p50']:.1f} / {v['p99']:.1f} | {scrapes} | {v['errors']:.0f} |")

    rows = "\n".join(row(name) for name, _ in conditions)
    worst = min(ratio[name] for name, _ in conditions if name != "none")
    prom = ratio["15 s"]
    body = f"""## Cost of metrics on the submission path (`bench/bench_metrics.py`)

`python bench/bench_metrics.py --seconds {args.seconds:g} --concurrency {args.concurrency} --repeats {args.repeats}`
({machine()}; one gateway, uvicorn with {args.workers} workers, Postgres; `hey` closed loop with
{args.concurrency} clients on the same machine; the three conditions interleaved in one run, order rotated
each repeat; every run starts from an empty registry and submits ~{median(results['none']['jobs']):.0f} jobs;
medians of {args.repeats}; run {time.strftime('%Y-%m-%d')}; host load average at the end
{os.getloadavg()[0]:.1f}). Nothing is counted on the
submission path (metrics are computed from the registry at scrape time), so there is no switch to
turn off: the cost of metrics is the cost of being scraped while submissions run.

| condition | submissions/s | ratio to no scraper (median of repeats) | ratio in each repeat | latency p50 / p99 (ms) | scrapes per run, median scrape time | errors |
|---|---|---|---|---|---|---|
{rows}

Target: ratio >= 0.95 at Prometheus's default interval (15 s): {prom:.2f}, {'met' if prom >= 0.95 else 'NOT met'}.
Worst ratio (1 s scrapes, more often than the 5 s cache): {worst:.2f}.
"""
    print(body)
    write_section("metrics", body)


if __name__ == "__main__":
    main()
