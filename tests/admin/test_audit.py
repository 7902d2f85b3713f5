"""The audit log (issue #49, item 4; docs/ledger.md "Audit log"), over HTTP, on SQLite and Postgres.

Each privileged change writes one record (who, when, what, before and after, the request id)
in the change's own transaction; a refused change writes none; coordinators read their
accounts' part; the hash chain verifies, and a record changed or removed in SQL is named by
``verify`` (the API and ``isthmus admin audit verify``)."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest
from click.testing import CliRunner
from sqlalchemy import delete, func, select, text, update

from gateway.audit import service as audit
from gateway.audit.service import Who
from gateway.kit.db import transaction
from gateway.models.audit import AuditRecord
from gateway.models.pools import Pool
from gateway.models.webhooks import WebhookEndpoint

POOL = "slurm-audit"


@pytest.fixture
def pool_row(gw):
    with gw.session() as s, s.begin():
        if s.get(Pool, POOL) is None:
            s.add(Pool(name=POOL, kind="slurm", gpu_types=["h100"], configured=True))


def admin(gw, rid: str | None = None) -> dict:
    h = gw.headers("root", groups=(), admin=True)
    return {**h, "X-Request-ID": rid} if rid else h


def count(gw) -> int:
    with gw.session() as s:
        return s.scalar(select(func.count()).select_from(AuditRecord))


def newest(gw, **params) -> dict:
    r = gw.client.get("/v1/admin/audit", params={**params, "limit": 1}, headers=admin(gw))
    assert r.status_code == 200, r.text
    return r.json()["items"][0]


def at(hours: float) -> str:
    return (datetime.now(UTC) + timedelta(hours=hours)).isoformat()


def _one_more(gw, before: int, action: str, rid: str) -> dict:
    assert count(gw) == before + 1, "one change, one record"
    rec = newest(gw)
    assert (rec["action"], rec["subject"], rec["username"], rec["request_id"]) == (action, "dev:root", "root", rid)
    return rec


def test_each_privileged_change_writes_one_record_with_who_before_and_after(gw, pool_row):
    n = count(gw)
    r = gw.client.put("/v1/admin/accounts/team-a/quota", json={"max_gpus": 8, "budget_gpu_hours": 10},
                      headers=admin(gw, "rq-quota-1"))
    assert r.status_code == 200, r.text
    rec = _one_more(gw, n, "account.quota.set", "rq-quota-1")
    assert rec["account"] == "team-a" and rec["before"] is None
    assert rec["after"]["max_gpus"] == 8 and rec["after"]["budget_gpu_seconds"] == 36000

    n = count(gw)
    gw.client.put("/v1/admin/accounts/team-a/quota", json={"max_gpus": 16}, headers=admin(gw, "rq-quota-2"))
    rec = _one_more(gw, n, "account.quota.set", "rq-quota-2")
    assert (rec["before"]["max_gpus"], rec["after"]["max_gpus"]) == (8, 16)

    n = count(gw)
    r = gw.client.put("/v1/admin/accounts/team-a/members/bob", json={"role": "coordinator"},
                      headers=admin(gw, "rq-member"))
    assert r.status_code == 200, r.text
    rec = _one_more(gw, n, "account.member.set", "rq-member")
    assert (rec["target_name"], rec["before"], rec["after"]) == ("bob", None, {"username": "bob", "role": "coordinator"})

    n = count(gw)
    r = gw.client.patch(f"/v1/admin/pools/{POOL}", json={"state": "draining"}, headers=admin(gw, "rq-pool"))
    assert r.status_code == 200, r.text
    rec = _one_more(gw, n, "pool.update", "rq-pool")
    assert (rec["target_name"], rec["before"]["state"], rec["after"]["state"]) == (POOL, "active", "draining")

    n = count(gw)
    r = gw.client.post(f"/v1/admin/pools/{POOL}/windows", json={"start": at(4), "end": at(8), "reason": "kernel"},
                       headers=admin(gw, "rq-window"))
    assert r.status_code == 201, r.text
    rec = _one_more(gw, n, "pool.window.create", "rq-window")
    assert rec["target_name"] == r.json()["id"] and rec["before"] is None and rec["after"]["reason"] == "kernel"
    n = count(gw)
    assert gw.client.delete(f"/v1/admin/pools/{POOL}/windows/{r.json()['id']}",
                            headers=admin(gw, "rq-window-rm")).status_code == 204
    rec = _one_more(gw, n, "pool.window.remove", "rq-window-rm")
    assert rec["before"]["reason"] == "kernel" and rec["after"] is None

    n = count(gw)
    r = gw.client.post("/v1/admin/ledger/adjustments", headers=admin(gw, "rq-credit"),
                       json={"account": "team-a", "kind": "credit", "gpu_hours": 2, "reason": "bad node"})
    assert r.status_code == 201, r.text
    rec = _one_more(gw, n, "ledger.adjust", "rq-credit")
    assert rec["account"] == "team-a" and rec["target_name"] == str(r.json()["id"])
    assert rec["after"] == {"kind": "credit", "gpu_seconds": -7200, "job_id": None, "pool": None,
                            "reason": "bad node"}

    n = count(gw)
    r = gw.client.post("/v1/admin/reservations", headers=admin(gw, "rq-resv"),
                       json={"account": "team-a", "pool": POOL, "nodes": 1, "start": at(1), "end": at(2),
                             "reason": "deadline"})
    assert r.status_code == 201, r.text
    rec = _one_more(gw, n, "reservation.create", "rq-resv")
    assert rec["account"] == "team-a" and rec["after"]["nodes"] == 1

    n = count(gw)
    r = gw.client.post("/v1/admin/accounts", json={"name": "team-c", "parent": "team-a"}, headers=admin(gw, "rq-acc"))
    assert r.status_code == 201, r.text
    rec = _one_more(gw, n, "account.create", "rq-acc")
    assert rec["after"]["parent"] == "team-a"
    assert gw.client.delete("/v1/admin/accounts/team-c", headers=admin(gw, "rq-acc-rm")).status_code == 204
    rec = _one_more(gw, n + 1, "account.delete", "rq-acc-rm")
    assert rec["before"]["name"] == "team-c" and rec["after"] is None
    assert audit_verify(gw)["ok"]


def test_a_refused_change_writes_no_record(gw, pool_row):
    n = count(gw)
    for method, path, body, status in [
        ("PUT", "/v1/admin/accounts/team-a/quota", {"max_gpus": -1}, 422),
        ("PUT", "/v1/admin/accounts/team-a/quota", {"max_gpus": 4, "guaranteed_gpus": 8}, 422),  # after a write
        ("PUT", "/v1/admin/accounts/nope/members/bob", {"role": "member"}, 404),
        ("PATCH", "/v1/admin/pools/nope", {"state": "draining"}, 404),
        ("POST", f"/v1/admin/pools/{POOL}/windows", {"start": at(-3), "end": at(-2), "reason": "past"}, 422),
        ("POST", "/v1/admin/ledger/adjustments", {"account": "team-a", "kind": "refund", "gpu_hours": 1,
                                                  "reason": "x"}, 422),
        ("DELETE", "/v1/admin/accounts/team-a/members/nobody", None, 404),
    ]:
        r = gw.client.request(method, path, json=body, headers=admin(gw))
        assert r.status_code == status, (path, r.text)
    assert count(gw) == n


def test_the_record_is_in_the_changes_transaction(gw):
    """Rolled back with the change: a transaction that fails after the record leaves neither."""
    n = count(gw)
    from gateway.accounts import service as accounts

    with pytest.raises(RuntimeError), transaction(gw.app.state.sessionmaker) as s:
        accounts.set_member(s, name="team-a", username="carol", role="member", by=Who("root", "root"))
        assert s.scalar(select(func.count()).select_from(AuditRecord)) == n + 1
        raise RuntimeError("the request failed after the change")
    assert count(gw) == n
    with gw.session() as s:
        assert s.scalar(text("SELECT count(*) FROM account_member WHERE username = 'carol'")) == 0


def test_coordinators_read_their_accounts_part_members_and_others_do_not(gw):
    gw.client.put("/v1/admin/accounts/team-a/members/bob", json={"role": "coordinator"}, headers=admin(gw))
    gw.client.put("/v1/admin/accounts/team-a/quota", json={"max_gpus": 4}, headers=admin(gw))
    gw.client.put("/v1/admin/accounts/team-b/quota", json={"max_gpus": 2}, headers=admin(gw))
    bob = gw.headers("bob", groups=())
    r = gw.client.get("/v1/accounts/team-a/audit", headers=bob)
    assert r.status_code == 200, r.text
    items = r.json()["items"]
    assert items and {i["account"] for i in items} == {"team-a"}
    assert [i["action"] for i in items][:2] == ["account.quota.set", "account.member.set"]
    r = gw.client.get("/v1/accounts/team-b/audit", headers=bob)
    assert r.status_code == 404 and r.headers["content-type"].startswith("application/problem+json")
    # alice charges team-a (her token's group) but does not coordinate it
    r = gw.client.get("/v1/accounts/team-a/audit", headers=gw.headers("alice", groups=("team-a",)))
    assert r.status_code == 403, r.text
    assert gw.client.get("/v1/admin/audit", headers=bob).status_code == 403
    r = gw.client.get("/v1/accounts/team-b/audit", headers=admin(gw))
    assert r.status_code == 200 and {i["account"] for i in r.json()["items"]} == {"team-b"}


def test_filters_and_paging(gw):
    for n in (1, 2, 3):
        gw.client.put("/v1/admin/accounts/team-b/quota", json={"max_gpus": n}, headers=admin(gw))
    page = gw.client.get("/v1/admin/audit", params={"action": "account.quota.set", "account": "team-b", "limit": 2},
                         headers=admin(gw)).json()
    assert [i["after"]["max_gpus"] for i in page["items"]] == [3, 2] and page["next_cursor"]
    rest = gw.client.get("/v1/admin/audit", params={"action": "account.*", "account": "team-b", "limit": 2,
                                                     "cursor": page["next_cursor"]}, headers=admin(gw)).json()
    assert rest["items"][0]["after"]["max_gpus"] == 1
    assert gw.client.get("/v1/admin/audit", params={"subject": "nobody"}, headers=admin(gw)).json()["items"] == []
    future = gw.client.get("/v1/admin/audit", params={"since": at(1)}, headers=admin(gw)).json()
    assert future["items"] == []
    for params, field in [({"action": "Bad Action"}, "query.action"), ({"cursor": "zzz"}, "query.cursor"),
                          ({"since": at(1), "until": at(0)}, "query.until"), ({"limit": 0}, "query.limit"),
                          ({"account": "Not An Account"}, "query.account"), ({"since": "yesterday"}, "query.since")]:
        r = gw.client.get("/v1/admin/audit", params=params, headers=admin(gw))
        assert r.status_code == 422 and r.headers["content-type"].startswith("application/problem+json"), r.text
        assert field in [e["field"] for e in r.json()["errors"]], r.json()


def test_webhook_secrets_never_reach_the_log(gw, site):
    site(webhook_allowlist="10.0.0.0/8")
    r = gw.client.post("/v1/accounts/team-a/webhooks", headers=gw.headers("alice", groups=("team-a",)),
                       json={"url": "https://10.1.2.3:8443/in?token=abc", "description": "ci"})
    assert r.status_code == 201, r.text
    secret = r.json()["secret"]
    rec = newest(gw, action="webhook.create")
    assert (rec["subject"], rec["username"]) == ("dev:alice", "alice") and rec["account"] == "team-a"
    assert rec["after"]["url"] == "https://10.1.2.3:8443/in"
    with gw.session() as s:
        raw = s.scalar(select(text("CAST(after AS TEXT)")).select_from(AuditRecord).order_by(AuditRecord.id.desc()))
        assert secret not in raw and "abc" not in raw
        assert s.scalar(select(func.count()).select_from(WebhookEndpoint)) == 1


def test_secret_keys_are_redacted_whole_names_only():
    assert audit.plain({"secret": "s", "webhook_secret": "s", "tokens_used": 3, "api_key": "k",
                        "nested": [{"password": "p"}], "at": datetime(2026, 12, 8, tzinfo=UTC)}) == {
        "secret": "[redacted]", "webhook_secret": "[redacted]", "tokens_used": 3, "api_key": "[redacted]",
        "nested": [{"password": "[redacted]"}], "at": "2026-12-08T00:00:00+00:00"}


def audit_verify(gw) -> dict:
    r = gw.client.get("/v1/admin/audit/verify", headers=admin(gw))
    assert r.status_code == 200, r.text
    return r.json()


def _changes(gw, n: int) -> list[int]:
    for i in range(n):
        gw.client.put("/v1/admin/accounts/team-a/quota", json={"max_queued_jobs": 10 + i}, headers=admin(gw))
    with gw.session() as s:
        return list(s.scalars(select(AuditRecord.id).order_by(AuditRecord.id)))


def test_a_record_changed_in_sql_is_named_by_verify(gw, monkeypatch):
    ids = _changes(gw, 4)
    assert audit_verify(gw)["ok"]
    middle = ids[-3]
    with gw.session() as s, s.begin():
        s.execute(update(AuditRecord).where(AuditRecord.id == middle).values(after={"max_queued_jobs": 1}))
    v = audit_verify(gw)
    assert (v["ok"], v["broken_id"]) == (False, middle) and "changed" in v["reason"]
    # The command line says so too, and exits non-zero.
    assert _cli_verify(gw, monkeypatch) == (1, middle)


def test_a_record_deleted_in_sql_is_named_by_verify(gw):
    ids = _changes(gw, 4)
    with gw.session() as s, s.begin():
        s.execute(delete(AuditRecord).where(AuditRecord.id == ids[-3]))
    v = audit_verify(gw)
    assert (v["ok"], v["broken_id"]) == (False, ids[-2]) and "removed" in v["reason"]


def _cli_verify(gw, monkeypatch) -> tuple[int, int | None]:
    """``isthmus admin audit verify`` (exit code, the record it names), its HTTP calls made to this test's app."""
    import json

    from gateway import cli_client
    from gateway.cli import main

    headers = admin(gw)

    class Bound:
        def request(self, method, path, **kw):
            return gw.client.request(method, path, headers=headers, **kw)

    def bound_init(self, url, token):
        self.http = Bound()

    monkeypatch.setattr(cli_client.Client, "__init__", bound_init)
    result = CliRunner().invoke(main, ["admin", "audit", "verify", "--json"])
    text_result = CliRunner().invoke(main, ["admin", "audit", "verify"])
    assert text_result.exit_code == result.exit_code
    return result.exit_code, json.loads(result.output)["broken_id"]


