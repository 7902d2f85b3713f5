"""A worker's liveness verdict (gateway/dispatch/health.py): 200 while every loop began a pass
within the bound, 503 naming the loop that did not."""

from __future__ import annotations

import httpx

from gateway.dispatch.health import Beats, serve, verdict


def test_every_loop_recent_is_ok():
    beats = Beats("dispatch", "reconcile")
    status, body = verdict(beats, stale_s=60)
    assert status == 200 and body["status"] == "ok" and "stuck" not in body


def test_a_loop_without_a_pass_is_named(monkeypatch):
    beats = Beats("dispatch", "reconcile")
    beats._at["reconcile"] -= 500  # its last pass began 500 s ago
    status, body = verdict(beats, stale_s=120)
    assert status == 503 and body["stuck"] == ["reconcile"], body
    beats.beat("reconcile")
    assert verdict(beats, stale_s=120)[0] == 200


def test_served_on_its_port():
    beats = Beats("dispatch")
    server = serve(beats, host="127.0.0.1", port=0, stale_s=120)
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        assert httpx.get(f"{url}/healthz").json()["status"] == "ok"
        beats._at["dispatch"] -= 500
        r = httpx.get(f"{url}/healthz")
        assert r.status_code == 503 and r.json()["stuck"] == ["dispatch"]
        assert httpx.get(f"{url}/").status_code == 404
    finally:
        server.shutdown()
        server.server_close()
