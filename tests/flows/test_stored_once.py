"""Issue #27 finding 3: a job set's spec is stored once, not once per task.

A 100-task array whose spec carries ~250 KB of env used to write that spec into every
task's row (25 MB for one request). Now the set keeps it once and each task only its own
values; every reader (the API, the dispatcher's submission, the ledger, the UI) gets the
task's full spec rendered. Tasks written before keep their full spec and read as before.
"""

from __future__ import annotations

from sqlalchemy import String, cast, func, null, select

from gateway.dispatch.common import submit_request
from gateway.kit.db import transaction
from gateway.models.flows import JobSet
from gateway.models.jobs import Job
from tests.flows.test_api import BASE, get, post

BIG_ENV = {f"V{i}": "x" * 4000 for i in range(64)}  # 256 KB, the largest env a job may carry is 512 KB


def _spec_bytes(gw, set_id: str) -> tuple[int, int]:
    """Bytes of job.spec over the set's tasks, and of the set's own spec."""
    with gw.session() as s:
        tasks = s.scalar(select(func.sum(func.length(cast(Job.spec, String)))).where(Job.job_set_id == set_id))
        once = s.scalar(select(func.length(cast(JobSet.spec, String))).where(JobSet.id == set_id))
    return tasks, once


def test_a_large_spec_is_stored_once_and_every_task_reads_whole(gw):
    body = {**BASE, "command": ["train", "--shard", "{{ index }}"], "env": {**BIG_ENV, "SHARD": "s{{ index }}"},
            "array": {"count": 100}}
    r = post(gw, "/v1/job-sets", body)
    assert r.status_code == 202, r.text
    set_id = r.json()["id"]
    tasks_bytes, once = _spec_bytes(gw, set_id)
    assert tasks_bytes <= 100 * 16, tasks_bytes  # was 100 x ~260 KB
    assert 256_000 < once < 300_000
    tasks = get(gw, f"/v1/job-sets/{set_id}/tasks")["items"]
    assert len(tasks) == 100
    for t in tasks[:3] + tasks[-2:]:
        i = t["array_index"]
        assert t["command"] == ["train", "--shard", str(i)]
        assert t["env"] == {**BIG_ENV, "SHARD": f"s{i}", "ISTHMUS_ARRAY_INDEX": str(i), "ISTHMUS_ARRAY_COUNT": "100"}
        assert (t["cpus_per_worker"], t["memory_per_worker"]) == (1, "4Gi")
    with gw.session() as s:  # what the dispatcher sends to the pool
        req = submit_request(s.get(Job, tasks[7]["id"]))
        assert req.command == ["train", "--shard", "7"] and req.env["SHARD"] == "s7" and req.env["V3"] == "x" * 4000


def test_a_sweep_task_keeps_only_its_values(gw):
    body = {**BASE, "command": ["run", "--lr={{ lr }}"], "env": {"BIG": "y" * 4000}, "gpu_type": "H100",
            "sweep": {"lr": [0.1, 0.01], "seed": [1, 2, 3]}}
    r = post(gw, "/v1/job-sets", body)
    assert r.status_code == 202, r.text
    with gw.session() as s:
        tasks = s.scalars(select(Job).where(Job.job_set_id == r.json()["id"]).order_by(Job.array_index)).all()
        assert [t.spec for t in tasks] == [{"parameters": {"lr": lr, "seed": seed}}
                                           for lr in ("0.1", "0.01") for seed in ("1", "2", "3")]
    out = get(gw, f"/v1/jobs/{tasks[4].id}")
    assert out["command"] == ["run", "--lr=0.01"] and out["parameters"] == {"lr": "0.01", "seed": "2"}
    assert out["gpu_type"] == "h100" and out["env"]["BIG"] == "y" * 4000


def test_tasks_written_before_read_as_they_were(gw):
    """A set from before the migration: no spec on the set, each task's full spec on its row."""
    r = post(gw, "/v1/job-sets", {**BASE, "command": ["old", "{{ index }}"], "array": {"count": 3}})
    set_id = r.json()["id"]
    before = get(gw, f"/v1/job-sets/{set_id}/tasks")["items"]
    with transaction(gw.app.state.sessionmaker) as s:
        from gateway.models.specs import spec_of

        tasks = s.scalars(select(Job).where(Job.job_set_id == set_id)).all()
        whole = {t.id: spec_of(t) for t in tasks}
        for t in tasks:
            t.spec = {**whole[t.id], "labels": {"era": "old"}}  # marked, to see it is the row that is read
        s.execute(JobSet.__table__.update().where(JobSet.id == set_id).values(spec=null()))  # SQL NULL
    after = get(gw, f"/v1/job-sets/{set_id}/tasks")["items"]
    assert [t["command"] for t in after] == [t["command"] for t in before] == [["old", "0"], ["old", "1"], ["old", "2"]]
    assert all(t["labels"] == {"era": "old"} for t in after)
