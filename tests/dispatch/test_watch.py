"""The reconciler follows Kubernetes jobs through the watch, not by polling.

Every gateway here runs its real control loop (``dispatcher.start()``) against the real
control plane with polling effectively off: a 60 s interval and a one-hour resync. Each
change must reach the registry within seconds, so only the watch can have carried it.
"""

from __future__ import annotations

import contextlib
import threading
import time

import pytest
from sqlalchemy import select

from adapters.base import BackendUnavailable
from adapters.kubernetes import KubernetesBackend, KubernetesSettings
from gateway.ledger import reading as ledger_reading
from gateway.ledger import rules as ledger_rules
from gateway.models.ledger import LedgerEntry
from tests.dispatch.conftest import (
    KWOK_RUN_FOR,
    job_state,
    kube_backend_options,
    wired_gateway,
)

pytestmark = pytest.mark.kubernetes
FINAL = ("succeeded", "failed", "cancelled")
NO_POLLING = {"dispatch_interval_s": 60, "reconcile_resync_s": 3600}
PROMPT_S = 30  # well inside the 60 s poll interval


@contextlib.contextmanager
def running_gateway(database_url, dev_key_path, kube, backend=None, **overrides):
    with wired_gateway(database_url, dev_key_path, {"kubernetes": kube_backend_options(kube)},
                       **{**NO_POLLING, **overrides}) as gw:
        if backend is not None:  # the same dict is shared by the app and its dispatcher
            gw.app.state.backends["kubernetes"] = backend
        dispatcher = gw.app.state.dispatcher
        assert dispatcher.watched == ["kubernetes"]
        dispatcher.start()
        try:
            wait_until(lambda: dispatcher.watch_live("kubernetes"), 120, "the watch did not catch up")
            time.sleep(1)  # the first polling round has run; the next one is 60 s away
            yield gw
        finally:
            dispatcher.stop()


