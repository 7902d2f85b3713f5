"""One job and the list read as statements built once (gateway/jobs/reads.py, issue #46): a user
sees what the models' path answered, byte for byte, and a job tied to others still shows them."""

from __future__ import annotations

from gateway.api import jobs as api_jobs
from gateway.jobs.responses import JobOut
from gateway.kit import db
from gateway.kit.unicode import JSONResponse
from gateway.models.jobs import Job
from gateway.models.specs import checkpoint_dir_of
from tests.jobs.test_api import SPEC, submit


def _model_bytes(gw, job_id: str) -> bytes:
    """What getJob answered through JobOut for a job with no dependency, attempt or preemption."""
    with gw.session() as s:
        job = s.get(Job, job_id)
        out = api_jobs.to_out(job)
        out.checkpoint_dir = checkpoint_dir_of(job, getattr(gw.app.state, "storage", None))
    return JSONResponse(out.model_dump(mode="json")).body


def test_one_job_is_the_models_json_byte_for_byte(gw):
    ids = [submit(gw, {**SPEC, "env": {"A": "é", "B": "x"}, "labels": {"team": "a"}}).json()["id"],
           submit(gw, {**SPEC, "name": "plain"}).json()["id"]]
    with gw.session() as s:
        s.query(Job).filter(Job.id == ids[1]).update({"state": "succeeded", "exit_code": 0, "nodes": ["n1", "n2"]},
                                                     synchronize_session=False)
        s.commit()
    for job_id in ids:
        r = gw.client.get(f"/v1/jobs/{job_id}", headers=gw.headers())
        assert r.status_code == 200 and r.headers["content-type"] == "application/json"
        assert r.content == _model_bytes(gw, job_id)


def test_a_submission_answers_the_models_json_byte_for_byte(gw):
    """submitJob writes its answer as getJob does (issue #46): the same bytes as through JobOut,
    202 with Location, and the same body again on a replay of its Idempotency-Key (200)."""
    spec = {**SPEC, "env": {"A": "é", "B": "x"}, "labels": {"team": "a"}}
    first = submit(gw, spec, headers={"Idempotency-Key": "same-bytes-1"})
    assert first.status_code == 202 and first.headers["content-type"] == "application/json"
    job_id = first.json()["id"]
    assert first.headers["location"] == f"/v1/jobs/{job_id}"
    # the bytes FastAPI wrote through JobOut for these values, and the values of the job as stored
    assert first.content == JSONResponse(JobOut(**first.json()).model_dump(mode="json")).body
    assert first.content == _model_bytes(gw, job_id)
    again = submit(gw, spec, headers={"Idempotency-Key": "same-bytes-1"})
    assert again.status_code == 200 and again.headers["location"] == f"/v1/jobs/{job_id}"
    assert again.content == _model_bytes(gw, job_id)


def test_a_job_tied_to_others_still_shows_them(gw):
    a = submit(gw).json()["id"]
    b = submit(gw, {**SPEC, "depends_on": [{"job": a}]}).json()["id"]
    got_a = gw.client.get(f"/v1/jobs/{a}", headers=gw.headers()).json()
    got_b = gw.client.get(f"/v1/jobs/{b}", headers=gw.headers()).json()
    assert got_a["dependents"] == [b] and got_a["depends_on"] is None
    assert got_b["dependents"] is None and [d["job"] for d in got_b["depends_on"]] == [a]


def test_another_accounts_job_is_not_found_and_not_listed(gw):
    theirs = submit(gw, {**SPEC, "account": "team-b"}, user="bob", groups=("team-b",)).json()["id"]
    r = gw.client.get(f"/v1/jobs/{theirs}", headers=gw.headers())
    assert r.status_code == 404 and r.json()["detail"] == f"no job {theirs!r} visible to you"
    listed = gw.client.get("/v1/jobs?limit=500", headers=gw.headers()).json()["items"]
    assert theirs not in {j["id"] for j in listed}


def test_on_postgres_the_reads_are_sent_as_compiled_text(gw):
    """The raw path is the one these tests run on Postgres (SQLite runs the statement object)."""
    submit(gw)
    assert gw.client.get("/v1/jobs?limit=5", headers=gw.headers()).status_code == 200
    with gw.session() as s:
        postgres = s.get_bind().dialect.name == "postgresql"
    made = [r for (dialect, _driver, key), r in db._READS.items()
            if dialect == ("postgresql" if postgres else "sqlite") and key[0] == "list"]
    assert made and all((r.sql is not None) == postgres for r in made)
