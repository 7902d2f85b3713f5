"""Gang admission through Kueue on the real control plane (kwok fake GPU nodes).

The pool: 4 nodes x 8 GPUs, ClusterQueue quota 32 GPUs, preemption LowerPriority.
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from adapters.base import BackendState
from adapters.kubernetes.render import render_job

from .conftest import FAKE_RUN_FOR, REPO, SEED_LABEL, request

pytestmark = [pytest.mark.kubernetes, pytest.mark.usefixtures("clean")]


def gid(tag: str) -> str:
    return f"{tag}-{uuid.uuid4().hex[:8]}"


def wait_state(backend, job_id, states, timeout_s=45.0):
    deadline = time.monotonic() + timeout_s
    while True:
        st = backend.status(job_id)
        if st.state in states:
            return st
        if time.monotonic() > deadline:
            raise AssertionError(f"{job_id} not in {states} after {timeout_s}s: {st}")
        time.sleep(0.3)


def fill(backend, n_gpus: int, accounts) -> list[str]:
    """Occupy n_gpus with long single-node 8-GPU jobs; return their ids once running."""
    ids = [backend.submit(request(gid("blocker"), account=accounts[1], workers=1, gpus=8)).backend_job_id
           for _ in range(n_gpus // 8)]
    for i in ids:
        wait_state(backend, i, {BackendState.RUNNING})
    return ids


def test_gang_waits_with_zero_pods_until_capacity_frees(backend, kube, accounts):
    blockers = fill(backend, 24, accounts)
    big = backend.submit(request(gid("gang"), account=accounts[0], workers=4, gpus=8)).backend_job_id
    time.sleep(3)  # several Kueue scheduling cycles
    st = backend.status(big)
    assert st.state is BackendState.QUEUED, st
    assert "insufficient" in st.reason.lower() or "quota" in st.reason.lower(), st.reason
    assert kube.pods_of(big) == []  # not one worker holds a GPU while waiting
    assert st.allocated_gpus == 0
    assert backend.capacity().free_gpus == 8

    for b in blockers:
        backend.cancel(b)
    st = wait_state(backend, big, {BackendState.RUNNING})
    pods = kube.pods_of(big)
    assert len(pods) == 4 and all(p.status.phase == "Running" for p in pods)
    assert len(st.nodes) == 4 and st.allocated_gpus == 32
    assert st.started_at is not None


def test_job_over_cluster_queue_quota_stays_pending_in_kueue(backend, kube, settings, accounts):
    # The adapter refuses it up front ...
    too_many = request(gid("overquota"), account=accounts[0], workers=5, gpus=8)
    from adapters.base import SubmissionRejected
    with pytest.raises(SubmissionRejected, match="quota of 32"):
        backend.submit(too_many)
    # ... and Kueue itself never admits the same Job created behind the adapter's back.
    body = render_job(too_many, settings)
    kube.batch.create_namespaced_job(body["metadata"]["namespace"], body)
    job_id = f"{body['metadata']['namespace']}/{body['metadata']['name']}"
    time.sleep(4)
    st = backend.status(job_id)
    assert st.state is BackendState.QUEUED, st
    assert st.reason, st
    assert kube.pods_of(job_id) == []


def test_cancel_removes_pods_and_releases_quota(backend, kube, accounts):
    job = backend.submit(request(gid("cancel"), account=accounts[2], workers=2, gpus=4)).backend_job_id
    wait_state(backend, job, {BackendState.RUNNING})
    assert len(kube.pods_of(job)) == 2
    backend.cancel(job)
    deadline = time.monotonic() + 30
    while kube.pods_of(job) and time.monotonic() < deadline:
        time.sleep(0.3)
    assert kube.pods_of(job) == []
    st = backend.status(job)
    assert st.state is BackendState.CANCELLED and st.ended_at is not None
    deadline = time.monotonic() + 30
    while kube.reserved_gpus() and time.monotonic() < deadline:
        time.sleep(0.3)
    assert kube.reserved_gpus() == 0
    assert backend.find_by_gateway_id(st.gateway_job_id).state is BackendState.CANCELLED


def test_failing_worker_fails_gang_and_frees_gpus(backend, kube, accounts):
    labels = {FAKE_RUN_FOR: "1s", "isthmus.io/fake-exit-code": "3"}
    job = backend.submit(request(gid("fail"), account=accounts[0], workers=2, gpus=8, labels=labels)).backend_job_id
    st = wait_state(backend, job, {BackendState.FAILED, BackendState.SUCCEEDED})
    assert st.state is BackendState.FAILED and st.exit_code == 3, st
    assert st.allocated_gpus == 0
    deadline = time.monotonic() + 30
    while kube.reserved_gpus() and time.monotonic() < deadline:
        time.sleep(0.3)
    assert kube.reserved_gpus() == 0


def test_preemption_by_higher_priority_is_reported_as_requeued(backend, kube, accounts):
    # The classes are the accounts' (admin-set in the gateway), never the requests' priority.
    stop = threading.Event()
    mine: set[str] = set()  # as the gateway does: the replay skips Jobs this test does not follow
    stream = backend.watch_events(stop, interested=mine.__contains__)
    seen: list = []

    def collect():
        for ev in stream:
            seen.append(ev)

    t = threading.Thread(target=collect, daemon=True)
    t.start()
    try:
        low = backend.submit(request(gid("low"), account=accounts[0], workers=4, gpus=8,
                                   priority_class="isthmus-low")).backend_job_id
        mine.add(low)
        wait_state(backend, low, {BackendState.RUNNING})
        high = backend.submit(request(gid("high"), account=accounts[1], workers=1, gpus=8,
                                    priority_class="isthmus-high")).backend_job_id
        mine.add(high)
        st = wait_state(backend, low, {BackendState.REQUEUED}, timeout_s=30)
        assert "preempt" in st.reason.lower() or "evict" in st.reason.lower(), st.reason
        wait_state(backend, high, {BackendState.RUNNING})
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not (
                any(e.backend_job_id == low and e.state is BackendState.REQUEUED for e in seen)
                and any(e.backend_job_id == high and e.state is BackendState.RUNNING for e in seen)):
            time.sleep(0.2)
        # The watch saw the preemption and the new gang start, without polling. It is
        # level-triggered (each event re-derives the Job's state when processed), so under
        # load it may skip low's brief RUNNING, which wait_state above already observed.
        low_states = [e.state for e in seen if e.backend_job_id == low]
        assert BackendState.REQUEUED in low_states, low_states
        assert any(e.backend_job_id == high and e.state is BackendState.RUNNING for e in seen)
        assert stream.resource_version
    finally:
        stop.set()
        t.join(timeout=5)


def test_watch_resumes_from_resource_version(backend, accounts):
    stop = threading.Event()
    mine: set[str] = set()
    first = backend.watch_events(stop, interested=mine.__contains__)
    job = backend.submit(request(gid("watch"), account=accounts[0], workers=1, gpus=1,
                                 labels={FAKE_RUN_FOR: "2s"})).backend_job_id
    mine.add(job)
    got = next(e for e in first if e.backend_job_id == job)
    rv = first.resource_version
    stop.set()
    assert got.state in (BackendState.QUEUED, BackendState.STARTING, BackendState.RUNNING)
    stop2 = threading.Event()
    resumed = backend.watch_events(stop2, since_resource_version=rv)
    try:
        deadline = time.monotonic() + 30
        for ev in resumed:
            if ev.backend_job_id == job and ev.state is BackendState.SUCCEEDED:
                break
            assert time.monotonic() < deadline
    finally:
        stop2.set()


def test_replay_skips_jobs_nobody_follows_but_live_changes_still_arrive(backend, accounts):
    """A gateway restarting against a cluster that keeps hundreds of finished Jobs must not
    re-derive each one's status (760 Jobs took 27 s): the replay skips Jobs the consumer does
    not follow; what happens after the listing is always delivered."""
    old = backend.submit(request(gid("old"), account=accounts[0], workers=1, gpus=1,
                                 labels={FAKE_RUN_FOR: "1s"})).backend_job_id
    wait_state(backend, old, {BackendState.SUCCEEDED})
    followed = backend.submit(request(gid("followed"), account=accounts[0], workers=1, gpus=1,
                                      labels={FAKE_RUN_FOR: "60s"})).backend_job_id
    stop = threading.Event()
    stream = backend.watch_events(stop, interested={followed}.__contains__)
    seen: list = []
    t = threading.Thread(target=lambda: [seen.append(e) for e in stream], daemon=True)
    t.start()
    try:
        deadline = time.monotonic() + 60
        while not (stream.caught_up and any(e.backend_job_id == followed for e in seen)):
            assert time.monotonic() < deadline, "the replay did not finish"
            time.sleep(0.2)
        assert not any(e.backend_job_id == old for e in seen)
        assert stream.skipped >= 1
        # a Job created after the listing is delivered although nobody said they follow it
        new = backend.submit(request(gid("new"), account=accounts[0], workers=1, gpus=1,
                                     labels={FAKE_RUN_FOR: "1s"})).backend_job_id
        deadline = time.monotonic() + 30
        while not any(e.backend_job_id == new for e in seen):
            assert time.monotonic() < deadline, "a live change was not delivered"
            time.sleep(0.2)
        backend.cancel(followed)
    finally:
        stop.set()
        t.join(timeout=5)


def test_seed_problem_without_kueue_binds_partial_gang(kube, settings, accounts, kube_env):
    """The deadlock the gateway prevents, reproduced with the default scheduler alone.

    8 GPUs are taken by something else; the same 4x8-GPU Job, created WITHOUT Kueue (no
    queue label, not suspended), gets 3 workers bound (24 GPUs idle-held) and 1 Pending
    forever: the gang cannot start and blocks everyone else.
    """
    ns = settings.namespace_for(accounts[0])
    # Without Kueue no flavor pins the pods: keep them on this pool's nodes (the control
    # plane has a second pool's nodes too, stack/kube/up.sh).
    product = kube_env.get("ISTHMUS_KUBE_GPU_TYPE")
    pin = {settings.gpu_type_label: product} if product else {}
    other = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "something-else", "labels": {SEED_LABEL: "other"}},
        "spec": {"restartPolicy": "Never", "nodeSelector": pin, "containers": [{
            "name": "c", "image": "isthmus/placeholder:latest",
            "resources": {"requests": {"nvidia.com/gpu": "8"}, "limits": {"nvidia.com/gpu": "8"}}}]},
    }
    kube.core.create_namespaced_pod(ns, other)
    body = render_job(request("seed-" + uuid.uuid4().hex[:6], account=accounts[0], workers=4, gpus=8), settings)
    body["metadata"]["labels"] = {SEED_LABEL: "gang"}  # no kueue.x-k8s.io/queue-name
    body["spec"]["template"]["metadata"]["labels"] = {SEED_LABEL: "gang"}
    body["spec"]["suspend"] = False
    body["spec"]["template"]["spec"]["nodeSelector"] = pin
    kube.batch.create_namespaced_job(ns, body)
    name = body["metadata"]["name"]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        pods = kube.pods_of(f"{ns}/{name}")
        bound = [p for p in pods if p.spec.node_name and p.status.phase == "Running"]
        pending = [p for p in pods if p.status.phase == "Pending" and not p.spec.node_name]
        if len(bound) == 3 and len(pending) == 1:
            break
        time.sleep(0.5)
    time.sleep(3)  # and it stays that way
    pods = kube.pods_of(f"{ns}/{name}")
    lines = [f"{'POD':44} {'PHASE':8} {'NODE':10} GPUS  REASON"]
    for p in sorted(pods, key=lambda p: p.metadata.annotations.get("batch.kubernetes.io/job-completion-index", "")):
        cond = next((c for c in p.status.conditions or [] if c.type == "PodScheduled"), None)
        why = "" if not cond or cond.status == "True" else f"{cond.reason}: {cond.message}"
        lines.append(f"{p.metadata.name:44} {p.status.phase:8} {p.spec.node_name or '-':10} "
                     f"{p.spec.containers[0].resources.requests['nvidia.com/gpu']:>4}  {why}")
    other_pod = kube.core.read_namespaced_pod("something-else", ns)
    lines.append(f"{'something-else (not part of the gang)':44} {other_pod.status.phase:8} {other_pod.spec.node_name:10}    8")
    report = "\n".join(lines)
    out = REPO / ".stack" / "kube" / "seed-problem.txt"
    out.write_text(report + "\n")
    print("\n" + report)
    bound = [p for p in pods if p.spec.node_name]
    assert len(bound) == 3, report
    assert len([p for p in pods if not p.spec.node_name]) == 1, report
