"""The dispatch round's reservation policy, with an in-memory pool (no cluster).

These check the wiring (registry -> planner -> claims, reasons, estimates) quickly; the
same scenarios run on the real Slurm cluster in test_reservations.py.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from adapters.base import (
    Backend,
    BackendState,
    Capacity,
    JobStatus,
    PoolCapacity,
    SubmitResult,
)
from gateway.kit.timeutil import as_utc
from tests.dispatch.conftest import wired_gateway

USERS = {"team-a": "alice", "team-b": "bob"}


class Pool(Backend):
    """Four 8-GPU nodes, whole nodes per worker; a job runs from its submission until told to stop."""

    name = "slurm"

    def __init__(self, nodes: int = 4):
        self.nodes = nodes
        self.jobs: dict[str, tuple[str, int, str]] = {}  # backend id -> (gateway id, workers, state)
        self.started: dict[str, datetime] = {}

    def busy(self) -> int:
        return sum(w for _, w, st in self.jobs.values() if st == "running")

    def submit(self, request):
        bid = str(len(self.jobs) + 1)
        self.jobs[bid] = (request.gateway_job_id, request.workers, "running")
        return SubmitResult(backend_job_id=bid, adopted=False)

    def status(self, backend_job_id):
        gid, _, st = self.jobs[backend_job_id]
        state = BackendState.RUNNING if st == "running" else BackendState.SUCCEEDED
        return JobStatus(backend_job_id=backend_job_id, gateway_job_id=gid, state=state,
                         started_at=self.started.get(backend_job_id), exit_code=0 if st != "running" else None)

    def end(self, gateway_job_id):
        for bid, (gid, w, _) in self.jobs.items():
            if gid == gateway_job_id:
                self.jobs[bid] = (gid, w, "done")

    def cancel(self, backend_job_id):
        gid, w, _ = self.jobs[backend_job_id]
        self.jobs[backend_job_id] = (gid, w, "done")

    def capacity(self):
        idle = self.nodes - self.busy()
        return Capacity(backend="slurm", pools=(PoolCapacity("gpu", self.nodes, idle, 8 * self.nodes, 8 * idle, 8),))

    def find_by_gateway_id(self, gateway_job_id, *, request=None):
        return None

    def list_gateway_jobs(self):
        return []


@pytest.fixture
def gw(database_url, dev_key_path):
    with wired_gateway(database_url, dev_key_path, {}, scheduling_policy="reservation") as gw:
        pool = Pool()
        gw.app.state.backends["slurm"] = pool  # the dispatcher shares this dict
        gw.pool = pool
        yield gw


def submit(gw, account: str, **spec) -> str:
    body = {"name": "p", "account": account, "backend": "slurm", "workers": 1, "gpus_per_worker": 8,
            "time_limit": "1m", "command": ["true"], **spec}
    r = gw.client.post("/v1/jobs", json=body, headers=gw.headers(USERS[account], (account,)))
    assert r.status_code == 202, r.text
    return r.json()["id"]


def get(gw, job_id: str) -> dict:
    return gw.client.get(f"/v1/jobs/{job_id}", headers=gw.headers(admin=True, user="root", groups=())).json()


def rounds(gw, n: int = 2) -> None:
    for _ in range(n):
        gw.app.state.dispatcher.run_once()


def test_a_gang_gets_a_reservation_and_no_lower_job_takes_the_nodes_it_needs(gw):
    small = [submit(gw, "team-b", time_limit="10m") for _ in range(4)]
    rounds(gw)
    assert all(get(gw, j)["state"] == "running" for j in small)
    gang = submit(gw, "team-a", workers=4)
    later = [submit(gw, "team-b", time_limit="10m") for _ in range(3)]
    rounds(gw)
    waiting = get(gw, gang)
    assert waiting["state"] == "pending" and waiting["estimated_pool"] == "slurm", waiting
    started = min(as_utc(datetime.fromisoformat(get(gw, j)["started_at"])) for j in small)
    assert as_utc(datetime.fromisoformat(waiting["estimated_start"])) >= started
    gw.pool.end(get(gw, small[0])["id"])  # one node frees up: the next small job must not take it
    rounds(gw)
    assert all(get(gw, j)["state"] == "pending" for j in later), [get(gw, j)["state_reason"] for j in later]
    for j in small[1:]:
        gw.pool.end(j)
    rounds(gw, 3)
    assert get(gw, gang)["state"] == "running", get(gw, gang)
    assert get(gw, gang)["estimated_start"] is None


def test_backfill_only_what_ends_before_the_planned_start(gw):
    blocker = submit(gw, "team-b", time_limit="30m")
    rounds(gw)
    gang = submit(gw, "team-a", workers=4)
    rounds(gw)
    assert get(gw, gang)["estimated_start"]
    short = submit(gw, "team-b", time_limit="10m")
    long = submit(gw, "team-b", time_limit="1h")
    rounds(gw)
    assert get(gw, short)["state"] == "running"
    held = get(gw, long)
    # It waits, with its own planned start: after the gang's (which runs for up to its limit).
    assert held["state"] == "pending", held
    gang_at = as_utc(datetime.fromisoformat(get(gw, gang)["estimated_start"]))
    assert as_utc(datetime.fromisoformat(held["estimated_start"])) >= gang_at, (held, get(gw, gang))
    assert blocker


def test_a_job_larger_than_the_accounts_gpu_limit_everywhere_is_refused_at_submit(gw):
    admin = gw.headers(admin=True, user="root", groups=())
    r = gw.client.put("/v1/admin/accounts/team-a/quota", json={"max_gpus": 8}, headers=admin)
    assert r.status_code == 200, r.text
    body = {"name": "big", "account": "team-a", "backend": "auto", "workers": 2, "gpus_per_worker": 8,
            "command": ["true"]}
    r = gw.client.post("/v1/jobs", json=body, headers=gw.headers("alice", ("team-a",)))
    assert r.status_code == 422, r.text
    problem = r.json()
    assert "max_gpus = 8" in problem["detail"], problem
    assert any("workers" in str(e.get("loc", e)) for e in problem.get("errors", [problem])), problem
    ok = gw.client.post("/v1/jobs", json={**body, "workers": 1}, headers=gw.headers("alice", ("team-a",)))
    assert ok.status_code == 202, ok.text


def test_the_pick_looks_past_an_accounts_unadmittable_jobs(gw):
    admin = gw.headers(admin=True, user="root", groups=())
    assert gw.client.patch("/v1/admin/accounts/team-b", json={"shares": 100}, headers=admin).status_code == 200
    assert gw.client.put("/v1/admin/accounts/team-b/quota", json={"max_gpus": 8}, headers=admin).status_code == 200
    first = submit(gw, "team-b", time_limit="30m")
    rounds(gw, 1)
    assert get(gw, first)["state"] == "running"
    for _ in range(120):
        submit(gw, "team-b")
    other = submit(gw, "team-a")
    rounds(gw, 1)
    assert get(gw, other)["state"] == "running", get(gw, other)


def test_the_cli_shows_the_estimate(gw):
    from gateway.cli_client import _table
    from gateway.cli_user import JOB_COLUMNS, _job_detail

    for _ in range(4):
        submit(gw, "team-b", time_limit="10m")
    rounds(gw)
    gang = get(gw, submit(gw, "team-a", workers=4))
    rounds(gw)
    gang = get(gw, gang["id"])
    table = _table([gang], JOB_COLUMNS)
    assert "EST_START" in table.splitlines()[0] and gang["estimated_start"] in table
    detail = _job_detail(gang)
    assert f"estimated_start:   {gang['estimated_start']}" in detail and "estimated_pool:    slurm" in detail
    assert "estimate_reason:" in detail


def test_the_greedy_policy_lets_the_stream_take_the_freed_node(database_url, dev_key_path):
    """The old pick, kept behind ISTHMUS_SCHEDULING_POLICY=greedy: what the reservation policy fixes."""
    with wired_gateway(database_url, dev_key_path, {}, scheduling_policy="greedy") as gw:
        gw.pool = gw.app.state.backends["slurm"] = Pool()
        small = [submit(gw, "team-b", time_limit="10m") for _ in range(4)]
        rounds(gw)
        gang = submit(gw, "team-a", workers=4)
        later = submit(gw, "team-b", time_limit="10m")
        rounds(gw)
        gw.pool.end(small[0])
        rounds(gw)
        assert get(gw, later)["state"] == "running" and get(gw, gang)["state"] == "pending"


def test_free_now_never_counts_a_dispatched_job_twice():
    """A job the registry has as queued may or may not be in the snapshot yet: free + releases stays <= total."""
    from adapters.base import Capacity, PoolCapacity
    from gateway.domain.plan_inputs import free_now
    from gateway.domain.routing import PoolView

    def view(idle):
        cap = Capacity(backend="slurm", pools=(PoolCapacity("gpu", 4, idle, 32, 8 * idle, 8),))
        return {"slurm": PoolView(name="slurm", capacity=cap, idle_nodes=idle, free_gpus=8 * idle,
                                  total_nodes=4, total_gpus=32, gpus_per_node=8)}

    # registry: 2 nodes held (one running, one just queued)
    assert free_now(view(3), {"slurm": 2}) == {"slurm": 2}  # the snapshot has not seen the queued one yet
    assert free_now(view(2), {"slurm": 2}) == {"slurm": 2}  # it has: not subtracted again
    assert free_now(view(1), {"slurm": 2}) == {"slurm": 1}  # a job the gateway does not know holds one


def test_units_of_a_gang_that_just_ended_but_still_show_as_used_free_soon_so_the_gang_keeps_its_reservation():
    """Kueue frees a finished workload's quota a little after its pods end. Those used units are no
    registry gang's; taken for someone else's work with no known end, the whole-pool gang would find
    no start at all in that round, lose its reservation, and a stream job would take the free GPUs."""

    from adapters.base import Capacity, PoolCapacity
    from gateway.domain.plan_inputs import RECENT_END_S, free_now, lagging_ends
    from gateway.domain.planner import Candidate, PoolModel, Release, plan
    from gateway.domain.routing import PoolView

    now = datetime(2026, 12, 1, 23, 59, 11, tzinfo=UTC)
    t = now.timestamp()

    def views(free_gpus):  # one Kubernetes pool, 32 GPUs on four 8-GPU nodes
        cap = Capacity(backend="kubernetes", pools=(PoolCapacity("q", 4, 4, 32, free_gpus, 8),))
        return {"kube": PoolView(name="kube", capacity=cap, kind="kubernetes", idle_nodes=4,
                                 free_gpus=free_gpus, total_nodes=4, total_gpus=32, gpus_per_node=8)}

    running = [Release("kube", 8, t + 100), Release("kube", 8, t + 110)]  # two 8-GPU stream jobs
    held = {"kube": 16}
    ended = [("kube", 1, 8, 1000.0)]  # a third ended 5 s ago; the snapshot still counts its 8 GPUs
    gang = Candidate(id="gang", workers=4, gpus_per_worker=8, time_limit_s=60, pools=("kube",))
    stream = Candidate(id="stream", workers=1, gpus_per_worker=8, time_limit_s=120, pools=("kube",))

    def planned(v, releases, held_):
        return plan(now=t, pools=[PoolModel("kube", False, 32, 8)], free_now=free_now(v, held_),
                    releases=releases, candidates=[gang, stream], depth=8)

    # Before: 8 free + 16 at the stream jobs' ends never reaches 32: no reservation, the stream job starts.
    before = planned(views(8), running, held)
    assert [p.job_id for p in before.starts] == ["stream"] and not before.reservations

    lag, held_after = lagging_ends(views(8), held, ended, now=now, monotonic_now=1005.0)
    assert [(r.pool, r.units) for r in lag] == [("kube", 8)] and held_after == {"kube": 24}
    after = planned(views(8), running + lag, held_after)
    gang_at = after.estimate("gang")
    assert gang_at is not None and gang_at.start == t + 110  # when both stream jobs have ended
    assert not after.starts  # the stream job would end after the gang's planned start: it waits

    # Once the snapshot shows them free there is nothing left to explain: no release, nothing held twice.
    assert lagging_ends(views(16), held, ended, now=now, monotonic_now=1005.0) == ([], held)
    # An end older than the window is someone else's work again.
    assert lagging_ends(views(8), held, ended, now=now, monotonic_now=1000.0 + RECENT_END_S + 1) == ([], held)


def test_a_window_holds_what_would_cross_it_and_a_greedy_round_honours_it_too(database_url, dev_key_path):
    """The wiring of windows (issue #31) under both policies: a greedy round plans too once a
    window is set. The same on real Slurm: tests/dispatch/test_windows_slurm.py."""
    from datetime import timedelta

    for policy in ("reservation", "greedy"):
        with wired_gateway(database_url, dev_key_path, {}, scheduling_policy=policy) as gw:
            gw.app.state.backends["slurm"] = Pool()
            now = datetime.now(UTC)
            end = now + timedelta(minutes=40)
            r = gw.client.post("/v1/admin/pools/slurm/windows", headers=gw.headers("root", admin=True),
                               json={"start": (now + timedelta(minutes=10)).isoformat(), "end": end.isoformat(),
                                     "reason": "switch firmware"})
            assert r.status_code == 201, r.text
            long_ = submit(gw, "team-a", time_limit="30m")
            short = submit(gw, "team-b", time_limit="5m")
            rounds(gw)
            held = get(gw, long_)
            assert held["state"] == "pending", (policy, held)
            assert "slurm is in maintenance from" in held["state_reason"], (policy, held["state_reason"])
            assert "(switch firmware); this job's 30 min limit would cross it" in held["state_reason"]
            assert get(gw, short)["state"] == "running", (policy, get(gw, short))
            if policy == "reservation":  # an estimate at the window's end
                assert abs(as_utc(datetime.fromisoformat(held["estimated_start"])) - end) < timedelta(seconds=2)


def test_an_advance_reservation_keeps_others_off_and_lets_its_account_in(gw):
    """Issue #31, part 2, wiring (in-memory pool): 2 of the 4 nodes held for team-a from now.
    The same on real Slurm and Kueue: tests/dispatch/test_holds_real.py."""
    from datetime import timedelta

    admin = gw.headers("root", admin=True)
    now = datetime.now(UTC)
    end = now + timedelta(hours=1)
    r = gw.client.post("/v1/admin/reservations", headers=admin,
                       json={"account": "team-a", "pool": "slurm", "nodes": 2, "start": (now - timedelta(minutes=1))
                             .isoformat(), "end": end.isoformat(), "reason": "deadline"})
    assert r.status_code == 201, r.text
    rounds(gw, 1)  # the dispatcher's views exist now
    listed = gw.client.get("/v1/admin/reservations", headers=admin).json()
    assert listed[0]["shortfall"] == "" and listed[0]["active"], listed
    others = [submit(gw, "team-b", time_limit="10m") for _ in range(3)]
    rounds(gw)
    states = [get(gw, j)["state"] for j in others]
    assert states.count("running") == 2 and states.count("pending") == 1, states
    [waiting] = [get(gw, j) for j in others if get(gw, j)["state"] == "pending"]
    assert "2 nodes of slurm are reserved from " in waiting["state_reason"], waiting["state_reason"]
    # Another tenant sees what and when, not whose or why (issue #45; docs/planning.md).
    said = [waiting["state_reason"]] + [e["reason"] for e in gw.client.get(
        f"/v1/jobs/{waiting['id']}/events", headers=gw.headers("bob", ("team-b",))).json()["items"]]
    assert not [r for r in said if "team-a" in r or "deadline" in r], said
    mine = submit(gw, "team-a", workers=2, time_limit="10m")
    rounds(gw)
    assert get(gw, mine)["state"] == "running", get(gw, mine)
    too_long = submit(gw, "team-a", workers=1, time_limit="2h")  # would outlive the reservation: not in it
    rounds(gw)
    assert get(gw, too_long)["state"] == "pending"
    # The pool lost nodes: a reservation of 6 of its 4 nodes is flagged with the shortfall.
    r = gw.client.post("/v1/admin/reservations", headers=admin,
                       json={"account": "team-a", "pool": "slurm", "nodes": 6, "start": end.isoformat(),
                             "end": (end + timedelta(hours=1)).isoformat(), "reason": "big"})
    assert r.json()["shortfall"] == "slurm has 4 nodes now; the reservation needs 6 (short by 2)", r.json()
