"""GET /v1/events/stream: live job events as server-sent events, on SQLite and Postgres."""

from __future__ import annotations

import json
import queue
import threading
import time

import httpx
import pytest

from tests.jobs.live import served

BODY = {"name": "sse", "account": "team-a", "command": ["true"], "workers": 1, "gpus_per_worker": 1}


class Reader:
    """Reads one SSE stream in a thread; events land in ``self.events`` as (id, data)."""

    def __init__(self, url: str, headers: dict, last_event_id: str | None = None):
        self.events: queue.Queue = queue.Queue()
        self.comments = 0
        self.status: int | None = None
        self._stop = threading.Event()
        headers = dict(headers)
        if last_event_id is not None:
            headers["Last-Event-ID"] = last_event_id
        self._thread = threading.Thread(target=self._run, args=(url, headers), daemon=True)
        self.connected = threading.Event()
        self._thread.start()
        assert self.connected.wait(20), "stream did not open"

    def _run(self, url, headers):
        try:
            self._read(url, headers)
        except httpx.HTTPError:
            pass  # the server went away at the end of the test

    def _read(self, url, headers):
        with httpx.Client(timeout=httpx.Timeout(30, read=30)) as c, \
                c.stream("GET", url + "/v1/events/stream", headers=headers) as r:
            self.status = r.status_code
            self.content_type = r.headers.get("content-type", "")
            event: dict = {}
            for line in r.iter_lines():
                if line.startswith(": "):
                    self.comments += 1
                    self.connected.set()
                elif line.startswith("id: "):
                    event["id"] = line[4:]
                elif line.startswith("data: "):
                    event["data"] = json.loads(line[6:])
                elif line == "" and event:
                    self.events.put((event["id"], event["data"]))
                    event = {}
                if self._stop.is_set():
                    return

    def take(self, n: int, timeout_s: float = 10) -> list[tuple[str, dict]]:
        out = []
        deadline = time.monotonic() + timeout_s
        while len(out) < n:
            out.append(self.events.get(timeout=max(0.01, deadline - time.monotonic())))
        return out

    def close(self):
        self._stop.set()


@pytest.fixture
def live(gw):
    gw.app.state.settings.events_heartbeat_s = 0.5
    with served(gw.app) as url:
        yield url


def test_stream_sends_a_jobs_state_changes_in_order_and_only_to_its_account(gw, live):
    mine = Reader(live, gw.headers("alice", ("team-a",)))
    other = Reader(live, gw.headers("mallory", ("team-b",)))
    assert mine.status == 200 and mine.content_type.startswith("text/event-stream")
    job = gw.client.post("/v1/jobs", json=BODY, headers=gw.headers()).json()["id"]
    gw.client.post(f"/v1/jobs/{job}/cancel", headers=gw.headers())
    got = mine.take(2)
    assert [(d["job_id"], d["from_state"], d["to_state"]) for _, d in got] == [
        (job, None, "pending"), (job, "pending", "cancelled")]
    assert [int(i) for i, _ in got] == sorted(int(i) for i, _ in got)
    assert all(d["account"] == "team-a" for _, d in got)
    time.sleep(1.0)
    assert other.events.empty(), "another account's stream saw team-a's job"
    assert other.comments >= 1  # heartbeats keep it alive
    mine.close(), other.close()


def test_reconnecting_with_last_event_id_loses_and_repeats_nothing(gw, live):
    first = Reader(live, gw.headers())
    a = gw.client.post("/v1/jobs", json=BODY, headers=gw.headers()).json()["id"]
    (seen_id, seen), = first.take(1)
    assert seen["job_id"] == a and seen["to_state"] == "pending"
    first.close()
    # While nobody listens: a's cancel and a second job.
    gw.client.post(f"/v1/jobs/{a}/cancel", headers=gw.headers())
    b = gw.client.post("/v1/jobs", json=BODY, headers=gw.headers()).json()["id"]
    again = Reader(live, gw.headers(), last_event_id=seen_id)
    got = again.take(2)
    assert [(d["job_id"], d["to_state"]) for _, d in got] == [(a, "cancelled"), (b, "pending")]
    gw.client.post(f"/v1/jobs/{b}/cancel", headers=gw.headers())
    (_, live_event), = again.take(1)
    assert (live_event["job_id"], live_event["to_state"]) == (b, "cancelled")
    time.sleep(0.8)
    assert again.events.empty(), "an event was sent twice"
    again.close()


def test_a_bad_last_event_id_is_refused_naming_the_header(gw):
    r = gw.client.get("/v1/events/stream", headers={**gw.headers(), "Last-Event-ID": "abc"})
    assert r.status_code == 422
    assert r.json()["errors"][0]["field"] == "header.Last-Event-ID"


def test_the_stream_needs_a_token(gw):
    assert gw.client.get("/v1/events/stream").status_code == 401


def test_a_slow_stream_catches_up_from_the_database_without_loss(gw):
    """A stream whose queue overflows drops it and replays from the table: bounded memory, no loss."""
    import asyncio

    from gateway.identity.principal import Principal
    from gateway.jobs.events import EventHub

    ids = [gw.client.post("/v1/jobs", json=BODY, headers=gw.headers()).json()["id"] for _ in range(2)]

    async def scenario():
        hub = EventHub(gw.app.state.sessionmaker, poll_s=0.05, queue_events=2, heartbeat_s=5)
        principal = Principal(subject="t", username="alice", accounts=frozenset({"team-a"}))
        stream = hub.events(principal, after_id=0)
        assert await stream.__anext__() is None  # subscribed
        first = await stream.__anext__()  # replaying
        for _ in range(6):  # more events than the queue holds arrive while the reader sleeps
            gw.client.post("/v1/jobs", json=BODY, headers=gw.headers())
        await hub.poll_once()
        got = [first]
        while len(got) < 8:
            got.append(await asyncio.wait_for(stream.__anext__(), 5))
        await stream.aclose()
        await hub.stop()
        return got

    got = asyncio.run(scenario())
    assert [e.id for e in got] == sorted({e.id for e in got}), "lost order or duplicated"
    assert json.loads(got[0].data)["job_id"] == ids[0]