def wait_until(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(what)
        time.sleep(0.2)


def wait_state(gw, job_id: str, *states: str, timeout_s: float = PROMPT_S):
    """Only read the registry: the gateway's own threads must move the job."""
    return wait_until(lambda: job_state(gw, job_id, *states), timeout_s,
                      f"job {job_id} did not reach {states} within {timeout_s} s "
                      f"(now {job_state(gw, job_id, *FINAL, 'pending', 'dispatching', 'queued', 'starting', 'running', 'requeued', 'cancelling')})")


def submit(gw, account="team-a", **spec):
    body = {"name": "watch", "account": account, "backend": "kubernetes", "workers": 2, "gpus_per_worker": 4,
            "command": ["python", "train.py"], "image": "registry.example/trainer:1", "time_limit": "10m", **spec}
    r = gw.client.post("/v1/jobs", json=body, headers=gw.headers("alice", (account,)))
    assert r.status_code == 202, r.text
    return r.json()["id"]


def state_events(gw, job_id: str) -> list[dict]:
    items = gw.client.get(f"/v1/jobs/{job_id}/events", headers=gw.headers(admin=True, user="root", groups=())
                          ).json()["items"]
    return [e for e in items if e["kind"] == "state"]


def via(gw, job_id: str, to_state: str) -> str | None:
    return next(((e["data"] or {}).get("via") for e in state_events(gw, job_id) if e["to_state"] == to_state), None)


def usage_entries(gw, job_id: str) -> list[LedgerEntry]:
    with gw.session() as s:
        return list(s.scalars(select(LedgerEntry).where(LedgerEntry.job_id == job_id, LedgerEntry.kind == "usage")
                              .order_by(LedgerEntry.id)))


def test_queued_running_succeeded_arrive_through_the_watch(database_url, dev_key_path, kube):
    with running_gateway(database_url, dev_key_path, kube) as gw:
        job = submit(gw, labels={KWOK_RUN_FOR: "5s"})
        running = wait_state(gw, job, "running", "succeeded")
        done = wait_state(gw, job, "succeeded")
        assert done["started_at"] and done["ended_at"] > done["started_at"], done
        assert [e["to_state"] for e in state_events(gw, job)][:3] == ["pending", "dispatching", "queued"]
        assert running["state"] == "succeeded" or via(gw, job, "running") == "watch"
        assert via(gw, job, "succeeded") == "watch"
        # charged from the real times the watch reported
        (usage,) = usage_entries(gw, job)
        assert usage.gpu_seconds >= 8 * 4, usage.gpu_seconds  # 8 GPUs for at least ~5 s


def test_cancels_on_the_cluster_and_through_the_gateway_are_prompt(database_url, dev_key_path, kube):
    with running_gateway(database_url, dev_key_path, kube) as gw:
        outside, inside = submit(gw), submit(gw)  # no run-for label: they run until cancelled
        for job in (outside, inside):
            wait_state(gw, job, "running")
        # an operator cancels one on the cluster itself: the watch reports it
        backend_job_id = job_state(gw, outside, "running")["backend_job_id"]
        gw.app.state.backends["kubernetes"].cancel(backend_job_id)
        cancelled = wait_state(gw, outside, "cancelled")
        assert via(gw, outside, "cancelled") == "watch"
        assert cancelled["ended_at"], cancelled
        # a cancel through the API wakes the reconciler for its active call on the backend
        h = gw.headers("alice", ("team-a",))
        assert gw.client.post(f"/v1/jobs/{inside}/cancel", headers=h).json()["state"] == "cancelling"
        wait_state(gw, inside, "cancelled", timeout_s=20)
        with gw.session() as s:
            assert ledger_reading.verify(s) == []
            for job in (outside, inside):
                assert ledger_rules.charged_gpu_seconds(s, job_id=job) > 0  # both ran before the cancel


class BreakableFeed(KubernetesBackend):
    """The real Kubernetes backend whose change feed the test can break and keep down.

    Only the feed's failure is injected; the events come from the real control plane.
    """

    def __init__(self, settings: KubernetesSettings):
        super().__init__(settings)
        self.down = threading.Event()
        self.opened = 0
        self.refused = 0
        self._current: threading.Event | None = None

    def break_feed(self) -> None:
        self.down.set()
        if self._current is not None:
            self._current.set()  # ends the real stream

    def watch_events(self, stop_event, since_resource_version=None, interested=None):
        if self.down.is_set():
            self.refused += 1
            raise BackendUnavailable("feed down (test)", backend=self.name)
        inner = threading.Event()
        self._current = inner
        threading.Thread(target=lambda: (stop_event.wait(), inner.set()), daemon=True).start()
        stream = super().watch_events(inner, since_resource_version, interested)
        self.opened += 1
        return _Breakable(stream, stop_event, self.name)


class _Breakable:
    """Passes the real stream through; raises when it ends without the gateway asking."""

    def __init__(self, stream, outer: threading.Event, name: str):
        self.stream, self.outer, self.name = stream, outer, name

    @property
    def resource_version(self):  # the gateway resumes the reopened feed from here
        return self.stream.resource_version

    @property
    def caught_up(self):
        return self.stream.caught_up

    def __iter__(self):
        return self

    def __next__(self):
        try:
            return next(self.stream)
        except StopIteration:
            if not self.outer.is_set():
                raise BackendUnavailable("feed broken (test)", backend=self.name) from None
            raise


def test_a_reopened_watch_loses_no_transition(database_url, dev_key_path, kube):
    feed = BreakableFeed(KubernetesSettings(**kube_backend_options(kube)))
    with running_gateway(database_url, dev_key_path, kube, backend=feed) as gw:
        job = submit(gw, labels={KWOK_RUN_FOR: "6s"})
        wait_state(gw, job, "running")
        feed.break_feed()
        wait_until(lambda: not gw.app.state.dispatcher.watch_live("kubernetes"), 10, "the feed did not break")
        # While the feed is down (each reopen refused), the job finishes on the cluster.
        backend_job_id = job_state(gw, job, "running")["backend_job_id"]
        wait_until(lambda: feed.status(backend_job_id).state.value == "succeeded", 60, "job did not finish")
        wait_until(lambda: feed.refused >= 2, 20, "the reconciler did not retry the feed")
        assert job_state(gw, job, "running"), "the registry moved without the feed"
        feed.down.clear()
        wait_state(gw, job, "succeeded", timeout_s=PROMPT_S + 10)  # backoff is capped at 30 s
        assert via(gw, job, "succeeded") == "watch"
        assert feed.opened >= 2 and gw.app.state.dispatcher.watch_live("kubernetes")
        (usage,) = usage_entries(gw, job)
        assert usage.gpu_seconds > 0


def test_preempted_gang_is_charged_for_its_runs_not_for_the_wait(database_url, dev_key_path, kube):
    """Kueue preempts a low-priority gang for a high-priority one and requeues it; the
    watch reports it, and the ledger charges the two runs but not the time in between.
    Priority classes are the accounts' (an admin setting, docs/kubernetes.md): team-a runs
    at the low class, team-b at the high one."""
    with running_gateway(database_url, dev_key_path, kube, pool_queue_depth=4) as gw:
        admin = gw.headers("root", (), admin=True)
        for account, cls in (("team-a", "isthmus-low"), ("team-b", "isthmus-high")):
            r = gw.client.patch(f"/v1/admin/accounts/{account}", json={"priority_class": cls}, headers=admin)
            assert r.status_code == 200, r.text
        try:
            _preempt_and_check(gw)
        finally:
            for account in ("team-a", "team-b"):
                gw.client.patch(f"/v1/admin/accounts/{account}", json={"priority_class": None}, headers=admin)


def _preempt_and_check(gw):
    low = submit(gw, workers=4, gpus_per_worker=8)  # the whole ClusterQueue
    wait_state(gw, low, "running", timeout_s=60)
    high = submit(gw, account="team-b", workers=1, gpus_per_worker=8, labels={KWOK_RUN_FOR: "8s"})
    requeued = wait_state(gw, low, "requeued", "queued", timeout_s=60)
    assert requeued["started_at"] is None, requeued  # the next run records its own start
    wait_state(gw, high, "succeeded", timeout_s=60)
    wait_state(gw, low, "running", timeout_s=60)  # re-admitted once high is done
    time.sleep(2)
    h = gw.headers("alice", ("team-a",))
    assert gw.client.post(f"/v1/jobs/{low}/cancel", headers=h).json()["state"] == "cancelling"
    done = wait_state(gw, low, "cancelled", timeout_s=30)

    states = [e["to_state"] for e in state_events(gw, low)]
    assert states[states.index("running"):].count("running") == 2, states
    assert "requeued" in states and via(gw, low, "requeued") == "watch", states
    first, last = usage_entries(gw, low)
    assert first.data["requeued"] is True
    run1 = (_t(first.data["ended_at"]) - _t(first.data["started_at"])).total_seconds()
    run2 = (_t(last.data["ended_at"]) - _t(last.data["started_at"])).total_seconds()
    waited = (_t(last.data["started_at"]) - _t(first.data["ended_at"])).total_seconds()
    assert waited >= 5, waited  # high ran 8 s meanwhile
    with gw.session() as s:
        charged = ledger_rules.charged_gpu_seconds(s, job_id=low)
        assert ledger_reading.verify(s) == []
    assert abs(charged - 32 * (run1 + run2)) <= 2 * 32, (charged, run1, run2)
    whole = (_t(done["ended_at"]) - _t(first.data["started_at"])).total_seconds()
    assert charged < 32 * (whole - waited + 2), (charged, whole, waited)  # the wait was not charged
    # Kueue's own preemption is an attempt of its own (docs/recovery.md, "Backend preemption"),
    # charged as its run was; the same Kueue Job ran the next attempt.
    job = gw.client.get(f"/v1/jobs/{low}", headers=h).json()
    (attempt,) = job["attempts"]
    assert job["attempt"] == 2 and attempt["outcome"] == "preempted", job
    assert attempt["backend_job_id"] == job["backend_job_id"] and attempt["reason"].startswith("requeued by"), attempt
    assert abs(attempt["charged_gpu_hours"] * 3600 - 32 * run1) <= 2 * 32, (attempt, run1)


def _t(value):
    from datetime import datetime

    from gateway.kit.timeutil import as_utc

    return as_utc(datetime.fromisoformat(value) if isinstance(value, str) else value)
