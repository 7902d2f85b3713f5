"""A job's identity on its backend is the id the gateway recorded, not a gateway id anyone can
write onto a job of their own (issue #12, finding 1).

On the real Slurm cluster another test user (``bob``) submits a short job with
``--comment=isthmus:<victim id>``, exactly as any Slurm user could. Before the fix the
reconciler's listing keyed statuses by that comment, so the victim's gang was marked
finished, charged 10 s and released while it kept running, unbilled.
"""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from adapters.base import BackendState, SubmitRequest
from adapters.slurm.backend import SlurmBackend
from adapters.slurm.settings import SlurmSettings
from gateway.ledger import reading as ledger_reading
from gateway.ledger import rules as ledger_rules
from tests import slurm_cli
from tests.dispatch.conftest import (
    drive_until,
    job_state,
    slurm_backend_options,
    slurm_env,
    wired_gateway,
)

pytestmark = pytest.mark.slurm
FINAL = ("succeeded", "failed", "cancelled")


@pytest.fixture(scope="module")
def slurm_cluster():
    return slurm_env("22.05")


@pytest.fixture
def gw(database_url, dev_key_path, slurm_cluster):
    with wired_gateway(database_url, dev_key_path, {"slurm": slurm_backend_options(slurm_cluster)}) as gw:
        yield gw


def sbatch_as(env: dict[str, str], user: str, *args: str) -> str:
    """Submit a job as ``user`` with Slurm's own sbatch, as that user could from a login node."""
    done = slurm_cli.run(env, "sbatch", "--parsable", f"--partition={env['SLURM_PARTITION']}",
                         f"--chdir={env['SLURM_WORK_DIR']}", f"--output={env['SLURM_WORK_DIR']}/spoof-%j.out", *args,
                         as_user=user)
    return done.stdout.strip().split(";")[0]


def wait_final(backend, backend_job_id: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not backend.status(backend_job_id).state.final:
        assert time.monotonic() < deadline, f"slurm job {backend_job_id} did not end"
        time.sleep(0.5)


def test_a_spoofed_comment_does_not_end_or_bill_the_victims_job(gw, slurm_cluster):
    h = gw.headers("alice", ("team-a",))
    r = gw.client.post("/v1/jobs", headers=h, json={
        "name": "victim", "account": "team-a", "backend": "slurm", "command": ["sleep", "300"], "workers": 1,
        "gpus_per_worker": 8, "time_limit": "10m"})
    assert r.status_code == 202, r.text
    victim = r.json()["id"]
    dispatcher = gw.app.state.dispatcher
    dispatcher.reconciler.LIST_THRESHOLD = 0  # follow through one listing, as with more than 5 jobs on Slurm
    running = drive_until(gw, lambda: job_state(gw, victim, "running"), timeout_s=60)

    spoof = sbatch_as(slurm_cluster, "bob", f"--comment=isthmus:{victim}", "--wrap", "sleep 1")
    backend = gw.app.state.backends["slurm"]
    wait_final(backend, spoof)
    assert backend.status(spoof).gateway_job_id == victim  # the listing does carry the victim's id
    for _ in range(4):
        dispatcher.run_once()
        time.sleep(0.3)

    job = gw.client.get(f"/v1/jobs/{victim}", headers=h).json()
    assert job["state"] == "running", job
    assert job["backend_job_id"] == running["backend_job_id"] != spoof
    assert backend.status(running["backend_job_id"]).state is BackendState.RUNNING
    # admins see bob's job as an orphan: it carries a gateway id that is not its own
    orphans = gw.client.get("/v1/admin/orphans", headers=gw.headers("root", (), admin=True)).json()
    assert {"backend": "slurm", "backend_job_id": spoof, "gateway_job_id": victim} in [
        {k: o[k] for k in ("backend", "backend_job_id", "gateway_job_id")} for o in orphans], orphans
    assert running["backend_job_id"] not in [o["backend_job_id"] for o in orphans]
    with gw.session() as s:
        assert ledger_rules.charged_gpu_seconds(s, job_id=victim) == 0  # nothing charged from bob's 1 s
        assert ledger_reading.get_balance(s, "team-a").reserved_gpus == 8  # the gang's reservation is held
        assert ledger_reading.verify(s) == []

    # the real gang is still followed, cancelled and billed for its own run
    assert gw.client.post(f"/v1/jobs/{victim}/cancel", headers=h).status_code == 202
    done = drive_until(gw, lambda: job_state(gw, victim, *FINAL), timeout_s=60)
    assert done["state"] == "cancelled", done
    ran = (datetime.fromisoformat(done["ended_at"]) - datetime.fromisoformat(done["started_at"])).total_seconds()
    with gw.session() as s:
        assert ledger_rules.charged_gpu_seconds(s, job_id=victim) == pytest.approx(8 * ran, abs=8 * 2)
        assert ledger_rules.charged_gpu_seconds(s, job_id=victim) >= 8 * 2
        assert ledger_reading.verify(s) == []


def _request(gid: str, user: str = "alice", **kw) -> SubmitRequest:
    return SubmitRequest(gateway_job_id=gid, name="adopt", account="team-a", user=user, command=["sleep", "60"],
                         workers=1, gpus_per_worker=0, cpus_per_worker=1, memory_mib_per_worker=256,
                         time_limit_s=120, **kw)


def test_adoption_requires_the_mapped_user_and_the_submit_window(slurm_cluster):
    """A re-driven submission (crash recovery) adopts only the gateway's own earlier submission:
    not another user's job with the id in its comment, nor one submitted before the job existed."""
    backend = SlurmBackend(SlurmSettings(**slurm_backend_options(slurm_cluster)))
    gid = f"adopt-{uuid.uuid4().hex[:10]}"
    made: list[str] = []
    try:
        spoof = sbatch_as(slurm_cluster, "bob", f"--comment=isthmus:{gid}", "--wrap", "sleep 60")
        made.append(spoof)
        first = backend.submit(_request(gid, submitted_after=datetime.now(UTC), first_attempt=False))
        made.append(first.backend_job_id)
        assert not first.adopted and first.backend_job_id != spoof  # a new job, as alice
        assert backend.transport.job(first.backend_job_id)["user_name"] == "alice"
        again = backend.submit(_request(gid, submitted_after=datetime.now(UTC) - timedelta(minutes=5)))
        assert again.adopted and again.backend_job_id == first.backend_job_id
        # a job of alice's own from before the gateway job existed is not its submission either
        late = datetime.now(UTC) + timedelta(minutes=10)
        assert backend.find_by_gateway_id(gid, request=_request(gid, submitted_after=late)) is None
        assert backend.find_by_gateway_id(gid, request=_request(gid, user="bob")).backend_job_id == spoof
    finally:
        for j in made:
            backend.cancel(j)
        backend.close()