def test_cli_job_watch_prints_each_change_as_it_happens_and_ends_with_the_job(gw, live):
    import os
    import subprocess
    import sys
    from pathlib import Path

    job = gw.client.post("/v1/jobs", json=BODY, headers=gw.headers()).json()["id"]
    env = {**os.environ, "ISTHMUS_URL": live, "ISTHMUS_TOKEN": gw.token("alice", ("team-a",))}
    proc = subprocess.Popen([str(Path(sys.executable).with_name("isthmus")), "job", job, "--watch"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stdout.readline()
        assert "- -> pending" in first, first
        time.sleep(1.0)  # the watcher is on the live stream now
        gw.client.post(f"/v1/jobs/{job}/cancel", headers=gw.headers())
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert "pending -> cancelled" in out, out
    assert proc.returncode == 1 and f"job {job} cancelled" in err, err


# ------------------------------------------- one caller cannot take every connection (#27, 4)


class OpenStream:
    """One GET /v1/events/stream held open on its own connection (after ': connected'), or its refusal."""

    def __init__(self, base: str, token: str):
        self.client = httpx.Client(timeout=httpx.Timeout(10, read=10))
        self._cm = self.client.stream("GET", base + "/v1/events/stream", headers={"Authorization": f"Bearer {token}"})
        self.response = self._cm.__enter__()
        self.status = self.response.status_code
        self.problem: dict | None = None
        if self.status == 200:
            self.lines = self.response.iter_lines()  # kept: closing it would close the stream
            while not next(self.lines).startswith(": connected"):
                pass
        else:
            self.problem = json.loads(self.response.read())
            self.close()

    def close(self) -> None:
        self._cm.__exit__(None, None, None)
        self.client.close()


def test_one_caller_cannot_take_every_connection_and_health_stays_reachable(tmp_path, dev_key_path):
    """A real `isthmus serve` with 20 connections: 10 streams per caller, 15 in all, the rest stay free."""
    import os
    import subprocess

    from gateway.identity.setup import build_dev_issuer
    from gateway.kit.settings import Settings
    from tests.e2e.conftest import free_port, start_gateway

    with pytest.raises(ValueError, match="max_streams must be below max_connections"):
        Settings(max_connections=20, max_streams=20)  # streams must never take every connection
    assert Settings(max_connections=20).stream_budget == 15
    issuer = build_dev_issuer(Settings(dev_key_path=dev_key_path))

    def token(user: str) -> str:
        return issuer.mint(user=user, groups=["team-a"])

    port = free_port()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("ISTHMUS_")},
           "ISTHMUS_DATABASE_URL": f"sqlite:///{tmp_path}/gw.db", "ISTHMUS_DEV_MODE": "true",
           "ISTHMUS_DEV_KEY_PATH": str(dev_key_path), "ISTHMUS_DEV_ACCOUNTS": "team-a",
           "ISTHMUS_MAX_CONNECTIONS": "20", "ISTHMUS_EVENTS_HEARTBEAT_S": "1", "ISTHMUS_ACCESS_LOG": "false"}
    proc = start_gateway(env, port, tmp_path / "gateway.log")
    base = f"http://127.0.0.1:{port}"
    held: list[OpenStream] = []
    try:
        alice = [OpenStream(base, token("alice")) for _ in range(10)]
        held += alice
        assert [s.status for s in alice] == [200] * 10
        eleventh = OpenStream(base, token("alice"))
        held.append(eleventh)
        assert eleventh.status == 429, eleventh.problem
        assert eleventh.response.headers["content-type"] == "application/problem+json"
        assert "ISTHMUS_MAX_STREAMS_PER_SUBJECT=10" in eleventh.problem["detail"]
        # Another user's stream, health and the API still work.
        bob = OpenStream(base, token("bob"))
        held.append(bob)
        assert bob.status == 200
        assert httpx.get(base + "/healthz", timeout=10).status_code == 200
        assert httpx.get(base + "/v1/jobs", headers={"Authorization": f"Bearer {token('alice')}"},
                         timeout=10).status_code == 200
        # Many callers together fill the process's stream budget (3/4 of 20), never the connections.
        others = [OpenStream(base, token(f"user{i}")) for i in range(5)]
        held += others
        assert [s.status for s in others] == [200] * 4 + [503], [s.status for s in others]
        assert "ISTHMUS_MAX_STREAMS=15" in others[-1].problem["detail"]
        assert httpx.get(base + "/healthz", timeout=10).status_code == 200
        assert httpx.get(base + "/readyz", timeout=10).status_code == 200
        # A stream that closes frees its place at once.
        alice[0].close()
        held.remove(alice[0])
        deadline = time.monotonic() + 10
        while True:
            again = OpenStream(base, token("alice"))
            if again.status == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        held.append(again)
        assert again.status == 200, again.problem
    finally:
        for s in held:
            if s.status == 200:
                s.close()
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
