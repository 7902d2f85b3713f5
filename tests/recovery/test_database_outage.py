"""A database outage answers 503 with Retry-After, and retries after it change nothing twice (#47, 6).

A REAL outage: the module's own Postgres server (tests/conftest.py ``own_postgres_server``:
initdb in /var/tmp, pg_ctl on a free loopback port; never the stack's server, which other
lanes use) is stopped with ``pg_ctl stop -m immediate`` under a running gateway app, then
started again. While it is down, a cancel, a submission (the group commit's path), a list, a
read and a dashboard page answer 503 with ``Retry-After`` naming the database; once it is back
the same requests succeed, the retried submission exists once and the cancel takes effect.
"""

from __future__ import annotations

import subprocess
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from gateway.kit.errors import DATABASE_RETRY_AFTER_S, PROBLEM_JSON
from gateway.ui.session import COOKIE
from stack.databases import temporary_database
from tests.ui.test_pages import SECRET, session_cookie

pytestmark = pytest.mark.postgres

SPEC = {"name": "outage", "account": "team-a", "command": ["true"], "workers": 1, "gpus_per_worker": 1}


@pytest.fixture
def outage_gateway(own_postgres_server, dev_key_path):
    from gateway.app import create_app
    from gateway.identity.setup import build_dev_issuer
    from gateway.kit.settings import Settings

    with temporary_database(own_postgres_server.url, prefix="isthmus_outage", migrated=True) as url:
        settings = Settings(database_url=url, dev_mode=True, dev_key_path=dev_key_path, dev_accounts="team-a",
                            dispatch_in_serve=False, ui_session_secret=SECRET)
        app = create_app(settings)
        # Raising server errors: an outage must be answered by its handler, never reach the
        # catch-all (which logs a traceback and re-raises).
        with TestClient(app) as client:
            token = build_dev_issuer(settings).mint(user="alice", groups=["team-a"], admin=False)
            client.headers["Authorization"] = f"Bearer {token}"
            try:
                yield client, app, token
            finally:
                own_postgres_server.run("up")  # the database is dropped on it


def stop_immediately(server) -> None:
    """``pg_ctl stop -m immediate``: the server dies as in a crash, its connections cut."""
    bin_dir = "/usr/lib/postgresql/15/bin"
    subprocess.run(["su", "postgres", "-s", "/bin/sh", "-c",
                    f"{bin_dir}/pg_ctl -D '{server.state}/data' stop -m immediate -w"],
                   check=True, capture_output=True)


def assert_outage(response, *, page: bool = False) -> None:
    assert response.status_code == 503, response.text
    assert response.headers["Retry-After"] == str(DATABASE_RETRY_AFTER_S)
    if page:  # the dashboard: the same problem as an HTML page
        assert response.headers["content-type"].startswith("text/html")
        assert "Database unavailable" in response.text and "the database is unavailable" in response.text
        return
    assert response.headers["content-type"] == PROBLEM_JSON
    body = response.json()
    assert body["type"].endswith("/database-unavailable") and body["status"] == 503
    assert "database is unavailable" in body["detail"] and "retry" in body["detail"]
    assert "isthmus:isthmus" not in response.text and "127.0.0.1" not in response.text  # no secret, no address


def jobs_with_key(app, key: str) -> int:
    from gateway.models.jobs import IdempotencyKey

    with app.state.sessionmaker() as s:
        return s.scalar(select(func.count()).select_from(IdempotencyKey).where(IdempotencyKey.key == key))


def test_a_postgres_outage_answers_503_with_retry_after_and_retries_record_once(outage_gateway,
                                                                                 own_postgres_server):
    client, app, token = outage_gateway
    first = client.post("/v1/jobs", json=SPEC, headers={"Idempotency-Key": "before-outage"})
    assert first.status_code == 202, first.text
    job_id = first.json()["id"]
    client.cookies.set(COOKIE, session_cookie(app, token))
    assert client.get("/ui/").status_code == 200

    stop_immediately(own_postgres_server)
    retried_key = f"during-outage-{uuid.uuid4().hex[:8]}"
    try:
        assert_outage(client.post(f"/v1/jobs/{job_id}/cancel"))
        assert_outage(client.post("/v1/jobs", json=SPEC, headers={"Idempotency-Key": retried_key}))
        assert_outage(client.post("/v1/jobs", json=SPEC, headers={"Idempotency-Key": "before-outage"}))
        with ThreadPoolExecutor(4) as threads:  # submissions at once: one group commit's batch
            for answer in threads.map(lambda i: client.post("/v1/jobs", json=SPEC, headers={
                    "Idempotency-Key": f"{retried_key}-{i}"}), range(4)):
                assert_outage(answer)
        assert_outage(client.get("/v1/jobs"))
        assert_outage(client.get(f"/v1/jobs/{job_id}"))
        assert_outage(client.get("/ui/"), page=True)
        assert_outage(client.get(f"/ui/jobs/{job_id}"), page=True)
    finally:
        own_postgres_server.run("up")

    # Back: the same requests succeed, and what was retried is recorded once.
    again = client.post("/v1/jobs", json=SPEC, headers={"Idempotency-Key": retried_key})
    assert again.status_code == 202, again.text
    replay = client.post("/v1/jobs", json=SPEC, headers={"Idempotency-Key": retried_key})
    assert replay.status_code == 200 and replay.json()["id"] == again.json()["id"]
    before = client.post("/v1/jobs", json=SPEC, headers={"Idempotency-Key": "before-outage"})
    assert before.status_code == 200 and before.json()["id"] == job_id
    assert jobs_with_key(app, retried_key) == 1 and jobs_with_key(app, "before-outage") == 1
    assert all(jobs_with_key(app, f"{retried_key}-{i}") == 0 for i in range(4))  # refused: never recorded
    cancelled = client.post(f"/v1/jobs/{job_id}/cancel")
    assert cancelled.status_code in (200, 202), cancelled.text
    assert client.get(f"/v1/jobs/{job_id}").json()["state"] == "cancelled"
    listed = client.get("/v1/jobs")
    assert listed.status_code == 200 and {j["id"] for j in listed.json()["items"]} == {job_id, again.json()["id"]}
    assert client.get("/ui/").status_code == 200


def test_an_error_that_is_not_an_outage_is_still_a_500(outage_gateway):
    """A statement the server refuses (here: a missing table) is a bug, not an outage: 500, no Retry-After."""
    from sqlalchemy import text

    client, app, _ = outage_gateway

    @app.get("/v1/test-broken-statement")
    def _broken() -> None:
        with app.state.sessionmaker() as s:
            s.execute(text("SELECT * FROM no_such_table"))

    r = TestClient(app, raise_server_exceptions=False, headers=client.headers).get("/v1/test-broken-statement")
    assert r.status_code == 500 and "Retry-After" not in r.headers
    assert r.json()["type"].endswith("/internal")
