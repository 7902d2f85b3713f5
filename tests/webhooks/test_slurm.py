"""A real Slurm job's lifecycle reaches the receiver, through an ``isthmus worker`` that is
killed with ``kill -9`` in the middle of a delivery and replaced."""

from __future__ import annotations

import collections
import signal

import pytest

from tests.dispatch.conftest import slurm_cluster  # noqa: F401  (fixture)
from tests.dispatch.test_faults import (  # noqa: F401  (fixtures)
    gateway,
    pg_url,
    slurm_backend,
    submit,
    wait_states,
    workers,
)
from tests.webhooks.conftest import ALLOWLIST, verify

pytestmark = [pytest.mark.slurm("25.11"), pytest.mark.postgres]  # off 22.05, the busiest lane


def test_a_slurm_job_lifecycle_survives_kill_9_of_the_worker(gateway, workers, pg_url, pki, receiver):
    gateway.app.state.settings = gateway.app.state.settings.model_copy(update={"webhook_allowlist": ALLOWLIST})
    r = gateway.client.post("/v1/accounts/team-a/webhooks", json={"url": receiver.url},
                            headers=gateway.headers("alice", ("team-a",)))
    assert r.status_code == 201, r.text
    secret = r.json()["secret"]
    hook_env = {"webhook_allowlist": ALLOWLIST, "webhook_ca_file": str(pki.ca_file), "webhook_interval_s": 0.2,
                "webhook_timeout_s": 5, "webhook_lease_s": 6}
    receiver.mode = "stall"
    first = workers.start(**hook_env)
    [job] = submit(gateway, command=("sleep", "2"))
    receiver.wait_for(lambda got: len(got) >= 1, timeout=60)  # the first event is being delivered
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    receiver.mode = "ok"
    receiver.release.set()
    workers.start(**hook_env)  # finishes the job and the deliveries
    wait_states(pg_url, [job], {"succeeded"}, timeout_s=120)
    events = gateway.client.get(f"/v1/jobs/{job}/events", headers=gateway.headers("alice", ("team-a",))).json()["items"]
    wanted = {f"msg_{e['id']}": e["to_state"] for e in events if e["kind"] == "state"}
    # A two-second job may finish between two status polls of the restarted worker, so it
    # can go from queued to succeeded without a ``running`` event; what must hold is that the
    # job's whole recorded lifecycle reaches the receiver, each event at least once.
    assert "succeeded" in wanted.values() and {"queued", "running"} & set(wanted.values())
    got = receiver.wait_for(lambda r: {x.msg_id for x in r[1:]} >= set(wanted), timeout=60)
    assert all(verify(secret, x.headers, x.body) for x in got)
    assert {x.msg_id: x.json["data"]["to_state"] for x in got} == wanted
    assert all(x.json["data"]["pool"] in (None, "slurm") for x in got)
    counts = collections.Counter(x.msg_id for x in got)
    assert counts[got[0].msg_id] >= 2  # the one in flight at the kill was sent again
