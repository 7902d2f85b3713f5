"""Deliveries to a real HTTPS receiver: signed, at least once, retried with backoff, disabled after failures."""

from __future__ import annotations

import collections
import threading
import time
from datetime import UTC, datetime, timedelta

from sqlalchemy import select, update

from gateway.models.webhooks import WebhookDelivery, WebhookEndpoint
from gateway.webhooks.service import backoff_s
from tests.webhooks.conftest import Receiver, make_pki, verify


def _drain(worker, rounds: int = 5) -> None:
    for _ in range(rounds):
        worker.run_once()


def test_a_cancelled_job_reaches_the_receiver_signed(hooks, receiver):
    ep = hooks.register(receiver.url)
    job = hooks.submit_and_cancel()
    _drain(hooks.worker(), 2)
    got = receiver.wait_for(lambda r: len(r) >= 2, timeout=10)
    assert all(verify(ep["secret"], g.headers, g.body) for g in got)
    assert not verify(ep["secret"].replace("whsec_A", "whsec_B") if "whsec_A" in ep["secret"] else
                      "whsec_" + "A" * 44, got[0].headers, got[0].body)
    data = [g.json["data"] for g in got]
    assert [(d["from_state"], d["to_state"]) for d in data] == [(None, "pending"), ("pending", "cancelled")]
    assert {d["job_id"] for d in data} == {job} and {d["account"] for d in data} == {"team-a"}
    assert data[1]["reason"].startswith("cancelled by") and data[1]["at"].endswith("Z")
    assert got[0].json["type"] == "job.state_changed"
    assert got[0].headers["content-type"] == "application/json"
    assert len({g.msg_id for g in got}) == 2
    # The API shows both as delivered, and the endpoint as healthy.
    items = hooks.deliveries(ep["id"])
    assert [(d["status"], d["attempts"], d["last_status_code"]) for d in items] == [("delivered", 1, 204)] * 2
    assert {d["msg_id"] for d in items} == {g.msg_id for g in got}
    status = hooks.endpoint(ep["id"])
    assert status["last_success_at"] and status["consecutive_failures"] == 0 and status["pending_deliveries"] == 0
    # Nothing is sent twice once acknowledged.
    _drain(hooks.worker(), 2)
    assert len(receiver.received) == 2


def test_an_endpoints_burst_reuses_one_connection_and_survives_a_receiver_that_hangs_up(hooks, receiver):
    ep = hooks.register(receiver.url)
    hooks.submit_and_cancel()
    hooks.worker().run_once()
    got = receiver.wait_for(lambda r: len(r) >= 2, timeout=10)
    assert len({g.peer for g in got}) == 1  # one TLS connection for both
    # A receiver that closes idle connections: the next request goes out on a new one.
    receiver.hang_up = True
    hooks.submit_and_cancel()
    hooks.worker().run_once()
    got = receiver.wait_for(lambda r: len(r) >= 4, timeout=10)
    assert len({g.peer for g in got[2:]}) == 2
    items = hooks.deliveries(ep["id"])
    assert [(d["status"], d["attempts"]) for d in items] == [("delivered", 1)] * 4


def test_other_accounts_events_are_not_sent_but_admin_endpoints_get_all(hooks, receiver, pki):
    ep = hooks.register(receiver.url)
    admin_rx = Receiver(pki)
    try:
        r = hooks.gw.client.post("/v1/admin/webhooks", json={"url": admin_rx.url},
                                 headers=hooks.gw.headers("root-admin", (), admin=True))
        assert r.status_code == 201
        job_b = hooks.submit_and_cancel(account="team-b", user="bob")
        job_a = hooks.submit_and_cancel()
        _drain(hooks.worker(), 2)
        admin_got = admin_rx.wait_for(lambda x: len(x) >= 4, timeout=10)
        assert {g.json["data"]["job_id"] for g in admin_got} == {job_a, job_b}
        assert all(verify(r.json()["secret"], g.headers, g.body) for g in admin_got)
        got = receiver.wait_for(lambda x: len(x) >= 2, timeout=10)
        assert {g.json["data"]["job_id"] for g in got} == {job_a}
        assert len(receiver.received) == 2
        assert all(not verify(ep["secret"], g.headers, g.body) for g in admin_got)  # per-endpoint secrets
    finally:
        admin_rx.close()


