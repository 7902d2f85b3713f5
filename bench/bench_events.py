"""1,000 concurrent server-sent event streams on one gateway process.

Usage: python bench/bench_events.py [--streams 1000] [--rounds 10] [--no-write]

One gateway process (``isthmus serve --dev``, one uvicorn worker, SQLite, no pools) and
one client process on the same machine. The client opens ``--streams`` streams of
``GET /v1/events/stream``, all as alice of team-a, so every event goes to every stream.
Memory per stream: the server's resident set size with every stream open minus before
the first one, divided by the number of streams. Delay: each round submits a job and
cancels it (two state changes); the delay of an event at a stream is its arrival time
minus the moment the request that made it was sent (an upper bound: it includes the
request itself). Writes the section "events" of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.common import BIN, free_port, machine, median, pct, wait_ready, write_section

BODY = {"name": "bench-events", "account": "team-a", "command": ["true"], "workers": 1, "gpus_per_worker": 1}


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


async def reader(host: str, port: int, token: str, connected: asyncio.Event, counter: list[int],
                 target: int, arrivals: dict[str, list[float]]) -> None:
    """One stream over a bare socket: an HTTP client in Python would be the bottleneck, not the gateway."""
    r, w = await asyncio.open_connection(host, port)
    w.write(f"GET /v1/events/stream HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n"
            f"Accept: text/event-stream\r\n\r\n".encode())
    await w.drain()
    status = await r.readline()
    assert b" 200 " in status, status
    buf = b""
    try:
        while True:
            data = await r.read(65536)  # one read per event, not one per line: the client stays cheap
            if not data:
                return
            now = time.monotonic()
            buf += data
            *messages, buf = buf.split(b"\n\n")
            for m in messages:
                if b": connected" in m:
                    counter[0] += 1
                    if counter[0] >= target:
                        connected.set()
                if b'"job_id":"' in m:
                    # the job id and the new state, without parsing the whole event
                    job = m[m.index(b'"job_id":"') + 10:][:36].decode()
                    to = m[m.index(b'"to_state":') + 11:].split(b",", 1)[0].strip(b'"').decode()
                    arrivals.setdefault(f"{job}:{to}", []).append(now)
    finally:
        w.close()


async def run(url: str, token: str, pid: int, streams: int, rounds: int) -> dict:
    headers = {"Authorization": f"Bearer {token}"}
    host, port = url.removeprefix("http://").split(":")
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30) as api:
        # Warm the process (imports, the hub's first poll) with one job before measuring.
        job = (await api.post("/v1/jobs", json=BODY)).json()["id"]
        await api.post(f"/v1/jobs/{job}/cancel")
        await asyncio.sleep(1)
        before = rss_kib(pid)
        connected, counter, arrivals = asyncio.Event(), [0], {}
        t_open = time.monotonic()
        tasks = [asyncio.create_task(reader(host, int(port), token, connected, counter, streams, arrivals))
                 for _ in range(streams)]
        await asyncio.wait_for(connected.wait(), 300)
        open_s = time.monotonic() - t_open
        await asyncio.sleep(2)
        after = rss_kib(pid)
        # One unmeasured change first: the first fan-out to fresh streams is slower (the
        # measured rounds are steady state, as for a gateway whose streams are open).
        job = (await api.post("/v1/jobs", json=BODY)).json()["id"]
        await asyncio.sleep(1.0)
        sent: dict[str, float] = {}
        request_s: list[float] = []
        cpu_before = cpu_s(pid)
        for _ in range(rounds):
            t = time.monotonic()
            job = (await api.post("/v1/jobs", json=BODY)).json()["id"]
            request_s.append(time.monotonic() - t)
            sent[f"{job}:pending"] = t
            await asyncio.sleep(1.0)
            t = time.monotonic()
            await api.post(f"/v1/jobs/{job}/cancel")
            request_s.append(time.monotonic() - t)
            sent[f"{job}:cancelled"] = t
            await asyncio.sleep(1.0)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(len(arrivals.get(k, [])) < streams for k in sent):
            await asyncio.sleep(0.2)
        peak = rss_kib(pid)
        cpu = cpu_s(pid) - cpu_before
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    delays = [arr - sent[k] for k in sent for arr in arrivals.get(k, [])]
    if os.environ.get("BENCH_EVENTS_DEBUG"):
        for k in sent:
            got = sorted(arr - sent[k] for arr in arrivals.get(k, []))
            print(k[-12:], f"first {got[0] * 1000:.0f} ms, last {got[-1] * 1000:.0f} ms", file=sys.stderr)
    missing = sum(streams - len(arrivals.get(k, [])) for k in sent)
    return {"before_kib": before, "after_kib": after, "peak_kib": peak, "open_s": open_s,
            "delays": delays, "missing": missing, "events": len(sent), "request_s": request_s, "cpu_s": cpu,
            "load": Path("/proc/loadavg").read_text().split()[0]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--streams", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("ISTHMUS_")}
        env.update(ISTHMUS_DATABASE_URL=f"sqlite:///{work}/bench.db", ISTHMUS_LOG_LEVEL="warning",
                   ISTHMUS_DEV_KEY_PATH=str(work / "dev-key.pem"), ISTHMUS_MAX_CONNECTIONS=str(a.streams + 100),
                   ISTHMUS_ACCESS_LOG="false")
        proc = subprocess.Popen([str(BIN / "isthmus"), "serve", "--dev", "--port", str(port)], env=env, cwd=work,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_ready(url + "/healthz", proc)
            token = subprocess.run([str(BIN / "isthmus"), "token", "--user", "alice", "--groups", "team-a"],
                                   env={**env, "ISTHMUS_DEV_MODE": "true"}, capture_output=True, text=True,
                                   check=True).stdout.strip()
            res = asyncio.run(run(url, token, proc.pid, a.streams, a.rounds))
        finally:
            proc.terminate()
            proc.wait(20)
    per_stream = (res["after_kib"] - res["before_kib"]) / a.streams
    d = [x * 1000 for x in res["delays"]]
    body = f"""## Live events: {a.streams} concurrent server-sent event streams

