"""A listed job is the JSON of JobOut, key for key and in JobOut's order (issue #46).

The list no longer builds a model per row (gateway/api/jobs.py ``jobs_json``): it sends the
job's fields as read. A user must not see the difference: each listed job is what
``GET /v1/jobs/{id}`` answers for it, with the fields only getJob fills (``depends_on``,
``dependents``, ``attempts``, ``preemption``, ``checkpoint_dir``) null, as the model gave them;
for a single job, an array's task (its spec rendered from the set's), a sweep's (its
parameter values), a running job (its GPU-hours at risk) and a pending one with an
estimate.
"""

from __future__ import annotations

import json
from datetime import timedelta

from gateway.jobs.responses import JobOut
from gateway.kit.timeutil import utcnow
from gateway.models.jobs import Job
from tests.jobs.test_api import SPEC, submit

GET_JOB_ONLY = ("depends_on", "dependents", "attempts", "preemption", "checkpoint_dir")


def test_each_listed_job_is_its_getjob_json_in_jobout_order(gw):
    single = submit(gw, {**SPEC, "env": {"A": "é", "B": "x"}, "labels": {"team": "a"}}).json()["id"]
    running = submit(gw, SPEC).json()["id"]
    estimated = submit(gw, SPEC).json()["id"]
    r = gw.client.post("/v1/job-sets", json={"name": "arr", "account": "team-a", "command": ["echo", "{{ index }}"],
                                             "array": {"count": 2}}, headers=gw.headers())
    assert r.status_code in (200, 201, 202), r.text
    sweep = gw.client.post("/v1/job-sets", json={"name": "sw", "account": "team-a", "command": ["train", "{{ lr }}"],
                                                 "sweep": {"lr": [0.00005]}}, headers=gw.headers())
    assert sweep.status_code in (200, 201, 202), sweep.text
    now = utcnow()
    with gw.session() as s:
        s.query(Job).filter(Job.id == running).update(
            {"state": "running", "pool": "slurm", "held_gpus": 32, "started_at": now - timedelta(minutes=90),
             "checkpoint_at": now - timedelta(minutes=7), "borrowed": True, "nodes": ["n1", "n2"]},
            synchronize_session=False)
        s.query(Job).filter(Job.id == estimated).update(
            {"estimated_start": now + timedelta(hours=2), "estimated_pool": "slurm", "estimate_reason": "behind 2 jobs"},
            synchronize_session=False)
        s.commit()

    listed = gw.client.get("/v1/jobs?limit=500", headers=gw.headers())
    assert listed.status_code == 200 and listed.headers["content-type"] == "application/json"
    items = listed.json()["items"]
    assert {single, running, estimated} <= {j["id"] for j in items} and len(items) >= 5
    for item in items:
        assert list(item) == list(JobOut.model_fields)
        one = gw.client.get(f"/v1/jobs/{item['id']}", headers=gw.headers()).json()
        expected = {**one, **dict.fromkeys(GET_JOB_ONLY)}
        if item["id"] == running:  # its GPU-hours at risk grow between the two reads
            assert item["gpu_hours_at_risk"] > 0 and abs(item["gpu_hours_at_risk"] - one["gpu_hours_at_risk"]) < 0.01
            expected["gpu_hours_at_risk"] = item["gpu_hours_at_risk"]
        assert item == expected
    by_id = {j["id"]: j for j in items}
    assert by_id[estimated]["estimate_reason"] == "behind 2 jobs" and by_id[estimated]["estimated_pool"] == "slurm"
    assert by_id[single]["env"] == {"A": "é", "B": "x"}
    assert sorted(j["command"][1] for j in items if j["job_set_id"] and not j["parameters"]) == ["0", "1"]
    # The page is JSON as the app writes it: compact, non-ASCII as UTF-8, a sweep's values as stored.
    assert '"env":{"A":"é","B":"x"}' in listed.content.decode()
    assert '"parameters":{"lr":"5e-05"}' in listed.content.decode()
    assert listed.json() == json.loads(listed.content)


def test_a_listed_job_seen_before_is_what_it_is_now(gw):
    """The list keeps each job's JSON by the values it was made from: a job that changed is
    written anew, one that did not is the same bytes, and a running job's GPU-hours at risk
    are those of the moment."""
    first = submit(gw, SPEC).json()["id"]
    other = submit(gw, SPEC).json()["id"]
    before = gw.client.get("/v1/jobs", headers=gw.headers())
    assert gw.client.post(f"/v1/jobs/{first}/cancel", headers=gw.headers()).status_code == 202
    after = gw.client.get("/v1/jobs", headers=gw.headers())
    by_id = {j["id"]: j for j in after.json()["items"]}
    assert by_id[first]["state"] == "cancelled" and by_id[first]["ended_at"] is not None
    assert by_id[first] == {**gw.client.get(f"/v1/jobs/{first}", headers=gw.headers()).json(),
                            **dict.fromkeys(GET_JOB_ONLY)}
    assert by_id[other] == {j["id"]: j for j in before.json()["items"]}[other]
    assert gw.client.get("/v1/jobs", headers=gw.headers()).content == after.content
    with gw.session() as s:
        s.query(Job).filter(Job.id == other).update(
            {"state": "running", "pool": "slurm", "held_gpus": 32, "started_at": utcnow() - timedelta(hours=1)},
            synchronize_session=False)
        s.commit()
    risk = [{j["id"]: j for j in gw.client.get("/v1/jobs", headers=gw.headers()).json()["items"]}[other]
            ["gpu_hours_at_risk"] for _ in range(2)]
    assert 31.9 < risk[0] <= risk[1] < 33
