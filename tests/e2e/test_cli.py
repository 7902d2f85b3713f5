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


def _walk(cmd, path):
    import click

    if isinstance(cmd, click.Group):
        for name, sub in cmd.commands.items():
            yield from _walk(sub, [*path, name])
    else:
        yield path, cmd


def test_every_cli_option_has_help_and_client_commands_name_their_environment():
    """`isthmus <cmd> --help` explains every option; --url/--token name ISTHMUS_URL/ISTHMUS_TOKEN (#14, 7)."""
    import subprocess

    import click

    from gateway.cli import main
    from tests.e2e.conftest import ISTHMUS

    missing = [(" ".join(path), p.opts) for path, cmd in _walk(main, ["isthmus"]) for p in cmd.params
               if isinstance(p, click.Option) and not p.help]
    assert missing == []
    for args in (["submit"], ["jobs"], ["whoami"], ["admin", "accounts", "list"], ["admin", "weight", "list"]):
        out = subprocess.run([ISTHMUS, *args, "--help"], capture_output=True, text=True, timeout=60).stdout
        assert "ISTHMUS_URL" in out and "ISTHMUS_TOKEN" in out, args


def test_cli_replay_says_replayed_and_shows_no_python_reprs(running_gateway, tmp_path):
    token = running_gateway.token()
    spec = tmp_path / "job.yaml"
    spec.write_text("name: again\naccount: team-a\ncommand: [python3, -c, 'print(1)']\nworkers: 1\ngpus_per_worker: 1\n")
    first = running_gateway.cli("submit", str(spec), "--idempotency-key", "k-replay-1", token=token)
    second = running_gateway.cli("submit", str(spec), "--idempotency-key", "k-replay-1", token=token)
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    assert first.stdout.startswith("submitted job ")
    assert second.stdout.startswith("replayed (same Idempotency-Key as before; no new job) job ")
    job_id = first.stdout.split()[2]
    assert job_id in second.stdout
    quiet = running_gateway.cli("submit", str(spec), "-q", token=token)
    assert quiet.returncode == 0 and len(quiet.stdout.strip()) == 36
    show = running_gateway.cli("job", job_id, token=token)
    assert "None" not in show.stdout and "[" not in show.stdout.replace('["python3"', "")
    assert "exit_code:         -" in show.stdout and "nodes:             -" in show.stdout


def test_cli_whoami_accounts_usage_and_weights(running_gateway):
    alice = running_gateway.token("alice", ("team-a", "team-q"))
    who = running_gateway.cli("whoami", token=alice)
    assert who.returncode == 0, who.stderr
    assert "user:      alice" in who.stdout and "admin:     no" in who.stdout
    assert "team-a (member)" in who.stdout and "team-q (member, not an account on this gateway)" in who.stdout
    accounts = running_gateway.cli("accounts", token=alice)
    assert accounts.returncode == 0 and accounts.stdout.split()[:2] == ["ACCOUNT", "PARENT"]
    assert any(line.startswith("team-a ") for line in accounts.stdout.splitlines())
    usage = running_gateway.cli("usage", "team-a", token=alice)
    assert usage.returncode == 0 and "account:            team-a" in usage.stdout and "None" not in usage.stdout
    admin = running_gateway.token("root", (), admin=True)
    assert running_gateway.cli("admin", "weight", "slurm", "h100", "2.5", token=admin).returncode == 0  # old form
    assert running_gateway.cli("admin", "weight", "set", "kubernetes", "*", "1.5", token=admin).returncode == 0
    listed = running_gateway.cli("admin", "weight", "list", token=admin)
    assert listed.returncode == 0, listed.stderr
    rows = [line.split() for line in listed.stdout.splitlines()]
    assert rows[0] == ["POOL", "GPU_TYPE", "WEIGHT"]
    assert ["kubernetes", "*", "1.5"] in rows and ["slurm", "h100", "2.5"] in rows


def test_admin_accounts_list_marks_inherited_limits_and_budgets(running_gateway):
    admin = running_gateway.token("root", (), admin=True)
    cli = running_gateway.cli
    assert cli("admin", "accounts", "create", "org-cli", token=admin).returncode == 0
    assert cli("admin", "accounts", "create", "team-cli", "--parent", "org-cli", token=admin).returncode == 0
    assert cli("admin", "quota", "org-cli", "--max-gpus", "32", "--budget-gpu-hours", "100",
               token=admin).returncode == 0
    table = cli("admin", "accounts", "list", token=admin)
    # The session's database is shared with later suites: leave no account tree behind.
    assert cli("admin", "accounts", "delete", "team-cli", token=admin).returncode == 0
    assert cli("admin", "accounts", "delete", "org-cli", token=admin).returncode == 0
    assert table.returncode == 0, table.stderr
    rows = {line.split()[0]: line for line in table.stdout.splitlines()[1:]}
    assert "32 (org-cli)" in rows["team-cli"] and "100.0 (org-cli)" in rows["team-cli"], rows["team-cli"]
    assert "(org-cli)" not in rows["org-cli"] and " 32 " in rows["org-cli"]