def test_failures_back_off_then_disable_the_endpoint_and_reenabling_delivers(hooks, receiver):
    ep = hooks.register(receiver.url)
    receiver.mode = "fail"
    hooks.submit_and_cancel()
    worker = hooks.worker(webhook_disable_after_failures=5, webhook_backoff_base_s=60, webhook_backoff_max_s=600)
    worker.run_once()
    # One attempt in flight per endpoint: the first failure backs off the whole endpoint, so
    # the second event is not tried against a receiver that just failed.
    items = hooks.deliveries(ep["id"])
    assert [(d["status"], d["attempts"], d["last_status_code"]) for d in items] == [
        ("pending", 0, None), ("pending", 1, 500)]
    now = datetime.now(UTC)
    wait = (datetime.fromisoformat(items[1]["next_attempt_at"]) - now).total_seconds()
    assert 25 <= wait <= 61, wait  # first retry after base * (0.5..1.0) with jitter
    assert items[1]["last_error"] == "HTTP 500 Internal Server Error"
    status = hooks.endpoint(ep["id"])
    assert status["enabled"] and status["consecutive_failures"] == 1 and status["last_error"].startswith("HTTP 500")
    assert worker.run_once() is False and len(receiver.received) == 1  # backing off: no new attempt
    # Make everything due (as time passing would) until the endpoint is disabled after 5 failures in a row.
    for _ in range(4):
        _make_due(hooks)
        worker.run_once()
    status = hooks.endpoint(ep["id"])
    assert status["enabled"] is False and status["consecutive_failures"] == 5
    assert "5 failed deliveries in a row; last: HTTP 500" in status["disabled_reason"] and status["disabled_at"]
    assert status["pending_deliveries"] == 2
    # The delivery log says so too, on the attempt that disabled it.
    assert any("the endpoint was disabled after 5 failed deliveries in a row" in d["last_error"]
               for d in hooks.deliveries(ep["id"]))
    assert len(receiver.received) == 5
    _make_due(hooks)
    worker.run_once()
    assert len(receiver.received) == 5  # a disabled endpoint gets nothing
    # The owner fixes the receiver and re-enables: what waited goes out now.
    receiver.mode = "ok"
    r = hooks.gw.client.patch(f"/v1/accounts/team-a/webhooks/{ep['id']}", json={"enabled": True},
                              headers=hooks.gw.headers())
    assert r.status_code == 200 and r.json()["enabled"] and r.json()["consecutive_failures"] == 0
    worker.run_once()
    assert [d["status"] for d in hooks.deliveries(ep["id"])] == ["delivered"] * 2
    ok = [g for g in receiver.received if g.status == 204]
    assert len({g.msg_id for g in ok}) == 2


def _make_due(hooks) -> None:
    """What time passing does: every delivery and endpoint backoff runs out."""
    now = datetime.now(UTC)
    with hooks.gw.session() as s, s.begin():
        s.execute(update(WebhookDelivery).values(next_attempt_at=now))
        s.execute(update(WebhookEndpoint).values(blocked_until=None))


def test_backoff_grows_exponentially_with_jitter_up_to_the_cap():
    import random

    rng = random.Random(7)
    for attempt, ceiling in [(1, 5), (2, 10), (3, 20), (6, 160), (20, 3600)]:
        values = [backoff_s(attempt, base_s=5, max_s=3600, rng=rng) for _ in range(200)]
        assert ceiling / 2 <= min(values) and max(values) <= ceiling
        assert max(values) - min(values) > ceiling / 5  # jittered, not all equal


