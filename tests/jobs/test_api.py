"""The /v1/jobs API as a user sees it, on SQLite and Postgres."""

from __future__ import annotations

import concurrent.futures

import pytest
from sqlalchemy import func, select

from gateway.models.jobs import IdempotencyKey, Job, JobEvent

SPEC = {"name": "train", "account": "team-a", "command": ["python", "train.py"], "workers": 4,
        "gpus_per_worker": 8, "cpus_per_worker": 16, "memory_per_worker": "64Gi", "time_limit": "2h"}


def count(gw, model=Job) -> int:
    with gw.session() as s:
        return s.scalar(select(func.count()).select_from(model))


def submit(gw, spec=None, user="alice", groups=("team-a",), **kw):
    return gw.client.post("/v1/jobs", json=spec or SPEC, headers={**gw.headers(user, groups), **kw.pop("headers", {})})


def test_submit_records_pending_job_with_history(gw):
    r = submit(gw)
    assert r.status_code == 202, r.text
    job = r.json()
    assert job["state"] == "pending"
    assert job["total_gpus"] == 32
    assert job["user"] == "alice" and job["submitted_by"] == "dev:alice"
    assert job["time_limit_s"] == 7200 and job["memory_per_worker"] == "64Gi"
    assert r.headers["location"] == f"/v1/jobs/{job['id']}"

    got = gw.client.get(f"/v1/jobs/{job['id']}", headers=gw.headers()).json()
    assert got == job
    events = gw.client.get(f"/v1/jobs/{job['id']}/events", headers=gw.headers()).json()["items"]
    assert [(e["to_state"], e["reason"], e["actor"]) for e in events] == [("pending", "submitted", "dev:alice")]


def test_default_time_limit_and_memory_units(gw):
    spec = {"name": "t", "account": "team-a", "command": ["true"], "memory_per_worker": 2048}
    job = submit(gw, spec).json()
    assert job["time_limit_s"] == 3600 and job["time_limit"] == "01:00:00"
    assert job["memory_per_worker"] == "2Gi"
    assert job["total_gpus"] == 0


BAD = [
    ({"workers": 0}, "body.workers"),
    ({"workers": 100000}, "body.workers"),
    ({"gpus_per_worker": -1}, "body.gpus_per_worker"),
    ({"gpus_per_worker": 64}, "body.gpus_per_worker"),
    ({"command": []}, "body.command"),
    ({"command": "python train.py"}, "body.command"),
    ({"command": ["a\x00b"]}, "body.command"),
    ({"command": ["x"] * 1000}, "body.command"),
    ({"name": "has space"}, "body.name"),
    ({"name": ""}, "body.name"),
    ({"account": "Team_A"}, "body.account"),
    ({"backend": "lsf"}, "body.backend"),
    ({"memory_per_worker": "12Q"}, "body.memory_per_worker"),
    ({"memory_per_worker": "100Ti"}, "body.memory_per_worker"),
    ({"time_limit": "forever"}, "body.time_limit"),
    ({"time_limit": "10s"}, "body.time_limit"),
    ({"time_limit": "1:99:00"}, "body.time_limit"),
    ({"env": {"1BAD": "x"}}, "body.env"),
    ({"env": {"SLURM_JOB_ID": "1"}}, "body.env"),
    ({"env": {f"K{i}": "v" for i in range(200)}}, "body.env"),
    ({"labels": {"bad key!": "v"}}, "body.labels"),
    ({"priority": 5000}, "body.priority"),
    ({"image": "UPPER/Case"}, "body.image"),
    ({"gpu_type": "h100", "gpus_per_worker": 0}, "body"),
    ({"unknown_field": 1}, "body.unknown_field"),
    ({"topology": {}}, "body.topology"),
    ({"topology": {"required": "block", "preferred": "block"}}, "body.topology"),
    ({"topology": {"required": "Block!"}}, "body.topology.required"),
    ({"topology": {"preferred": "block\nx"}}, "body.topology.preferred"),
    ({"topology": {"rack": True}}, "body.topology.rack"),
]


@pytest.mark.parametrize("patch,field", BAD, ids=[f for _, f in BAD])
def test_bad_input_is_a_problem_naming_the_field_and_writes_nothing(gw, patch, field):
    before = count(gw), count(gw, JobEvent)
    r = submit(gw, {**SPEC, **patch})
    assert r.status_code == 422, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    body = r.json()
    assert body["status"] == 422 and body["title"]
    assert field in [e["field"] for e in body["errors"]], body
    assert (count(gw), count(gw, JobEvent)) == before


def test_malformed_json_is_a_problem(gw):
    r = gw.client.post("/v1/jobs", content=b"{not json", headers={**gw.headers(), "content-type": "application/json"})
    assert r.status_code == 422
    assert r.headers["content-type"].startswith("application/problem+json")
    assert count(gw) == 0


def test_unknown_account_names_the_field(gw):
    r = submit(gw, {**SPEC, "account": "team-z"}, groups=("team-z",))
    assert r.status_code == 422
    assert r.json()["errors"][0]["field"] == "body.account"
    assert count(gw) == 0


def test_idempotency_key_replays_same_job_and_rejects_other_body(gw):
    h = {"Idempotency-Key": "run-42"}
    first = submit(gw, headers=h)
    again = submit(gw, headers=h)
    assert first.status_code == 202 and again.status_code == 200
    assert again.json()["id"] == first.json()["id"]
    other = submit(gw, {**SPEC, "workers": 2}, headers=h)
    assert other.status_code == 409
    assert other.headers["content-type"].startswith("application/problem+json")
    assert count(gw) == 1
    # Keys are per caller: bob's "run-42" is a different submission.
    bob = submit(gw, {**SPEC, "account": "team-b"}, user="bob", groups=("team-b",), headers=h)
    assert bob.status_code == 202 and bob.json()["id"] != first.json()["id"]
    assert count(gw) == 2


