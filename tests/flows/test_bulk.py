"""The bulk path of a job set: each task reads back as the per-task code would have written it.

``create_set`` stores the set's spec once and writes the tasks' rows (their own values only)
as COPY text built by hand (gateway/flows/service.py, for bench/bench_arrays.py); a task's
full spec is rendered on read (gateway/models/specs.py). These tests hold both to the plain
per-task rendering, with the characters that need escaping in JSON or in COPY's text
format, on SQLite and Postgres.
"""

from __future__ import annotations

import json

import pytest
from sqlalchemy import select

from gateway.domain import templates
from gateway.flows import service
from gateway.flows.schemas import JobSetSpec
from gateway.kit import bulk
from gateway.kit.timeutil import new_id, new_ids
from gateway.models import specs
from gateway.models.flows import JobSet
from gateway.models.jobs import Job, JobEvent

AWKWARD = ["plain", "tab\there", "new\nline", "cr\rhere", "back\\slash", 'quote"d', "é ü 😀", "{{ index }}", "\\N",
           "a\u2028b", "x" * 300]


def expected_spec(spec: JobSetSpec, values: dict[str, str], count: int) -> dict:
    """The task's spec as the per-task code built it before the bulk path."""
    base = spec.job_spec()
    command = [templates.render(arg, values) for arg in base.command]
    env = {**{k: templates.render(v, values) for k, v in base.env.items()},
           "ISTHMUS_ARRAY_INDEX": values["index"], "ISTHMUS_ARRAY_COUNT": str(count)}
    task = {**base.stored(), "command": command, "env": env}
    if spec.sweep is not None:
        task["parameters"] = {k: v for k, v in values.items() if k != "index"}
    return task


SPECS = [
    {"command": ["echo", "{{ index }}", "--x={{index}}-{{  index  }}", "{{\tindex }}"], "array": {"count": 12},
     "env": {"A": "i={{ index }}", "B": "tab\tand \\ and \"q\"", "C": "é"}},
    {"command": ["run", "--lr", "{{ lr }}", "{{ name }}/{{ index }}", "{{ lr }}{{ lr }}"],
     "env": {"NAME": "{{ name }}", "K": "{{ flag }}"},
     "sweep": {"lr": [0.001, 3, 1e-05], "name": AWKWARD, "flag": [True, False]}},
    {"command": ["true"], "array": {"count": 3}, "labels": {"team": "a"}},
]


@pytest.mark.parametrize("extra", SPECS)
def test_a_template_renders_each_task_as_the_per_task_code(extra):
    spec = JobSetSpec.model_validate({"name": "t", "account": "team-a", "gpus_per_worker": 1, **extra})
    combos = service.expand(spec, max_tasks=100, max_points=1000)
    template = templates.Template(spec.job_spec().stored(), len(combos))
    names = service.names_of(spec)
    for i, values in enumerate(combos):
        own = {"parameters": {k: values[k] for k in names}} if names else {}
        rendered = template.render(json.loads(json.dumps(own)), i)
        assert json.dumps(rendered) == json.dumps(expected_spec(spec, values, len(combos)))  # key order too


def test_copy_text_escapes_what_copy_reads_specially():
    assert bulk._copy_text("a\tb\nc\rd\\e") == "a\\tb\\nc\\rd\\\\e"
    assert bulk._copy_text("\\N") == "\\\\N"  # a string, not NULL
    assert bulk._copy_text(None) == "\\N"
    assert bulk._copy_text({"k": "v\n"}, True) == '{"k": "v\\\\n"}'
    assert bulk._copy_text(7) == "7" and bulk._copy_text(True) == "t"


def test_new_ids_are_unique_and_strictly_increasing_past_4096_per_millisecond():
    ids = [new_id()] + new_ids(20_000) + [new_id()]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)


def test_a_set_with_awkward_values_is_stored_exactly(gw):
    body = {"name": "t", "account": "team-a", "gpus_per_worker": 1, "time_limit": "10m", **SPECS[1]}
    r = gw.client.post("/v1/job-sets", json=body, headers=gw.headers())
    assert r.status_code == 202, r.text
    spec = JobSetSpec.model_validate(body)
    combos = service.expand(spec, max_tasks=100, max_points=1000)
    assert len(combos) == 3 * len(AWKWARD) * 2
    with gw.session() as s:
        tasks = s.scalars(select(Job).where(Job.job_set_id == r.json()["id"]).order_by(Job.array_index)).all()
        assert [t.array_index for t in tasks] == list(range(len(combos)))
        assert [t.id for t in tasks] == sorted(t.id for t in tasks)  # ids in submission (index) order
        template = s.get(JobSet, r.json()["id"]).spec
        assert template == spec.job_spec().stored()  # the spec, once
        for task, values in zip(tasks, combos, strict=True):
            assert task.spec == {"parameters": {k: values[k] for k in ("lr", "name", "flag")}}  # its own values
            assert specs.spec_of(task) == expected_spec(spec, values, len(combos))
            assert (task.state, task.time_limit_s, task.username, task.requested_pool, task.total_gpus) == (
                "pending", 600, "alice", "auto", 1)
        events = {e.job_id: e for e in s.scalars(select(JobEvent).where(JobEvent.job_id.in_([t.id for t in tasks])))}
        assert len(events) == len(tasks)
        for task in tasks:
            e = events[task.id]
            assert (e.kind, e.from_state, e.to_state, e.reason) == ("state", None, "pending", "submitted")
            assert e.data == {"job_set": task.job_set_id, "array_index": task.array_index}
            assert e.at == task.created_at


def test_max_running_and_states_survive_the_bulk_path(gw):
    body = {"name": "t", "account": "team-a", "gpus_per_worker": 1, "command": ["x", "{{ index }}"],
            "array": {"count": 7, "max_running": 3}}
    r = gw.client.post("/v1/job-sets", json=body, headers=gw.headers())
    assert r.status_code == 202, r.text
    with gw.session() as s:
        tasks = s.scalars(select(Job).where(Job.job_set_id == r.json()["id"]).order_by(Job.array_index)).all()
        assert [t.state for t in tasks] == ["pending"] * 3 + ["blocked"] * 4
        assert all(t.state_reason == "waiting for a free slot (max_running 3)" for t in tasks[3:])
        to_states = dict(s.execute(select(JobEvent.job_id, JobEvent.to_state)
                                   .where(JobEvent.job_id.in_([t.id for t in tasks]))).all())
        assert [to_states[t.id] for t in tasks] == ["pending"] * 3 + ["blocked"] * 4
