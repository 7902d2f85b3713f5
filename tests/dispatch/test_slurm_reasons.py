"""Slurm's reasons for a job that will not start as submitted, in the user's words (#14, 4-5)."""

from __future__ import annotations

import pytest

from tests.dispatch.conftest import (
    drive_until,
    job_state,
    slurm_backend_options,
    wired_gateway,
)

pytestmark = pytest.mark.slurm


def test_a_user_without_a_posix_account_is_told_so_not_begintime(database_url, dev_key_path, slurm_cluster):
    with wired_gateway(database_url, dev_key_path, {"slurm": slurm_backend_options(slurm_cluster)}) as gw:
        who = gw.headers("zed-no-account", ("team-a",))
        body = {"name": "nouser", "account": "team-a", "command": ["true"], "workers": 1, "gpus_per_worker": 1}
        job = gw.client.post("/v1/jobs", json=body, headers=who).json()["id"]
        shown = drive_until(gw, lambda: (lambda j: j if "BeginTime" in j["state_reason"] else None)(
            gw.client.get(f"/v1/jobs/{job}", headers=who).json()), timeout_s=240)
        # Slurm may have tried to launch it first (then it is requeued, not queued): both wait with the reason.
        assert shown["state"] in ("queued", "requeued")
        assert shown["state_reason"].startswith(
            "Slurm could not start the job as the job's user and retries it later (Slurm reason BeginTime); "
            "usually the user has no POSIX account on the cluster's nodes"), shown["state_reason"]
        assert gw.client.post(f"/v1/jobs/{job}/cancel", headers=who).status_code == 202
        drive_until(gw, lambda: job_state(gw, job, "cancelled"), timeout_s=60)


def test_a_job_held_for_an_unknown_user_fails_after_the_bound_and_is_cancelled_on_slurm(
        database_url, dev_key_path, slurm_cluster):
    """#14 item 5: no wait forever; nothing left on the cluster; the reservation is released."""
    from adapters.base import BackendState, JobNotFound
    from gateway.ledger import reading as ledger_reading
    from gateway.models.ledger import Reservation

    with wired_gateway(database_url, dev_key_path, {"slurm": slurm_backend_options(slurm_cluster)},
                       held_job_fail_after_s=3) as gw:
        who = gw.headers("zed-no-account", ("team-a",))
        body = {"name": "nouser-bound", "account": "team-a", "command": ["true"], "workers": 1, "gpus_per_worker": 1}
        job = gw.client.post("/v1/jobs", json=body, headers=who).json()["id"]
        done = drive_until(gw, lambda: job_state(gw, job, "succeeded", "failed", "cancelled"), timeout_s=110)
        assert done["state"] == "failed", done
        assert done["state_reason"].startswith(
            "Slurm could not start the job as the job's user and retries it later (Slurm reason BeginTime); "
            "usually the user has no POSIX account on the cluster's nodes. The gateway gave up after the job "
            "was held "), done["state_reason"]
        assert done["state_reason"].endswith(" s (ISTHMUS_HELD_JOB_FAIL_AFTER_S=3) and cancelled it on slurm")
        assert done["exit_code"] is None and done["ended_at"]

        try:  # nothing of it may start on the cluster later, unseen by the ledger
            on_slurm = gw.app.state.backends["slurm"].status(done["backend_job_id"]).state
        except JobNotFound:
            on_slurm = BackendState.CANCELLED
        assert on_slurm is BackendState.CANCELLED
        with gw.session() as s:
            assert s.get(Reservation, job).status == "released"
            assert ledger_reading.verify(s) == []