def test_retention_prunes_old_records_and_the_chain_still_verifies(gw, site):
    ids = _changes(gw, 3)
    with gw.session() as s, s.begin():  # the first ones are a year and a half old
        s.execute(update(AuditRecord).where(AuditRecord.id <= ids[1])
                  .values(at=datetime.now(UTC) - timedelta(days=500)))
    # (changing `at` breaks those records' hashes; they are the ones pruned)
    site(audit_retention_days=0)
    assert gw.client.post("/v1/admin/audit/prune", headers=admin(gw)).json() == {"deleted": 0, "retention_days": 0}
    site(audit_retention_days=400)
    r = gw.client.post("/v1/admin/audit/prune", headers=admin(gw))
    assert r.status_code == 200 and r.json()["deleted"] == 2, r.text
    v = audit_verify(gw)
    assert v["ok"] and v["starts_after_prune"] and v["first_id"] == ids[2], v
    rec = newest(gw, action="audit.prune")
    assert rec["after"]["deleted"] == 2 and rec["after"]["through_id"] == ids[1]


def test_concurrent_appends_keep_one_chain(gw):
    """Two threads appending at once (Postgres: the chain's advisory lock) never fork the chain."""
    if not gw.settings.database_url.startswith("postgresql"):
        pytest.skip("SQLite has one writer at a time")
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def appender(name: str) -> None:
        try:
            start.wait()
            for i in range(25):
                with transaction(gw.app.state.sessionmaker) as s:
                    audit.record(s, by=Who.system(name), action="test.append", target_kind="test",
                                 target_name=f"{name}-{i}")
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=appender, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    with gw.session() as s:
        prevs = list(s.scalars(select(AuditRecord.prev_hash)))
    assert len(prevs) == len(set(prevs)), "two records chained to the same predecessor: the chain forked"
    v = audit_verify(gw)
    assert v["ok"] and v["checked"] == count(gw)
