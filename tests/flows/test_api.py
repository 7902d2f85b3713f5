"""Arrays, sweeps and dependencies through the API, on SQLite and Postgres (issue #16)."""

from __future__ import annotations

from sqlalchemy import func, select

from gateway.domain.states import JobState
from gateway.jobs import service as jobs
from gateway.models.flows import JobDependency, JobSet
from gateway.models.jobs import Job, JobEvent
from gateway.models.ledger import LedgerEntry, Reservation

BASE = {"name": "t", "account": "team-a", "command": ["true"], "gpus_per_worker": 1, "time_limit": "10m"}


def post(gw, path, body, user="alice", groups=("team-a",)):
    return gw.client.post(path, json=body, headers=gw.headers(user, groups))


def get(gw, path, user="alice", groups=("team-a",)):
    r = gw.client.get(path, headers=gw.headers(user, groups))
    assert r.status_code == 200, r.text
    return r.json()


def rows(gw, model) -> int:
    with gw.session() as s:
        return s.scalar(select(func.count()).select_from(model))


def finish(gw, job_id: str, target: JobState) -> None:
    """Walk a job to ``target`` through the state machine, as the dispatcher would."""
    from gateway.kit.timeutil import utcnow

    order = [JobState.PENDING, JobState.DISPATCHING, JobState.QUEUED, JobState.RUNNING]
    with gw.session() as s, s.begin():
        job = s.get(Job, job_id)
        assert job.state != JobState.BLOCKED.value, "a blocked job is never dispatched"
        for step in order[order.index(JobState(job.state)) + 1:] + ([] if target is JobState.RUNNING else [target]):
            if step is JobState.RUNNING:
                job.started_at = utcnow()
            jobs.set_state(s, job, step, actor="test")


def test_array_tasks_are_jobs_with_their_index(gw):
    r = post(gw, "/v1/job-sets", {**BASE, "command": ["echo", "{{ index }}"], "array": {"count": 5}})
    assert r.status_code == 202, r.text
    js = r.json()
    assert js["kind"] == "array" and js["task_count"] == 5 and js["counts"] == {"pending": 5}
    assert r.headers["location"] == f"/v1/job-sets/{js['id']}"
    tasks = get(gw, f"/v1/job-sets/{js['id']}/tasks")["items"]
    assert [t["array_index"] for t in tasks] == [0, 1, 2, 3, 4]
    assert len({t["id"] for t in tasks}) == 5
    for t in tasks:
        assert t["command"] == ["echo", str(t["array_index"])]
        assert t["env"]["ISTHMUS_ARRAY_INDEX"] == str(t["array_index"]) and t["env"]["ISTHMUS_ARRAY_COUNT"] == "5"
        assert t["job_set_id"] == js["id"]
        events = get(gw, f"/v1/jobs/{t['id']}/events")["items"]
        assert [(e["to_state"], e["reason"]) for e in events] == [("pending", "submitted")]
    listed = get(gw, f"/v1/jobs?job_set={js['id']}")["items"]
    assert sorted(t["id"] for t in listed) == sorted(t["id"] for t in tasks)


def test_max_running_keeps_the_rest_blocked_and_hands_slots_over(gw):
    js = post(gw, "/v1/job-sets", {**BASE, "array": {"count": 5, "max_running": 2}}).json()
    assert js["counts"] == {"pending": 2, "blocked": 3}
    tasks = get(gw, f"/v1/job-sets/{js['id']}/tasks")["items"]
    assert [t["state"] for t in tasks] == ["pending", "pending", "blocked", "blocked", "blocked"]
    assert tasks[2]["state_reason"] == "waiting for a free slot (max_running 2)"
    finish(gw, tasks[0]["id"], JobState.RUNNING)
    assert get(gw, f"/v1/job-sets/{js['id']}")["counts"] == {"running": 1, "pending": 1, "blocked": 3}
    finish(gw, tasks[0]["id"], JobState.SUCCEEDED)
    states = [t["state"] for t in get(gw, f"/v1/job-sets/{js['id']}/tasks")["items"]]
    assert states == ["succeeded", "pending", "pending", "blocked", "blocked"]
    finish(gw, tasks[1]["id"], JobState.FAILED)
    finish(gw, tasks[2]["id"], JobState.SUCCEEDED)
    states = [t["state"] for t in get(gw, f"/v1/job-sets/{js['id']}/tasks")["items"]]
    assert states == ["succeeded", "failed", "succeeded", "pending", "pending"]


