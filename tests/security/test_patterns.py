"""Finding 7: every pattern matches the WHOLE string; a trailing newline is refused.

``re.match`` with ``$`` accepts ``"FOO\\n"`` (``$`` also matches before a final newline).
Each case below sends such a value where a user would send it and expects a refusal
that names the field, with nothing recorded.
"""

from __future__ import annotations

import pytest

from gateway.models.jobs import Job

SPEC = {"name": "p", "account": "team-a", "command": ["true"], "workers": 1}


def _submit(gw, **overrides):
    return gw.client.post("/v1/jobs", json={**SPEC, **overrides}, headers=gw.headers())


def _no_jobs(gw) -> None:
    with gw.session() as s:
        assert s.query(Job).count() == 0


@pytest.mark.parametrize("field,value", [
    ("env", {"FOO\n": "x"}),
    ("labels", {"team\n": "x"}),
    ("labels", {"team": "x\n"}),
    ("labels", {"example.com/team\n": "x"}),
    ("name", "job\n"),
    ("account", "team-a\n"),
    ("gpu_type", "h100\n"),
    ("image", "ghcr.io/x/y:1\n"),
])
def test_job_spec_refuses_trailing_newline(gw, field, value):
    extra = {"gpus_per_worker": 1} if field == "gpu_type" else {}
    r = _submit(gw, **{field: value}, **extra)
    assert r.status_code == 422, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert any(e["field"].startswith(f"body.{field}") for e in r.json()["errors"]), r.json()
    _no_jobs(gw)


def test_posix_user_with_trailing_newline_is_refused(gw):
    token = gw.issuer.mint(user="alice", groups=["team-a"], extra={"preferred_username": "alice\n"})
    r = gw.client.post("/v1/jobs", json=SPEC, headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 401, r.text
    assert "POSIX user" in r.json()["detail"]
    _no_jobs(gw)


def test_account_group_with_trailing_newline_grants_nothing():
    from gateway.identity.claims import ClaimsMapping, principal_from_claims

    p = principal_from_claims({"sub": "s", "preferred_username": "alice", "groups": ["team-a\n", "team-b"]},
                              ClaimsMapping(), issuer="i")
    assert p.accounts == frozenset({"team-b"})


def test_idempotency_key_with_trailing_newline_is_refused(gw):
    # HTTP clients refuse to put a newline in a header; the gateway must not rely on
    # that, so this request is handed to the ASGI app directly.
    import asyncio
    import json

    body = json.dumps(SPEC).encode()
    headers = [(b"host", b"test"), (b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode()),
               (b"authorization", ("Bearer " + gw.token()).encode()), (b"idempotency-key", b"key-1\n")]
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": "/v1/jobs", "raw_path": b"/v1/jobs", "query_string": b"",
             "root_path": "", "headers": headers, "client": ("127.0.0.1", 1), "server": ("test", 80),
             "state": {}}
    sent: list[dict] = []
    chunks = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive():
        return chunks.pop(0) if chunks else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    asyncio.run(gw.app(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    payload = json.loads(b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body"))
    assert start["status"] == 422, payload
    assert payload["errors"][0]["field"] == "header.Idempotency-Key"
    _no_jobs(gw)


@pytest.mark.parametrize("path", [
    "/v1/admin/billing-weights/slurm/h100%0A",
    "/v1/admin/accounts/team-a/members/bob%0A",
])
def test_admin_paths_refuse_trailing_newline(gw, path):
    r = gw.client.put(path, json={"weight": 2.0} if "billing" in path else {"role": "member"},
                      headers=gw.headers(user="root-admin", admin=True))
    assert r.status_code == 422, r.text
    assert r.json()["errors"][0]["field"].startswith("path."), r.json()


def test_account_create_refuses_trailing_newline(gw):
    r = gw.client.post("/v1/admin/accounts", json={"name": "team-c\n"}, headers=gw.headers(user="adm", admin=True))
    assert r.status_code == 422, r.text
    assert r.json()["errors"][0]["field"] == "body.name"


def test_slurm_script_refuses_env_name_with_newline():
    from adapters.base import SubmissionRejected
    from adapters.slurm.script import render_script

    with pytest.raises(SubmissionRejected):
        render_script(["true"], {"FOO\n": "x"}, 1)


def test_kubernetes_label_value_with_newline_is_digested():
    from adapters.kubernetes.render import label_value

    assert label_value("alice\n") != "alice\n"
    assert label_value("alice") == "alice"
