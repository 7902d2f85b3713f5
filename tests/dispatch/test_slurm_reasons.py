"""Slurm's reasons for a job that will not start as submitted, in the user's words (#14, 4-5)."""

from __future__ import annotations

import pytest

from tests.dispatch.conftest import drive_until, job_state, slurm_backend_options, wired_gateway

pytestmark = pytest.mark.slurm


def test_a_user_without_a_posix_account_is_told_so_not_begintime(database_url, dev_key_path, slurm22):
    with wired_gateway(database_url, dev_key_path, {"slurm": slurm_backend_options(slurm22)}) as gw:
        who = gw.headers("zed-no-account", ("team-a",))
        body = {"name": "nouser", "account": "team-a", "command": ["true"], "workers": 1, "gpus_per_worker": 1}
        job = gw.client.post("/v1/jobs", json=body, headers=who).json()["id"]
        shown = drive_until(gw, lambda: (lambda j: j if "BeginTime" in j["state_reason"] else None)(
            gw.client.get(f"/v1/jobs/{job}", headers=who).json()), timeout_s=240)
        assert shown["state"] == "queued"
        assert shown["state_reason"].startswith(
            "Slurm could not start the job as the job's user and retries it later (Slurm reason BeginTime); "
            "usually the user has no POSIX account on the cluster's nodes"), shown["state_reason"]
        assert gw.client.post(f"/v1/jobs/{job}/cancel", headers=who).status_code == 202
        drive_until(gw, lambda: job_state(gw, job, "cancelled"), timeout_s=60)
