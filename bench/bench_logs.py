"""Log streaming throughput: GET /v1/jobs/{id}/logs against reading the file directly.

Usage: python bench/bench_logs.py [--mib 256] [--repeats 5] [--no-write]

One gateway process (``isthmus serve --dev``, one uvicorn worker, SQLite) with a Slurm pool
whose ``output_dir`` is a temporary directory: the pool is never contacted (dispatch is
off), the gateway only reads files there, the same way as for a real job. A job row routed
to that pool and finished is made in the database, and its worker 0 output is a file of
``--mib`` MiB of 100-byte lines. Each repeat reads the whole output twice, alternating:
through the API (``curl`` on the same machine, output to /dev/null; httpx in Python
reads at about half curl's rate, so it would measure the client) and straight from the file in 64 KiB reads (the reference, in the client process).
The server's peak resident set size shows that streaming does not hold the file in memory.
Writes the section "logs" of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.common import BIN, free_port, machine, median, wait_ready, write_section

BODY = {"name": "bench-logs", "account": "team-a", "command": ["true"], "workers": 1, "gpus_per_worker": 1}


def peak_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise RuntimeError("no VmHWM")


def read_direct(path: Path) -> int:
    n = 0
    with open(path, "rb") as f:
        while chunk := f.read(64 * 1024):
            n += len(chunk)
    return n


def read_api(client: httpx.Client, job: str) -> int:
    """The whole output through the API, read by curl (a Python client would be the bottleneck)."""
    out = subprocess.run(["curl", "-sS", "--fail", "-o", "/dev/null", "-w", "%{size_download}",
                          "-H", f"Authorization: {client.headers['Authorization']}",
                          f"{client.base_url}/v1/jobs/{job}/logs?worker=0"],
                         capture_output=True, text=True, check=True)
    return int(out.stdout)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        out_dir = work / "output"
        out_dir.mkdir()
        port = free_port()
        pool = {"slurm": {"transport": "cli", "partition": "gpu", "work_dir": "/shared/isthmus",
                          "output_dir": str(out_dir)}}
        env = {k: v for k, v in os.environ.items() if not k.startswith("ISTHMUS_")}
        db = f"sqlite:///{work}/bench.db"
        env.update(ISTHMUS_DATABASE_URL=db, ISTHMUS_LOG_LEVEL="warning", ISTHMUS_ACCESS_LOG="false",
                   ISTHMUS_DEV_KEY_PATH=str(work / "dev-key.pem"), ISTHMUS_BACKENDS=json.dumps(pool),
                   ISTHMUS_DISPATCH_IN_SERVE="false")
        proc = subprocess.Popen([str(BIN / "isthmus"), "serve", "--dev", "--port", str(port)], env=env, cwd=work,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        url = f"http://127.0.0.1:{port}"
        try:
            try:
                wait_ready(url + "/healthz", proc)
            except RuntimeError:
                sys.exit(proc.stderr.read() if proc.poll() is not None else "gateway not ready")
            token = subprocess.run([str(BIN / "isthmus"), "token", "--user", "alice", "--groups", "team-a"],
                                   env={**env, "ISTHMUS_DEV_MODE": "true"}, capture_output=True, text=True,
                                   check=True).stdout.strip()
            client = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"},
                                  timeout=httpx.Timeout(60))
            job = client.post("/v1/jobs", json=BODY).json()["id"]
            from sqlalchemy import create_engine, text
            engine = create_engine(db)
            with engine.begin() as conn:  # finished on the pool, as if it had run there
                conn.execute(text("UPDATE job SET pool='slurm', state='succeeded' WHERE id=:id"), {"id": job})
            engine.dispose()
            path = out_dir / f"isthmus-{job}-worker-0.out"
            line = b"x" * 99 + b"\n"
            with open(path, "wb") as f:
                block = line * (1024 * 1024 // 100)
                while f.tell() < a.mib * 1024 * 1024:
                    f.write(block)
            size = path.stat().st_size
            read_api(client, job), read_direct(path)  # warm the page cache and the process
            rss_before = peak_rss_kib(proc.pid)
            api_s, direct_s = [], []
            for _ in range(a.repeats):
                t = time.perf_counter()
                assert read_api(client, job) == size
                api_s.append(time.perf_counter() - t)
                t = time.perf_counter()
                assert read_direct(path) == size
                direct_s.append(time.perf_counter() - t)
            rss_peak = peak_rss_kib(proc.pid)
            client.close()
        finally:
            proc.terminate()
            proc.wait(20)
    mib = size / 1024 / 1024
    api_rate, direct_rate = mib / median(api_s), mib / median(direct_s)
    body = f"""## Job output: streaming through the API against reading the file

`python bench/bench_logs.py --mib {a.mib} --repeats {a.repeats}`
({machine()}; one gateway process, one uvicorn worker (h11); the client is `curl` on the same
machine; the file is in the page cache; medians of {a.repeats} repeats; run {datetime.date.today()}).
One worker's output of {mib:.0f} MiB (100-byte lines), read whole.

| | MiB/s | time (s) | ratio |
|---|---|---|---|
| read the file directly (64 KiB reads in Python, reference) | {direct_rate:.0f} | {median(direct_s):.3f} | 1 |
| `GET /v1/jobs/{{id}}/logs` (streamed) | {api_rate:.0f} | {median(api_s):.3f} | {api_rate / direct_rate:.3f} |

Gateway peak resident set size: {rss_before / 1024:.0f} MiB after a warm-up read,
{rss_peak / 1024:.0f} MiB after {a.repeats} more reads of the {mib:.0f} MiB file: a stream holds
one 1 MiB chunk at a time, not the file. The API's cost is the pure-Python HTTP/1.1 server
(h11 chunked encoding), the event loop and one worker-thread hop per 1 MiB read.
"""
    print(body)
    if not a.no_write:
        write_section("logs", body)


if __name__ == "__main__":
    main()