def test_sweep_renders_each_point_without_a_shell(gw):
    body = {**BASE, "command": ["python", "train.py", "--lr={{ lr }}", "{{batch}}", "; rm -rf / {{ lr }}"],
            "env": {"LR": "{{ lr }}", "TAG": "b{{ batch }}-{{ index }}"},
            "sweep": {"lr": [0.001, 0.01], "batch": [32, 64, 128]}}
    r = post(gw, "/v1/job-sets", body)
    assert r.status_code == 202, r.text
    js = r.json()
    assert js["kind"] == "sweep" and js["task_count"] == 6
    tasks = get(gw, f"/v1/job-sets/{js['id']}/tasks")["items"]
    seen = set()
    for t in tasks:
        lr, batch = t["parameters"]["lr"], t["parameters"]["batch"]
        seen.add((lr, batch))
        assert t["command"] == ["python", "train.py", f"--lr={lr}", batch, f"; rm -rf / {lr}"]
        assert t["env"]["LR"] == lr and t["env"]["TAG"] == f"b{batch}-{t['array_index']}"
    assert seen == {(lr, b) for lr in ("0.001", "0.01") for b in ("32", "64", "128")}


def test_dependencies_block_then_release_in_order(gw):
    a = post(gw, "/v1/jobs", {**BASE, "name": "pre"}).json()
    b = post(gw, "/v1/jobs", {**BASE, "name": "train", "depends_on": [{"job": a["id"]}]}).json()
    c = post(gw, "/v1/jobs", {**BASE, "name": "eval", "depends_on": [{"job": b["id"], "condition": "succeeded"}]}
             ).json()
    assert (b["state"], c["state"]) == ("blocked", "blocked")
    assert b["state_reason"] == f"waiting for job {a['id']} to be succeeded"
    got = get(gw, f"/v1/jobs/{b['id']}")
    assert got["depends_on"] == [{"job": a["id"], "job_set": None, "condition": "succeeded", "state": "pending",
                                  "met": False}]
    assert got["dependents"] == [c["id"]]
    assert get(gw, f"/v1/jobs/{a['id']}")["dependents"] == [b["id"]]
    finish(gw, a["id"], JobState.SUCCEEDED)
    assert get(gw, f"/v1/jobs/{b['id']}")["state"] == "pending"
    assert get(gw, f"/v1/jobs/{c['id']}")["state"] == "blocked"
    events = get(gw, f"/v1/jobs/{b['id']}/events")["items"]
    assert [(e["from_state"], e["to_state"]) for e in events] == [(None, "blocked"), ("blocked", "pending")]
    finish(gw, b["id"], JobState.SUCCEEDED)
    assert get(gw, f"/v1/jobs/{c['id']}")["state"] == "pending"


def test_failed_dependency_cancels_the_chain_with_the_reason(gw):
    a = post(gw, "/v1/jobs", BASE).json()
    b = post(gw, "/v1/jobs", {**BASE, "depends_on": [{"job": a["id"]}]}).json()
    c = post(gw, "/v1/jobs", {**BASE, "depends_on": [{"job": b["id"]}]}).json()
    d = post(gw, "/v1/jobs", {**BASE, "depends_on": [{"job": a["id"], "condition": "failed"}]}).json()
    finish(gw, a["id"], JobState.FAILED)
    got_b, got_c = get(gw, f"/v1/jobs/{b['id']}"), get(gw, f"/v1/jobs/{c['id']}")
    assert got_b["state"] == "cancelled"
    assert got_b["state_reason"] == f"cancelled: dependency job {a['id']} can no longer be succeeded"
    assert got_c["state"] == "cancelled"
    assert got_c["state_reason"] == f"cancelled: dependency job {b['id']} can no longer be succeeded"
    assert get(gw, f"/v1/jobs/{d['id']}")["state"] == "pending"


def test_started_and_finished_conditions_and_whole_set_dependency(gw):
    a = post(gw, "/v1/jobs", BASE).json()
    s = post(gw, "/v1/job-sets", {**BASE, "array": {"count": 3}}).json()
    started = post(gw, "/v1/jobs", {**BASE, "depends_on": [{"job": a["id"], "condition": "started"}]}).json()
    after_set = post(gw, "/v1/jobs", {**BASE, "depends_on": [{"job_set": s["id"], "condition": "finished"}]}).json()
    finish(gw, a["id"], JobState.RUNNING)
    assert get(gw, f"/v1/jobs/{started['id']}")["state"] == "pending"
    tasks = get(gw, f"/v1/job-sets/{s['id']}/tasks")["items"]
    finish(gw, tasks[0]["id"], JobState.SUCCEEDED)
    finish(gw, tasks[1]["id"], JobState.FAILED)
    assert get(gw, f"/v1/jobs/{after_set['id']}")["state"] == "blocked"
    r = gw.client.post(f"/v1/jobs/{tasks[2]['id']}/cancel", headers=gw.headers())
    assert r.json()["state"] == "cancelled"
    assert get(gw, f"/v1/jobs/{after_set['id']}")["state"] == "pending"


