"""A gateway built with injected settings uses them, never the environment's (issue #28).

The ledger used to fall back to the process-wide ``get_settings()`` for the fair-share
half-life, and the dispatcher passed none: a dispatcher built with injected settings ordered
and charged by the environment's half-life while the routers used the injected one. Here the
global settings are made unreadable, and a job goes through a whole life on the real Slurm
22.05 cluster (pick by fair share, submit, follow, charge) and through /metrics.
"""

from __future__ import annotations

import pytest

from tests.dispatch.conftest import (
    drive_until,
    job_state,
    slurm_backend_options,
    wired_gateway,
)

pytestmark = pytest.mark.slurm
FINAL = ("succeeded", "failed", "cancelled")


def test_dispatch_charging_and_metrics_read_only_the_injected_settings(database_url, dev_key_path, slurm_cluster,
                                                                      monkeypatch):
    with wired_gateway(database_url, dev_key_path, {"slurm": slurm_backend_options(slurm_cluster)},
                       fairshare_half_life_s=3600) as gw:
        import gateway.kit.settings as settings_module

        def no_global_settings():
            raise AssertionError("read the process-wide settings instead of the injected ones")

        monkeypatch.setattr(settings_module, "get_settings", no_global_settings)
        body = {"name": "injected", "account": "team-a", "pool": "slurm", "workers": 1, "gpus_per_worker": 8,
                "command": ["sleep", "1"], "time_limit": "1m"}
        r = gw.client.post("/v1/jobs", json=body, headers=gw.headers("alice", ("team-a",)))
        assert r.status_code == 202, r.text
        done = drive_until(gw, lambda: job_state(gw, r.json()["id"], *FINAL), timeout_s=60)
        assert done["state"] == "succeeded", done
        admin = gw.headers(admin=True, user="root", groups=())
        table = gw.client.get("/v1/admin/fairshare", headers=admin)
        assert table.status_code == 200 and table.json()["half_life_s"] == 3600, table.text
        assert gw.client.get("/metrics").status_code == 200
