"""`isthmus submit` with arrays, sweeps and a step-named pipeline; `isthmus jobs --set` (in-process gateway)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from gateway import cli_client
from gateway.cli import main


@pytest.fixture
def run(gw, monkeypatch):
    def init(self, url, token):
        self.http = gw.client
        self.http.headers["Authorization"] = f"Bearer {gw.token()}"

    monkeypatch.setattr(cli_client.Client, "__init__", init)

    def invoke(*args):
        result = CliRunner().invoke(main, list(args), catch_exceptions=False)
        return result
    yield invoke
    gw.client.headers.pop("Authorization", None)


PIPELINE = """
defaults: {account: team-a, time_limit: 10m, gpus_per_worker: 1}
steps:
  - name: preprocess
    backend: slurm
    command: [python, prep.py]
  - name: train
    backend: kubernetes
    command: [python, train.py, --lr, "{{ lr }}"]
    sweep: {lr: [0.1, 0.01]}
    depends_on: [{step: preprocess}]
  - name: evaluate
    backend: slurm
    command: [python, eval.py]
    depends_on: [{step: train, condition: finished}]
"""


def test_pipeline_file_resolves_step_names(run, gw, tmp_path):
    path = tmp_path / "pipeline.yaml"
    path.write_text(PIPELINE)
    r = run("submit", str(path), "--json")
    assert r.exit_code == 0, r.output
    steps = {s["step"]: s for s in json.loads(r.output)}
    assert [steps[n]["kind"] for n in ("preprocess", "train", "evaluate")] == ["job", "sweep", "job"]
    h = gw.headers()
    train_tasks = gw.client.get(f"/v1/job-sets/{steps['train']['id']}/tasks", headers=h).json()["items"]
    assert [t["state"] for t in train_tasks] == ["blocked", "blocked"]
    assert train_tasks[0]["state_reason"] == f"waiting for job {steps['preprocess']['id']} to be succeeded"
    evaluate = gw.client.get(f"/v1/jobs/{steps['evaluate']['id']}", headers=h).json()
    assert evaluate["state"] == "blocked"
    assert evaluate["depends_on"][0]["job_set"] == steps["train"]["id"]
    assert evaluate["depends_on"][0]["condition"] == "finished"

    listed = run("jobs", "--set", steps["train"]["id"])
    assert listed.exit_code == 0, listed.output
    header, *rows = listed.output.splitlines()
    assert header.split()[:3] == ["INDEX", "ID", "STATE"]
    assert len(rows) == 2 and "lr=0.1" in rows[0] and "lr=0.01" in rows[1]

    cancelled = run("cancel", "--cascade", steps["preprocess"]["id"])
    assert cancelled.exit_code == 0, cancelled.output
    assert gw.client.get(f"/v1/jobs/{steps['evaluate']['id']}", headers=h).json()["state"] == "cancelled"


def test_pipeline_step_may_only_name_an_earlier_step(run, tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("steps:\n  - {name: a, account: team-a, command: [true], depends_on: [{step: b}]}\n"
                    "  - {name: b, account: team-a, command: [true]}\n")
    r = run("submit", str(path))
    assert r.exit_code != 0 and "no step 'b' before 'a'" in r.output


def test_array_file_and_refusal_names_the_field(run, tmp_path):
    path = tmp_path / "a.yaml"
    path.write_text("name: shards\naccount: team-a\ncommand: [echo, '{{ index }}']\narray: {count: 3, max_running: 1}\n")
    r = run("submit", str(path))
    assert r.exit_code == 0, r.output
    assert "3 tasks (2 blocked, 1 pending)" in r.output
    path.write_text("name: s\naccount: team-a\ncommand: [echo, '{{ lr }}']\nsweep: {learning_rate: [1]}\n")
    r = run("submit", str(path))
    assert r.exit_code != 0 and "422" in r.output and "body.command[1]" in r.output