def test_blocked_jobs_reserve_nothing_and_are_never_picked(gw):
    from gateway.dispatch import pending_order
    from gateway.kit.timeutil import utcnow

    a = post(gw, "/v1/jobs", BASE).json()
    post(gw, "/v1/job-sets", {**BASE, "array": {"count": 20}, "depends_on": [{"job": a["id"]}]})
    with gw.session() as s:
        picked = pending_order(s, now=utcnow(), limit=100, lock=False, factors={})
        assert [j.id for j in picked] == [a["id"]]
        assert s.scalar(select(func.count()).select_from(Reservation)) == 0
        assert s.scalar(select(func.count()).select_from(LedgerEntry)) == 0
        assert s.scalar(select(func.count()).select_from(Job).where(Job.state == "blocked")) == 20


def test_cancel_cascade_only_when_asked(gw):
    a = post(gw, "/v1/jobs", BASE).json()
    fin = post(gw, "/v1/jobs", {**BASE, "depends_on": [{"job": a["id"], "condition": "finished"}]}).json()
    r = gw.client.post(f"/v1/jobs/{a['id']}/cancel", headers=gw.headers())
    assert r.status_code == 202
    assert get(gw, f"/v1/jobs/{fin['id']}")["state"] == "pending"  # finished: a cancel is an end
    b = post(gw, "/v1/jobs", BASE).json()
    fin2 = post(gw, "/v1/jobs", {**BASE, "depends_on": [{"job": b["id"], "condition": "finished"}]}).json()
    fin3 = post(gw, "/v1/jobs", {**BASE, "depends_on": [{"job": fin2["id"], "condition": "finished"}]}).json()
    r = gw.client.post(f"/v1/jobs/{b['id']}/cancel?cascade=true", headers=gw.headers())
    assert r.status_code == 202
    assert get(gw, f"/v1/jobs/{fin2['id']}")["state"] == "cancelled"
    assert get(gw, f"/v1/jobs/{fin3['id']}")["state"] == "cancelled"


def test_cancel_set(gw):
    js = post(gw, "/v1/job-sets", {**BASE, "array": {"count": 6, "max_running": 2}}).json()
    tasks = get(gw, f"/v1/job-sets/{js['id']}/tasks")["items"]
    finish(gw, tasks[0]["id"], JobState.RUNNING)
    r = gw.client.post(f"/v1/job-sets/{js['id']}/cancel", headers=gw.headers())
    assert r.status_code == 202, r.text
    assert r.json()["counts"] == {"cancelling": 1, "cancelled": 5}


def test_sets_and_dependencies_respect_tenancy(gw):
    other = post(gw, "/v1/jobs", {**BASE, "account": "team-b"}, user="bob", groups=("team-b",)).json()
    other_set = post(gw, "/v1/job-sets", {**BASE, "account": "team-b", "array": {"count": 2}}, user="bob",
                     groups=("team-b",)).json()
    assert gw.client.get(f"/v1/job-sets/{other_set['id']}", headers=gw.headers()).status_code == 404
    assert gw.client.post(f"/v1/job-sets/{other_set['id']}/cancel", headers=gw.headers()).status_code == 404
    r = post(gw, "/v1/jobs", {**BASE, "depends_on": [{"job": other["id"]}]})
    assert r.status_code == 422
    assert r.json()["errors"][0]["field"] == "body.depends_on[0].job"


