"""Advance reservations held by the gateway, on the real Slurm 22.05 cluster and the real Kueue
pool (issue #31, part 2; docs/planning.md).

Half of each pool is held for team-a from now: team-b's jobs fill only the other half and
the next one waits with the reservation in its reason; team-a's gang starts at once, in the
held half. Read back from the backend: the nodes Slurm gave each job, the workloads Kueue
admitted.

On Slurm the gateway also makes a real Slurm reservation for team-a (``Accounts=team-a``;
scontrol on 22.05, slurmrestd on 25.11) and team-a's gang runs in it: read back from Slurm
(the reservation's nodes and accounts, the job's ``Reservation=``), and gone from Slurm
when the reservation is deleted through the API.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from adapters.base import GATEWAY_RESERVATION_PREFIX
from adapters.slurm import parse
from tests.backends.slurm.test_reservations import scontrol, slurm_command
from tests.dispatch.conftest import (
    drive_until,
    job_state,
    kube_backend_options,
    slurm_backend_options,
    slurm_env,
    wired_gateway,
)
from tests.dispatch.test_reservations import FINAL, USERS, get, submit
from tests.security.test_backend_identity import sbatch_as


@pytest.fixture(scope="module")
def database_url(postgres_database_url):
    """Postgres only: the round's wiring runs on both databases in tests/dispatch/test_plan_round.py."""
    return postgres_database_url


def slurm_record(env: dict, what: str, name: str) -> dict[str, str]:
    """``scontrol --oneliner show <what> <name>`` as its KEY=VALUE fields (values without spaces)."""
    proc = scontrol(env, "--oneliner", "show", what, name)
    assert proc.returncode == 0, proc.stderr
    return dict(f.split("=", 1) for f in proc.stdout.split() if "=" in f)


