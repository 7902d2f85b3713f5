"""A module that leaves rows behind on purpose (no clean-up): a job, a job set, a webhook,
an account, a quota, and a change to a dev account. test_2_starts_fresh.py, collected after
it, checks that none of it reaches another module's database (docs/testing.md)."""

from __future__ import annotations

from tests.isolation.leftovers import LEFT

JOB = {"name": "leftover", "account": "team-a", "command": ["true"], "gpus_per_worker": 1, "time_limit": "10m"}


def test_leave_a_job_a_set_a_webhook_an_account_and_a_changed_dev_account(gw, database_url):
    admin = gw.headers("root", (), admin=True)
    job = gw.client.post("/v1/jobs", json=JOB, headers=gw.headers())
    assert job.status_code == 202, job.text
    job_set = gw.client.post("/v1/job-sets", json={**JOB, "array": {"count": 2}}, headers=gw.headers())
    assert job_set.status_code == 202, job_set.text
    hook = gw.client.post("/v1/accounts/team-a/webhooks", json={"url": "https://93.184.215.14/hook"},
                          headers=gw.headers())
    assert hook.status_code == 201, hook.text
    account = gw.client.post("/v1/admin/accounts", json={"name": "leftover", "parent": "team-a",
                                                         "quota": {"max_gpus": 3}}, headers=admin)
    assert account.status_code == 201, account.text
    changed = gw.client.patch("/v1/admin/accounts/team-a", json={"shares": 7}, headers=admin)
    assert changed.status_code == 200, changed.text
    LEFT[database_url.split(":")[0].split("+")[0]] = {
        "database_url": database_url, "job": job.json()["id"], "set": job_set.json()["id"],
        "webhook": hook.json()["id"]}
