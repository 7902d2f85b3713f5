"""A client generated from docs/openapi.json with openapi-python-client, used against a running gateway."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

SPEC_FILE = REPO / "docs" / "openapi.json"


@pytest.fixture(scope="session")
def generated_client(tmp_path_factory):
    out = tmp_path_factory.mktemp("client") / "isthmus_client"
    gen = Path(sys.executable).parent / "openapi-python-client"
    proc = subprocess.run([str(gen), "generate", "--path", str(SPEC_FILE), "--meta", "none",
                           "--output-path", str(out), "--config", str(REPO / "tests/api/openapi-client-config.yaml")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    sys.path.insert(0, str(out.parent))
    try:
        yield out
    finally:
        sys.path.remove(str(out.parent))


def test_generated_client_submits_reads_lists_and_cancels(generated_client, running_gateway):
    from isthmus_client import AuthenticatedClient
    from isthmus_client.api.jobs import (
        cancel_job,
        get_job,
        list_job_events,
        list_jobs,
        submit_job,
    )
    from isthmus_client.models import JobSpec

    client = AuthenticatedClient(base_url=running_gateway.url, token=running_gateway.token())
    spec = JobSpec.from_dict({"name": "from-client", "account": "team-a", "command": ["python", "-c", "print(1)"],
                              "workers": 2, "gpus_per_worker": 4, "memory_per_worker": "8Gi"})
    created = submit_job.sync_detailed(client=client, body=spec, idempotency_key="gen-client-1")
    assert created.status_code == 202, created.content
    job = created.parsed
    assert job.state.value == "pending" and job.total_gpus == 8

    got = get_job.sync_detailed(client=client, job_id=job.id)
    assert got.status_code == 200, got.content
    assert got.parsed.name == "from-client"
    page = list_jobs.sync(client=client, limit=10)
    assert job.id in [j.id for j in page.items]

    cancelled = cancel_job.sync(client=client, job_id=job.id)
    assert cancelled.state.value == "cancelled"
    events = list_job_events.sync(client=client, job_id=job.id)
    assert [e.to_state.value for e in events.items] == ["pending", "cancelled"]

    # errors come back as problem details the client can read
    bad = submit_job.sync_detailed(client=client, body=JobSpec.from_dict({**spec.to_dict(), "workers": 0}))
    assert bad.status_code == 422
    assert json.loads(bad.content)["errors"][0]["field"] == "body.workers"
    replay = submit_job.sync_detailed(client=client, body=spec, idempotency_key="gen-client-1")
    assert replay.status_code == 200 and replay.parsed.id == job.id


def test_generated_client_admin_calls_and_typed_problems(generated_client, running_gateway):
    """The admin flow of tests/clients' TypeScript and Go smoke programs, in Python (docs/clients.md)."""
    from isthmus_client import AuthenticatedClient
    from isthmus_client.api.admin import (
        create_account,
        create_ledger_adjustment,
        delete_account,
        get_account,
        get_usage_report,
        get_usage_report_csv,
        list_ledger_entries,
        set_account_quota,
    )
    from isthmus_client.models import AccountCreate, AdjustmentIn, Problem, QuotaIn

    admin = AuthenticatedClient(base_url=running_gateway.url, token=running_gateway.token("root", admin=True))
    bad = get_account.sync_detailed(client=admin, name="Not_An_Account")
    assert bad.status_code == 422 and isinstance(bad.parsed, Problem)
    assert bad.parsed.errors[0].field == "path.name" and bad.parsed.detail

    acc = create_account.sync(client=admin, body=AccountCreate.from_dict(
        {"name": "py-client", "quota": {"budget_gpu_hours": 1234567.89, "budget_period": "month"}}))
    assert acc.quota.budget_gpu_hours.value == 1234567.89
    acc = set_account_quota.sync(client=admin, name="py-client", body=QuotaIn(
        max_gpus=500_000, budget_period=acc.quota.budget_period))
    assert acc.quota.max_gpus.value == 500_000

    entry = create_ledger_adjustment.sync(client=admin, body=AdjustmentIn.from_dict(
        {"account": "py-client", "kind": "credit", "gpu_hours": 1_000_000, "reason": "py client"}))
    assert entry.gpu_seconds == -3_600_000_000
    page = list_ledger_entries.sync(client=admin, account="py-client", kind=[entry.kind])
    assert [e.id for e in page.items] == [entry.id]
    report = get_usage_report.sync(client=admin, account="py-client")
    assert [r.adjustment_gpu_seconds for r in report.items] == [-3_600_000_000]
    csv = get_usage_report_csv.sync(client=admin, account="py-client", period=report.period)
    assert csv.startswith("account,pool,period,") and ",-3600000000," in csv

    assert delete_account.sync_detailed(client=admin, name="py-client").status_code == 204
    gone = get_account.sync_detailed(client=admin, name="py-client")
    assert gone.status_code == 404 and isinstance(gone.parsed, Problem)