def scenario(gw, pool: str, amount: dict, words: str, slurm: dict | None = None) -> None:
    def empty():
        v = gw.app.state.dispatcher.views(fresh=True)[pool]
        free, total = (v.idle_nodes, v.total_nodes) if v.node_exclusive else (v.free_gpus, v.total_gpus)
        return v if total and free == total else None

    view = drive_until(gw, empty, timeout_s=180, interval_s=1)
    assert (view.total_nodes if view.node_exclusive else view.total_gpus // 8) == 4, view
    now = datetime.now(UTC)
    r = gw.client.post("/v1/admin/reservations", headers=gw.headers("root", admin=True),
                       json={"account": "team-a", "pool": pool, **amount, "start": (now - timedelta(minutes=1))
                             .isoformat(), "end": (now + timedelta(hours=1)).isoformat(), "reason": "deadline"})
    assert r.status_code == 201 and r.json()["shortfall"] == "", r.text
    held = r.json()
    reserved: set[str] = set()
    if slurm is not None:  # Slurm's own reservation, made before the answer
        assert held["native"] == f"{GATEWAY_RESERVATION_PREFIX}{held['id']}", held
        rec = slurm_record(slurm, "reservation", held["native"])
        assert rec["Accounts"] == "team-a" and rec["NodeCnt"] == "2", rec
        assert ("slurmrestd" if slurm["SLURM_VERSION"] >= "25.11" else "scontrol") in held["native_note"], held
        reserved = set(parse.expand_hostlist(rec["Nodes"]))
    else:
        assert held["native"] is None and "held by the gateway's planner" in held["native_note"], held
    others = [submit(gw, "team-b", pool, run_s=60, time_limit="5m") for _ in range(3)]
    try:
        drive_until(gw, lambda: sum(get(gw, j)["state"] == "running" for j in others) == 2, timeout_s=120)
        for _ in range(3):
            gw.app.state.dispatcher.run_once()
        states = [get(gw, j) for j in others]
        [waiting] = [j for j in states if j["state"] == "pending"]
        assert words in waiting["state_reason"], waiting["state_reason"]
        assert waiting["backend_job_id"] is None
        mine = submit(gw, "team-a", pool, run_s=3, workers=2, time_limit="5m")
        done = drive_until(gw, lambda: job_state(gw, mine, *FINAL), timeout_s=120)
        assert done["state"] == "succeeded", done
        if pool == "slurm":  # Slurm's own record: the gang ran on the two nodes team-b's jobs did not hold
            theirs = {n for j in states if j["state"] == "running" for n in j["nodes"]}
            assert len(done["nodes"]) == 2 and not set(done["nodes"]) & theirs, (done["nodes"], theirs)
        if slurm is not None:  # in Slurm's reservation
            assert set(done["nodes"]) == reserved, (done["nodes"], reserved)
            job = slurm_record(slurm, "job", done["backend_job_id"])
            assert job["Reservation"] == held["native"], job
        assert get(gw, waiting["id"])["state"] == "pending"  # still not on the held half
    finally:
        for j in others:
            gw.client.post(f"/v1/jobs/{j}/cancel", headers=gw.headers(USERS["team-b"], ("team-b",)))
        drive_until(gw, lambda: all(job_state(gw, j, *FINAL) for j in others), timeout_s=120)
        gone = gw.client.delete(f"/v1/admin/reservations/{held['id']}", headers=gw.headers("root", admin=True))
        assert gone.status_code == 204, gone.text
        if slurm is not None:  # and Slurm's with it
            left = parse.reservation_text(scontrol(slurm, "--oneliner", "show", "reservation").stdout)
            assert held["native"] not in {x["name"] for x in left}, left


@pytest.mark.slurm
@pytest.mark.parametrize("version", ["22.05", "25.11"])
def test_a_held_half_of_a_slurm_pool_is_team_as_alone_in_a_real_slurm_reservation(database_url, dev_key_path,
                                                                                   version):
    """22.05: the reservation is made with scontrol; 25.11: through slurmrestd (v0.0.43)."""
    env = slurm_env(version)
    options = {**slurm_backend_options(env), "account_map": "same"}
    with wired_gateway(database_url, dev_key_path, {"slurm": options}, scheduling_policy="reservation") as gw:
        # A gateway reservation the registry does not have (a crash between the two deletes) is
        # deleted at the next sync; the site's own reservations are never touched.
        orphan = f"{GATEWAY_RESERVATION_PREFIX}orphan-{uuid.uuid4().hex[:8]}"
        made = scontrol(env, "create", "reservation", f"ReservationName={orphan}", "StartTime=now+1hour",
                        "Duration=10", "NodeCnt=1", "Accounts=team-a", f"PartitionName={env['SLURM_PARTITION']}")
        assert made.returncode == 0, made.stderr
        gw.app.state.dispatcher.sync_reservations()
        left = parse.reservation_text(scontrol(env, "--oneliner", "show", "reservation").stdout)
        assert orphan not in {x["name"] for x in left}, left
        scenario(gw, "slurm", {"nodes": 2}, "2 nodes of slurm are reserved from ", slurm=env)


@pytest.mark.slurm
def test_a_pool_without_slurm_accounts_holds_it_in_the_gateway_alone(database_url, dev_key_path, slurm_cluster):
    """No account_map: Slurm could not tell team-a's jobs from others', so no Slurm reservation."""
    with wired_gateway(database_url, dev_key_path, {"slurm": slurm_backend_options(slurm_cluster)},
                       scheduling_policy="reservation") as gw:
        scenario(gw, "slurm", {"nodes": 2}, "2 nodes of slurm are reserved from ")


@pytest.mark.kubernetes
def test_a_held_half_of_a_kueue_pool_is_team_as_alone(database_url, dev_key_path, kube):
    with wired_gateway(database_url, dev_key_path, {"kubernetes": kube_backend_options(kube)},
                                     scheduling_policy="reservation") as gw:
        scenario(gw, "kubernetes", {"gpus": 16}, "16 GPUs of kubernetes are reserved from ")


@pytest.mark.slurm
@pytest.mark.parametrize("version", ["22.05", "24.11", "25.11", "26.05"])
def test_a_foreign_job_planned_on_a_reserved_node_does_not_keep_its_holder_out(database_url, dev_key_path, version):
    """Issue #45, finding 6: a job sent to Slurm directly, which can never run on team-a's
    reserved nodes, waits for one of them and Slurm marks it IDLE+RESERVED+PLANNED. An idle
    node of the holder's own reservation is free for the holder whatever Slurm plans for
    others: team-a's 2-node gang starts in its reservation at once."""
    env = slurm_env(version)
    options = {**slurm_backend_options(env), "account_map": "same"}
    with wired_gateway(database_url, dev_key_path, {"slurm": options}, scheduling_policy="reservation") as gw:
        drive_until(gw, lambda: (v := gw.app.state.dispatcher.views(fresh=True)["slurm"]).total_nodes
                    and v.idle_nodes == v.total_nodes, timeout_s=120, interval_s=1)
        now = datetime.now(UTC)
        r = gw.client.post("/v1/admin/reservations", headers=gw.headers("root", admin=True), json={
            "account": "team-a", "pool": "slurm", "nodes": 2, "start": (now - timedelta(minutes=1)).isoformat(),
            "end": (now + timedelta(hours=1)).isoformat(), "reason": "deadline"})
        assert r.status_code == 201, r.text
        held = r.json()
        reserved = set(parse.expand_hostlist(slurm_record(env, "reservation", held["native"])["Nodes"]))
        foreign = sbatch_as(env, "carol", "--nodes=3", "--exclusive", "--wrap", "sleep 300")
        try:
            def planned() -> set[str]:
                return {n for n in reserved if "PLANNED" in slurm_record(env, "node", n).get("State", "")}

            drive_until(gw, planned, timeout_s=30)  # what the review saw: a reserved node planned for it
            mine = submit(gw, "team-a", "slurm", run_s=3, workers=2, time_limit="5m")
            done = drive_until(gw, lambda: job_state(gw, mine, *FINAL), timeout_s=60)
            assert done["state"] == "succeeded" and set(done["nodes"]) == reserved, (done, reserved)
            assert slurm_record(env, "job", foreign)["JobState"] == "PENDING"
        finally:
            slurm_command(env, "scancel", foreign)
            gone = gw.client.delete(f"/v1/admin/reservations/{held['id']}", headers=gw.headers("root", admin=True))
            assert gone.status_code == 204, gone.text