def test_concurrent_retries_with_one_key_make_one_job(gw):
    token = gw.token()

    def post(_):
        return gw.client.post("/v1/jobs", json=SPEC, headers={"Authorization": f"Bearer {token}",
                                                              "Idempotency-Key": "burst-1"})

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(post, range(16)))
    assert {r.status_code for r in results} <= {200, 202}
    assert len({r.json()["id"] for r in results}) == 1
    assert count(gw) == 1 and count(gw, IdempotencyKey) == 1


def test_bad_idempotency_key_header(gw):
    r = submit(gw, headers={"Idempotency-Key": "has space"})
    assert r.status_code == 422
    assert r.json()["errors"][0]["field"] == "header.Idempotency-Key"
    assert count(gw) == 0


def test_list_pages_through_every_job_once_newest_first(gw):
    ids = [submit(gw, {**SPEC, "name": f"j{i}"}).json()["id"] for i in range(7)]
    seen, cursor = [], None
    while True:
        params = {"limit": 3, **({"cursor": cursor} if cursor else {})}
        page = gw.client.get("/v1/jobs", params=params, headers=gw.headers()).json()
        seen += [j["id"] for j in page["items"]]
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert seen == list(reversed(ids))


def test_list_filters(gw):
    a = submit(gw, {**SPEC, "backend": "slurm"}).json()
    b = submit(gw, {**SPEC, "backend": "kubernetes"}).json()
    gw.client.post(f"/v1/jobs/{b['id']}/cancel", headers=gw.headers())
    h = gw.headers()
    assert [j["id"] for j in gw.client.get("/v1/jobs?backend=slurm", headers=h).json()["items"]] == [a["id"]]
    assert [j["id"] for j in gw.client.get("/v1/jobs?state=cancelled", headers=h).json()["items"]] == [b["id"]]
    both = gw.client.get("/v1/jobs?state=cancelled&state=pending", headers=h).json()["items"]
    assert len(both) == 2
    assert gw.client.get("/v1/jobs?state=bogus", headers=h).status_code == 422
    assert gw.client.get("/v1/jobs?cursor=!!!", headers=h).status_code == 422
    assert gw.client.get("/v1/jobs?account=team-b", headers=h).json()["items"] == []


def test_cancel_pending_job(gw):
    job = submit(gw).json()
    r = gw.client.post(f"/v1/jobs/{job['id']}/cancel", headers=gw.headers())
    assert r.status_code == 202
    assert r.json()["state"] == "cancelled" and r.json()["cancel_requested_at"]
    again = gw.client.post(f"/v1/jobs/{job['id']}/cancel", headers=gw.headers())
    assert again.status_code == 409
    events = gw.client.get(f"/v1/jobs/{job['id']}/events", headers=gw.headers()).json()["items"]
    assert [e["to_state"] for e in events] == ["pending", "cancelled"]
    assert events[1]["reason"] == "cancelled by alice"


def test_a_job_cancelled_while_pending_ends_then_and_has_no_exit_code(gw):
    job = submit(gw).json()
    cancelled = gw.client.post(f"/v1/jobs/{job['id']}/cancel", headers=gw.headers()).json()
    shown = gw.client.get(f"/v1/jobs/{job['id']}", headers=gw.headers()).json()
    assert shown["state"] == "cancelled"
    assert shown["ended_at"] and shown["ended_at"] == cancelled["cancel_requested_at"]
    assert shown["exit_code"] is None and shown["started_at"] is None


def test_tenancy_users_see_only_their_accounts(gw):
    alice_job = submit(gw).json()
    bob = gw.headers("bob", ("team-b",))
    assert gw.client.get(f"/v1/jobs/{alice_job['id']}", headers=bob).status_code == 404
    assert gw.client.get(f"/v1/jobs/{alice_job['id']}/events", headers=bob).status_code == 404
    assert gw.client.post(f"/v1/jobs/{alice_job['id']}/cancel", headers=bob).status_code == 404
    assert gw.client.get("/v1/jobs", headers=bob).json()["items"] == []
    # bob may not charge team-a
    r = gw.client.post("/v1/jobs", json=SPEC, headers=bob)
    assert r.status_code == 403 and count(gw) == 1
    # an admin sees everything
    admin = gw.headers("root", (), admin=True)
    assert [j["id"] for j in gw.client.get("/v1/jobs", headers=admin).json()["items"]] == [alice_job["id"]]
    # the job is unchanged by bob's attempts
    assert gw.client.get(f"/v1/jobs/{alice_job['id']}", headers=gw.headers()).json()["state"] == "pending"


def test_no_token_is_401_with_challenge(gw):
    r = gw.client.post("/v1/jobs", json=SPEC)
    assert r.status_code == 401
    assert r.headers["www-authenticate"].startswith("Bearer")
    assert gw.client.get("/v1/jobs", headers={"Authorization": "Bearer not-a-jwt"}).status_code == 401
    assert count(gw) == 0


def test_health_and_readiness_are_public(gw):
    assert gw.client.get("/healthz").json() == {"status": "ok"}
    ready = gw.client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["database"] == "ok"
    assert gw.client.get("/openapi.json").status_code == 200