def _bad_cases(gw):
    done = post(gw, "/v1/jobs", BASE).json()
    finish(gw, done["id"], JobState.FAILED)
    other = post(gw, "/v1/jobs", {**BASE, "account": "team-b"}, user="bob", groups=("team-b",)).json()
    unknown = "0192f0c4-7d3e-7a51-8c3e-5b1f0d9a2c44"
    return [
        ("/v1/job-sets", {**BASE, "array": {"count": 0}}, "body.array.count"),
        ("/v1/job-sets", {**BASE, "array": {"count": 10001}}, "body.array.count"),
        ("/v1/job-sets", {**BASE, "array": {"count": 2, "max_running": 0}}, "body.array.max_running"),
        ("/v1/job-sets", {**BASE, "sweep": {"a": list(range(40)), "b": list(range(30))}}, "body.sweep"),
        ("/v1/job-sets", {**BASE, "sweep": {"a": []}}, "body.sweep"),
        ("/v1/job-sets", {**BASE, "sweep": {"a b": [1]}}, "body.sweep"),
        ("/v1/job-sets", {**BASE, "array": {"count": 2}, "sweep": {"a": [1]}}, "body"),
        ("/v1/job-sets", BASE, "body"),
        ("/v1/job-sets", {**BASE, "command": ["x", "{{ lr }}"], "sweep": {"learning_rate": [1]}}, "body.command[1]"),
        ("/v1/job-sets", {**BASE, "env": {"LR": "{{ lr }}"}, "sweep": {"learning_rate": [1]}}, "body.env.LR"),
        ("/v1/job-sets", {**BASE, "command": ["{{ x }}"], "array": {"count": 2}}, "body.command[0]"),
        ("/v1/jobs", {**BASE, "depends_on": [{"job": unknown}]}, "body.depends_on[0].job"),
        ("/v1/jobs", {**BASE, "depends_on": [{"job": other["id"]}]}, "body.depends_on[0].job"),
        ("/v1/jobs", {**BASE, "depends_on": [{"job_set": unknown}]}, "body.depends_on[0].job_set"),
        ("/v1/jobs", {**BASE, "depends_on": [{"job": done["id"]}]}, "body.depends_on[0]"),
        ("/v1/jobs", {**BASE, "depends_on": [{"job": "not-an-id"}]}, "body.depends_on.0.job"),
        ("/v1/jobs", {**BASE, "depends_on": [{"job": unknown, "condition": "maybe"}]}, "body.depends_on.0.condition"),
        ("/v1/job-sets", {**BASE, "array": {"count": 3}, "depends_on": [{"job": other["id"]}]},
         "body.depends_on[0].job"),
    ]


def test_bad_input_is_422_naming_the_field_and_writes_nothing(gw):
    cases = _bad_cases(gw)
    before = (rows(gw, Job), rows(gw, JobEvent), rows(gw, JobSet), rows(gw, JobDependency))
    for path, body, field in cases:
        r = post(gw, path, body)
        assert r.status_code == 422, (body, r.text)
        assert r.headers["content-type"].startswith("application/problem+json")
        fields = [e["field"] for e in r.json()["errors"]]
        assert any(f == field or f.startswith(field + ".") or (field == "body" and f == "body") for f in fields), \
            (field, r.json())
    assert (rows(gw, Job), rows(gw, JobEvent), rows(gw, JobSet), rows(gw, JobDependency)) == before


def test_an_array_counts_each_task_against_the_caps(gw):
    limit = gw.settings.max_pending_jobs_per_user
    r = post(gw, "/v1/job-sets", {**BASE, "array": {"count": limit + 1}})
    assert r.status_code in (422, 429), r.text
    assert rows(gw, Job) == 0


def test_a_set_whose_tasks_exceed_max_gpus_is_refused_like_the_same_single_job(gw):
    # Issue #28: the set path skipped the never-admissible check, so a set of 4-GPU tasks under a
    # 2-GPU max_gpus was accepted and its tasks waited forever, while the single job got a 422.
    admin = gw.headers("root", (), admin=True)
    r = gw.client.put("/v1/admin/accounts/team-a/quota", json={"max_gpus": 2}, headers=admin)
    assert r.status_code == 200, r.text
    task = {**BASE, "gpus_per_worker": 4}
    single = post(gw, "/v1/jobs", task)
    array = post(gw, "/v1/job-sets", {**task, "array": {"count": 3}})
    sweep = post(gw, "/v1/job-sets", {**task, "command": ["echo", "{{ lr }}"], "sweep": {"lr": ["1", "2"]}})
    for r in (single, array, sweep):
        assert r.status_code == 422, r.text
        problem = r.json()
        assert problem["errors"][0]["field"] == "body.workers", problem
        assert "max_gpus = 2" in problem["errors"][0]["message"], problem
    assert rows(gw, JobSet) == 0 and rows(gw, Job) == 0
    # Within the limit the same set is accepted.
    assert post(gw, "/v1/job-sets", {**BASE, "gpus_per_worker": 2, "array": {"count": 3}}).status_code == 202
