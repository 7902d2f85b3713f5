"""One slow or dead receiver delays no one else (issue #27, findings 1 and 2).

Real HTTPS receivers (a trickling one, never-answering ones, a healthy one of another
account), the in-process gateway, and webhook workers running their real loop in threads.
"""

from __future__ import annotations

import collections
import time

import pytest

from tests.webhooks.conftest import Receiver


def _poll(fetch, predicate, timeout: float):
    deadline = time.monotonic() + timeout
    while True:
        value = fetch()
        if predicate(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not met in {timeout} s: {value}")
        time.sleep(0.1)


@pytest.fixture
def workers(hooks):
    started = []

    def start(n: int = 1, **overrides):
        for _ in range(n):
            w = hooks.worker(webhook_interval_s=0.2, **overrides)
            w.start()
            started.append(w)

    yield start
    for w in started:
        w.stop()


def test_a_trickling_receiver_is_cut_at_the_deadline_and_delays_no_other_account(hooks, receiver, pki, workers):
    trickler = Receiver(pki)
    try:
        trickler.mode, trickler.trickle_s = "trickle", 1.0  # a byte a second: no single read times out
        slow = hooks.register(trickler.url + "/slow")
        hooks.register(receiver.url, account="team-b", user="bob")
        workers(webhook_timeout_s=3)
        hooks.submit_and_cancel()  # team-a's events go to the trickler
        trickler.wait_for(lambda r: len(r) >= 1, timeout=5)
        sent_at = time.time()
        hooks.submit_and_cancel(account="team-b", user="bob")
        got = receiver.wait_for(lambda r: len(r) >= 2, timeout=6)
        assert max(g.at for g in got) - sent_at < 3, "the healthy receiver waited for the slow one"
        # The trickler's attempt is cut at its 3 s deadline and recorded as failed right away.
        started = trickler.received[0].at
        tried = _poll(lambda: [d for d in hooks.deliveries(slow["id"]) if d["last_error"]], bool, timeout=6)
        assert time.time() - started < 3 + 2.5
        assert tried[0]["status"] == "pending" and tried[0]["last_error"].startswith("timed out")
        assert "within 3 s" in tried[0]["last_error"]
        _poll(lambda: trickler.cut, bool, timeout=4)  # the receiver saw the connection closed
        assert trickler.cut[0] - started < 3 + 3
    finally:
        trickler.close()


def test_never_answering_endpoints_of_one_account_do_not_delay_another(hooks, receiver, pki, workers):
    dead = Receiver(pki)
    try:
        dead.mode = "stall"
        for i in range(10):
            hooks.register(f"{dead.url}/{i}")
        # The 11th is refused, naming the limit, and nothing is written.
        gw = hooks.gw
        r = gw.client.post("/v1/accounts/team-a/webhooks", json={"url": f"{dead.url}/10"}, headers=gw.headers())
        assert r.status_code == 429, r.text
        assert r.headers["content-type"].startswith("application/problem+json")
        assert "ISTHMUS_WEBHOOK_MAX_ENDPOINTS_PER_ACCOUNT = 10" in r.json()["detail"]
        assert len(gw.client.get("/v1/accounts/team-a/webhooks", headers=gw.headers()).json()["items"]) == 10
        hooks.register(receiver.url, account="team-b", user="bob")
        workers(2, webhook_timeout_s=8)  # two workers: at most one attempt per endpoint across both
        hooks.submit_and_cancel()  # 2 events x 10 endpoints that never answer
        dead.wait_for(lambda r: len(r) >= 4, timeout=5)
        sent_at = time.time()
        hooks.submit_and_cancel(account="team-b", user="bob")
        got = receiver.wait_for(lambda r: len(r) >= 2, timeout=6)
        assert max(g.at for g in got) - sent_at < 3, "another account's dead endpoints delayed this one"
        # Still within the 8 s deadline: each dead endpoint got at most one request.
        per_endpoint = collections.Counter(g.path for g in dead.received)
        assert per_endpoint and max(per_endpoint.values()) == 1, per_endpoint
        # ...and team-a held at most 4 slots in each worker.
        assert len(dead.received) <= 8
    finally:
        dead.close()