`python bench/bench_events.py --streams {a.streams} --rounds {a.rounds}`
({machine()}; one gateway process: `isthmus serve --dev`, one uvicorn worker, SQLite; the
{a.streams} streams are opened by one asyncio client process on the same machine, over bare
sockets; load average {res['load']} at the end; run {datetime.date.today()}). Every stream is alice's (team-a), so each event goes to all of them.
Each round submits a job and cancels it: {res['events']} state changes, {res['events'] * a.streams}
deliveries, after one unmeasured change (the first fan-out to fresh streams is slower).

| | value |
|---|---|
| server memory (RSS) before the streams | {res['before_kib'] / 1024:.1f} MiB |
| with {a.streams} streams open | {res['after_kib'] / 1024:.1f} MiB |
| **memory per stream** | **{per_stream:.1f} KiB** |
| after the events were delivered | {res['peak_kib'] / 1024:.1f} MiB |
| time to open all streams | {res['open_s']:.1f} s |
| delay, request sent -> event at a stream: median | {median(d):.0f} ms |
| delay p99 (target <= 1000 ms) | **{pct(d, 99):.0f} ms** |
| delay max | {max(d):.0f} ms |
| the submit/cancel request itself: median | {median(res['request_s']) * 1000:.0f} ms |
| gateway CPU per state change (its request, the poll, the fan-out to {a.streams} streams) | {res['cpu_s'] / res['events'] * 1000:.0f} ms |
| deliveries missing | {res['missing']} |

The delay includes the request that made the change (its median above), the hub's poll
interval (0.2 s, so 0.1 s on average) and the fan-out: one event written to every stream,
by one process on one core.
"""
    print(body)
    if not a.no_write:
        write_section("events", body)


if __name__ == "__main__":
    main()