def test_admin_pool_window_add_list_delete(running_gateway):
    """`isthmus admin pool window ...` against the served gateway (issue #31)."""
    from gateway.models.pools import Pool

    with running_gateway.gw.session() as s, s.begin():
        if s.get(Pool, "slurm-cli") is None:
            s.add(Pool(name="slurm-cli", kind="slurm", gpu_types=[], configured=True))
    admin = running_gateway.token("root", (), admin=True)
    cli = running_gateway.cli
    added = cli("admin", "pool", "window", "add", "slurm-cli", "--start", "now+2h", "--duration", "4h",
                "--reason", "kernel upgrade", "--node", "gpu-1", "--node", "gpu-2", "--json", token=admin)
    assert added.returncode == 0, added.stderr
    made = json.loads(added.stdout)
    assert made["nodes"] == ["gpu-1", "gpu-2"] and made["reason"] == "kernel upgrade"
    assert "2 nodes of slurm-cli (gpu-1, gpu-2) are in maintenance from" in made["words"]
    table = cli("admin", "pool", "window", "list", "slurm-cli", token=admin)
    assert table.returncode == 0, table.stderr
    header, row = table.stdout.splitlines()[:2]
    assert header.split()[:3] == ["ID", "SOURCE", "START"]
    assert row.startswith(made["id"]) and "gateway" in row and "gpu-1,gpu-2" in row and "kernel upgrade" in row
    # Bad input: the field named, nothing made.
    bad = cli("admin", "pool", "window", "add", "slurm-cli", "--start", "now", "--end", "2020-01-01T00:00:00Z",
              "--reason", "x", token=admin)
    assert bad.returncode != 0 and "422" in bad.stderr and "body.end" in bad.stderr
    both = cli("admin", "pool", "window", "add", "slurm-cli", "--start", "now", "--reason", "x", token=admin)
    assert both.returncode != 0 and "exactly one of --end and --duration" in both.stderr
    assert cli("admin", "pool", "window", "delete", "slurm-cli", made["id"], token=admin).returncode == 0
    assert "no window on slurm-cli" in cli("admin", "pool", "window", "list", "slurm-cli", token=admin).stdout
    user = cli("admin", "pool", "window", "list", "slurm-cli", token=running_gateway.token())
    assert user.returncode != 0 and "403" in user.stderr


def test_admin_reservation_add_list_delete(running_gateway):
    """`isthmus admin reservation ...` against the served gateway (issue #31, part 2)."""
    from gateway.models.pools import Pool

    with running_gateway.gw.session() as s, s.begin():
        if s.get(Pool, "slurm-cli") is None:
            s.add(Pool(name="slurm-cli", kind="slurm", gpu_types=[], configured=True))
    admin = running_gateway.token("root", (), admin=True)
    cli = running_gateway.cli
    added = cli("admin", "reservation", "add", "team-a", "--pool", "slurm-cli", "--nodes", "2", "--start", "now+1d",
                "--duration", "48h", "--reason", "conference deadline", "--json", token=admin)
    assert added.returncode == 0, added.stderr
    made = json.loads(added.stdout)
    assert (made["account"], made["nodes"], made["pool"]) == ("team-a", 2, "slurm-cli")
    table = cli("admin", "reservation", "list", token=admin)
    header, row = table.stdout.splitlines()[:2]
    assert header.split()[:4] == ["ID", "ACCOUNT", "POOL", "HOLDS"]
    assert row.startswith(made["id"]) and "team-a" in row and "2 nodes" in row and "SHORT:" in row  # nothing probes it
    bad = cli("admin", "reservation", "add", "team-a", "--pool", "slurm-cli", "--start", "now", "--duration", "1h",
              "--reason", "x", token=admin)
    assert bad.returncode != 0 and "422" in bad.stderr and "body.gpus" in bad.stderr
    assert cli("admin", "reservation", "delete", made["id"], token=admin).returncode == 0
    assert "no advance reservation" in cli("admin", "reservation", "list", token=admin).stdout
