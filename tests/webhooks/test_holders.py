"""Webhooks follow the tenancy of job reads and die with their holder's membership (issue #27, finding 6).

The in-process gateway with a real HTTPS receiver; "seen" is what the gateway records from
real authenticated requests (gateway/identity/seen.py).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import func, select, update

from gateway.models.identity import MembershipSeen
from gateway.models.webhooks import WebhookCursor, WebhookEndpoint


def _endpoint(hooks, endpoint_id: int, user: str = "carol") -> dict:
    r = hooks.gw.client.get(f"/v1/accounts/team-a/webhooks/{endpoint_id}", headers=hooks.gw.headers(user))
    assert r.status_code == 200, r.text
    return r.json()


def test_a_coordinator_cannot_register_for_a_child_account_whose_jobs_it_cannot_read(hooks, receiver):
    gw = hooks.gw
    admin = gw.headers("root-admin", (), admin=True)
    for body in ({"name": "org"}, {"name": "org-kid", "parent": "org"}):
        assert gw.client.post("/v1/admin/accounts", json=body, headers=admin).status_code == 201
    assert gw.client.put("/v1/admin/accounts/org/members/bob", json={"role": "coordinator"},
                         headers=admin).status_code == 200
    bob = gw.headers("bob", ("org",))
    # bob coordinates org, so he sees org-kid in the account tree, but reads none of its jobs...
    assert "org-kid" in [a["name"] for a in gw.client.get("/v1/accounts", headers=bob).json()["items"]]
    assert gw.client.get("/v1/jobs", params={"account": "org-kid"}, headers=bob).json()["items"] == []
    # ...so he may not receive its job events either, nor see or manage its endpoints.
    base = "/v1/accounts/org-kid/webhooks"
    r = gw.client.post(base, json={"url": receiver.url}, headers=bob)
    assert r.status_code == 404 and r.headers["content-type"].startswith("application/problem+json")
    assert gw.client.get(base, headers=bob).status_code == 404
    with gw.session() as s:
        assert s.scalar(select(func.count()).select_from(WebhookEndpoint)) == 0
    kid = gw.client.post(base, json={"url": receiver.url}, headers=admin)  # admins read every account's jobs
    assert kid.status_code == 201, kid.text
    for method in ("GET", "PATCH", "DELETE"):
        r = gw.client.request(method, f"{base}/{kid.json()['id']}", headers=bob,
                              json={"enabled": False} if method == "PATCH" else None)
        assert r.status_code == 404, (method, r.text)
    # His own token account is his.
    assert gw.client.post("/v1/accounts/org/webhooks", json={"url": receiver.url}, headers=bob).status_code == 201


def test_an_endpoint_whose_holder_left_the_account_is_suspended_until_a_member_reenables_it(hooks, receiver):
    gw = hooks.gw
    ep = hooks.register(receiver.url)  # alice, of team-a
    assert ep["held_by"] == ep["created_by"] == "dev:alice"
    worker = hooks.worker()
    first = hooks.submit_and_cancel()
    worker.run_once()
    receiver.wait_for(lambda r: len(r) >= 2, timeout=10)
    # The identity provider removes alice from team-a: her next request shows it.
    assert gw.client.get("/v1/jobs", headers=gw.headers("alice", ("team-b",))).status_code == 200
    hidden = hooks.submit_and_cancel(user="carol")
    worker.run_once()
    worker.run_once()
    assert len(receiver.received) == 2  # team-a's events no longer reach alice's receiver
    status = _endpoint(hooks, ep["id"])  # carol, a member, sees why
    assert status["enabled"] is False and status["pending_deliveries"] == 0
    assert "suspended: its holder dev:alice was seen at" in status["disabled_reason"]
    assert "without account team-a" in status["disabled_reason"]
    # alice cannot re-enable it (she does not hold team-a); carol can, and becomes its holder.
    base = f"/v1/accounts/team-a/webhooks/{ep['id']}"
    assert gw.client.patch(base, json={"enabled": True}, headers=gw.headers("alice", ("team-b",))).status_code == 404
    # A gap in event ids can hold the outbox cursor behind the events of the suspension, so
    # they are scanned again after re-enabling (service.fan_out): make that happen here.
    with gw.session() as s, s.begin():
        s.execute(update(WebhookCursor).values(last_event_id=0))
    r = gw.client.patch(base, json={"enabled": True}, headers=gw.headers("carol"))
    assert r.status_code == 200 and r.json()["enabled"] and r.json()["held_by"] == "dev:carol"
    later = hooks.submit_and_cancel(user="carol")
    worker.run_once()
    got = receiver.wait_for(lambda r: len(r) >= 4, timeout=10)
    assert {g.json["data"]["job_id"] for g in got} == {first, later} and hidden not in str([g.body for g in got])


def test_an_endpoint_whose_holder_was_not_seen_within_the_period_is_suspended(hooks, receiver):
    gw = hooks.gw
    ep = hooks.register(receiver.url)
    worker = hooks.worker()
    hooks.submit_and_cancel(user="carol")
    worker.run_once()
    receiver.wait_for(lambda r: len(r) >= 2, timeout=10)  # alice was seen a moment ago: delivered
    # Eight days pass without a request from alice (carol keeps working).
    with gw.session() as s, s.begin():
        s.execute(update(MembershipSeen).where(MembershipSeen.subject == "dev:alice")
                  .values(last_seen_at=datetime.now(UTC) - timedelta(days=8)))
    hooks.submit_and_cancel(user="carol")
    worker.run_once()
    assert len(receiver.received) == 2
    status = _endpoint(hooks, ep["id"])
    assert status["enabled"] is False
    assert ("suspended: its holder dev:alice has not been seen holding account team-a for 7 days "
            "(ISTHMUS_WEBHOOK_HOLDER_UNSEEN_S)") in status["disabled_reason"]


def test_seen_is_written_once_per_interval_and_at_once_when_the_accounts_change(hooks):
    gw = hooks.gw

    def seen() -> dict[str, datetime]:
        with gw.session() as s:
            return {r.account: r.last_seen_at for r in s.scalars(
                select(MembershipSeen).where(MembershipSeen.subject == "dev:dora"))}

    assert gw.client.get("/v1/jobs", headers=gw.headers("dora")).status_code == 200
    before = seen()
    assert set(before) == {"", "team-a"}
    for _ in range(3):  # the hot path: no write while the accounts stay the same
        assert gw.client.get("/v1/jobs", headers=gw.headers("dora")).status_code == 200
    assert seen() == before
    assert gw.client.get("/v1/jobs", headers=gw.headers("dora", ("team-a", "team-b"))).status_code == 200
    after = seen()
    assert set(after) == {"", "team-a", "team-b"} and after[""] > before[""]
