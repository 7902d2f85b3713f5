"""``kill -9`` of the gateway in the middle of a delivery loses nothing (at least once).

A real ``isthmus serve`` process runs the delivery thread; the receiver stalls its answer,
the gateway is killed, and after a restart every event arrives (receivers dedupe by
``webhook-id``, so a repeat is expected and allowed).
"""

from __future__ import annotations

import os
import signal
import time

import httpx
from sqlalchemy import create_engine, select

from gateway.models.webhooks import WebhookDelivery
from tests.e2e.conftest import free_port, start_gateway
from tests.webhooks.conftest import ALLOWLIST, SPEC, verify


def _env(database_url, dev_key_path, pki) -> dict[str, str]:
    return {**os.environ, "ISTHMUS_DATABASE_URL": database_url, "ISTHMUS_DEV_MODE": "true",
            "ISTHMUS_DEV_KEY_PATH": str(dev_key_path), "ISTHMUS_DEV_ACCOUNTS": "team-a,team-b",
            "ISTHMUS_WEBHOOKS_IN_SERVE": "true", "ISTHMUS_WEBHOOK_ALLOWLIST": ALLOWLIST,
            "ISTHMUS_WEBHOOK_CA_FILE": str(pki.ca_file), "ISTHMUS_WEBHOOK_INTERVAL_S": "0.2",
            "ISTHMUS_WEBHOOK_TIMEOUT_S": "8", "ISTHMUS_WEBHOOK_LEASE_S": "10", "ISTHMUS_LOG_LEVEL": "info"}


def _rows(database_url: str) -> list[WebhookDelivery]:
    engine = create_engine(database_url)
    try:
        with engine.connect() as c:
            return list(c.execute(select(WebhookDelivery.msg_id, WebhookDelivery.status, WebhookDelivery.attempts)
                                  .order_by(WebhookDelivery.id)).all())
    finally:
        engine.dispose()


def test_kill_9_mid_delivery_then_restart_delivers_every_event(gw, database_url, dev_key_path, pki, receiver,
                                                               tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = _env(database_url, dev_key_path, pki)
    h = gw.headers()
    proc = start_gateway(env, port, tmp_path / "gateway-1.log")
    try:
        ep = httpx.post(f"{url}/v1/accounts/team-a/webhooks", json={"url": receiver.url}, headers=h).json()
        receiver.mode = "stall"
        job = httpx.post(f"{url}/v1/jobs", json=SPEC, headers=h).json()["id"]
        assert httpx.post(f"{url}/v1/jobs/{job}/cancel", headers=h).status_code == 202
        # One attempt in flight per endpoint: the first event is sent and not answered, the
        # second waits for it.
        receiver.wait_for(lambda r: len(r) >= 1, timeout=30)
        time.sleep(0.5)
        assert len(receiver.received) == 1
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    # The receiver saw the first, but the gateway died before hearing back: still pending.
    rows = _rows(database_url)
    assert [(r.status, r.attempts) for r in rows] == [("pending", 1), ("pending", 0)]
    stalled = {x.msg_id for x in receiver.received}
    receiver.mode = "ok"
    receiver.release.set()

    started = time.monotonic()
    proc = start_gateway(env, port, tmp_path / "gateway-2.log")
    try:
        # Due again when the dead gateway's lease (10 s) runs out.
        got = receiver.wait_for(lambda r: len(r) >= 3, timeout=60)
        assert time.monotonic() - started < 60
        answered = {x.msg_id for x in got[1:]}
        assert stalled < answered and len(answered) == 2
        assert all(verify(ep["secret"], x.headers, x.body) for x in got)
        events = httpx.get(f"{url}/v1/jobs/{job}/events", headers=h).json()["items"]
        assert {f"msg_{e['id']}" for e in events if e["kind"] == "state"} == answered
        # Receivers dedupe on webhook-id: the repeats carry the same id and the same body.
        by_id: dict[str, set[bytes]] = {}
        for x in got:
            by_id.setdefault(x.msg_id, set()).add(x.body)
        assert all(len(bodies) == 1 for bodies in by_id.values())
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            items = httpx.get(f"{url}/v1/accounts/team-a/webhooks/{ep['id']}/deliveries", headers=h).json()["items"]
            if all(d["status"] == "delivered" for d in items):
                break
            time.sleep(0.2)
        assert [(d["status"], d["attempts"]) for d in items] == [("delivered", 1), ("delivered", 2)]
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except Exception:  # noqa: BLE001
            proc.kill()
