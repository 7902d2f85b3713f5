"""The `isthmus` CLI against a running gateway."""

from __future__ import annotations

import json


def test_cli_submit_list_show_cancel(running_gateway, tmp_path):
    token = running_gateway.token()
    spec = tmp_path / "job.yaml"
    spec.write_text("name: cli-job\naccount: team-a\ncommand: [python, train.py, --lr, '3e-4']\n"
                    "workers: 2\ngpus_per_worker: 8\nmemory_per_worker: 32Gi\ntime_limit: 30m\n")
    r = running_gateway.cli("submit", str(spec), "--json", token=token)
    assert r.returncode == 0, r.stderr
    job = json.loads(r.stdout)
    assert job["state"] == "pending" and job["time_limit_s"] == 1800

    table = running_gateway.cli("jobs", token=token)
    assert table.returncode == 0
    header, *rows = table.stdout.splitlines()
    assert header.split()[:5] == ["ID", "NAME", "ACCOUNT", "USER", "STATE"]
    assert any(row.startswith(job["id"]) and "cli-job" in row and "pending" in row for row in rows)

    show = running_gateway.cli("job", job["id"], "--events", token=token)
    assert show.returncode == 0 and "cli-job" in show.stdout and "submitted" in show.stdout

    cancel = running_gateway.cli("cancel", job["id"], token=token)
    assert cancel.returncode == 0 and "cancelled" in cancel.stdout


def test_cli_reports_problems_readably(running_gateway, tmp_path):
    spec = tmp_path / "bad.json"
    spec.write_text(json.dumps({"name": "bad", "account": "team-a", "command": [], "workers": 0}))
    r = running_gateway.cli("submit", str(spec), token=running_gateway.token())
    assert r.returncode != 0
    assert "422" in r.stderr and "body.workers" in r.stderr and "body.command" in r.stderr
    r = running_gateway.cli("jobs")  # no token
    assert r.returncode != 0 and "401" in r.stderr


def test_cli_token_needs_dev_mode(running_gateway):
    env_off = {k: v for k, v in running_gateway.env.items() if k != "ISTHMUS_DEV_MODE"}
    import subprocess

    from tests.e2e.conftest import ISTHMUS
    r = subprocess.run([ISTHMUS, "token", "--user", "alice"], env=env_off, capture_output=True, text=True)
    assert r.returncode != 0 and "ISTHMUS_DEV_MODE" in r.stderr