def test_a_receiver_with_an_untrusted_certificate_is_a_tls_failure(hooks, tmp_path):
    other = Receiver(make_pki(tmp_path / "other", "untrusted"))
    try:
        ep = hooks.register(other.url)
        hooks.submit_and_cancel()
        hooks.worker().run_once()
        assert other.received == []
        items = hooks.deliveries(ep["id"])
        tried = [d for d in items if d["attempts"]]  # the first failure backs the endpoint off
        assert tried and all(d["status"] == "pending" and d["last_error"].startswith("TLS error") for d in tried)
    finally:
        other.close()


def test_the_address_is_checked_again_at_delivery(hooks, receiver):
    ep = hooks.register(receiver.url)  # allowed when registered...
    hooks.submit_and_cancel()
    hooks.worker(webhook_allowlist="").run_once()  # ...but no longer when delivering
    assert receiver.received == []
    items = hooks.deliveries(ep["id"])
    tried = [d for d in items if d["attempts"]]
    assert tried and all("refused" in d["last_error"] and "loopback" in d["last_error"] for d in tried)


def test_several_workers_do_not_send_an_event_twice(hooks, receiver):
    hooks.register(receiver.url)
    jobs = [hooks.submit_and_cancel() for _ in range(15)]
    workers = [hooks.worker(webhook_batch=4) for _ in range(3)]
    barrier = threading.Barrier(len(workers))

    def run(w):
        barrier.wait()
        deadline = time.monotonic() + 20
        while len(receiver.received) < 30 and time.monotonic() < deadline:
            w.run_once()

    threads = [threading.Thread(target=run, args=(w,)) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    got = receiver.wait_for(lambda r: len(r) >= 30, timeout=10)
    counts = collections.Counter(g.msg_id for g in got)
    assert len(counts) == 30 and set(counts.values()) == {1}, counts
    assert {g.json["data"]["job_id"] for g in got} == set(jobs)


def test_events_from_before_the_endpoint_existed_are_not_sent(hooks, receiver):
    hooks.submit_and_cancel()
    hooks.worker().run_once()
    ep = hooks.register(receiver.url)
    job = hooks.submit_and_cancel()
    _drain(hooks.worker(), 2)
    got = receiver.wait_for(lambda r: len(r) >= 2, timeout=10)
    assert {g.json["data"]["job_id"] for g in got} == {job}
    with hooks.gw.session() as s:
        assert len(s.scalars(select(WebhookDelivery).where(WebhookDelivery.endpoint_id == ep["id"])).all()) == 2


def test_a_gap_in_event_ids_holds_the_cursor_until_it_settles(hooks, receiver):
    """An event id skipped (a transaction still open) must not be passed over for good."""
    from gateway.models.jobs import JobEvent
    from gateway.models.webhooks import WebhookCursor
    from gateway.webhooks.service import fan_out

    hooks.register(receiver.url)
    hooks.submit_and_cancel()
    with hooks.gw.session() as s, s.begin():
        ids = sorted(s.scalars(select(JobEvent.id)))
        cursor = s.get(WebhookCursor, "job_event")
        start = min(ids) - 1
        if cursor is None:
            s.add(WebhookCursor(name="job_event", last_event_id=start, updated_at=datetime.now(UTC)))
        else:
            cursor.last_event_id = start
        # Pretend the first event is not visible yet: renumber it after a gap.
        first = s.get(JobEvent, ids[0])
        first.id = ids[-1] + 5
    with hooks.gw.session() as s, s.begin():
        assert fan_out(s, settle_s=3600, unseen_s=86400) == 2  # both sent at once...
        assert s.get(WebhookCursor, "job_event").last_event_id == start  # ...but the cursor waits at the gap
    with hooks.gw.session() as s, s.begin():
        assert fan_out(s, settle_s=3600, unseen_s=86400) == 0  # the re-scan writes nothing twice
    with hooks.gw.session() as s, s.begin():
        s.execute(update(JobEvent).values(at=datetime.now(UTC) - timedelta(hours=2)))
    with hooks.gw.session() as s, s.begin():
        fan_out(s, settle_s=3600, unseen_s=86400)
        assert s.get(WebhookCursor, "job_event").last_event_id == ids[-1] + 5
