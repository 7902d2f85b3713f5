"""Priority on Kubernetes through the gateway (issue #12, finding 4): a user's job priority
orders jobs within their account only; the cluster-wide WorkloadPriorityClass, which decides
whom the shared ClusterQueue preempts, is the account's, set by an administrator."""

from __future__ import annotations

import time

import pytest

from tests.dispatch.conftest import (
    drive_until,
    job_state,
    kube_backend_options,
    wired_gateway,
)

pytestmark = pytest.mark.kubernetes


@pytest.fixture
def gw(database_url, dev_key_path, kube):
    # pool_queue_depth: hand jobs to Kueue even when the pool is full, so Kueue decides.
    with wired_gateway(database_url, dev_key_path, {"kubernetes": kube_backend_options(kube)},
                                     pool_queue_depth=5) as gw:
        yield gw


@pytest.fixture(scope="module")
def kueue(kube):
    from kubernetes import client, config

    api = config.new_client_from_config(config_file=kube["KUBECONFIG"])
    yield client.CustomObjectsApi(api)
    api.close()


def submit(gw, account, user, **spec):
    body = {"name": "prio", "account": account, "backend": "kubernetes", "workers": 1, "gpus_per_worker": 8,
            "command": ["python", "train.py"], "time_limit": "10m", **spec}
    r = gw.client.post("/v1/jobs", json=body, headers=gw.headers(user, (account,)))
    assert r.status_code == 202, r.text
    return r.json()["id"]


def workload_of(kueue, backend_job_id):
    ns, name = backend_job_id.split("/")
    for wl in kueue.list_namespaced_custom_object("kueue.x-k8s.io", "v1beta2", ns, "workloads")["items"]:
        if any(o.get("name") == name for o in wl["metadata"].get("ownerReferences") or []):
            return wl
    return None


def class_of(wl):
    """The Workload's WorkloadPriorityClass (v1beta2: priorityClassRef; v1beta1: priorityClassName)."""
    return (wl["spec"].get("priorityClassRef") or {}).get("name") or wl["spec"].get("priorityClassName")


def test_a_users_priority_cannot_preempt_another_account_but_the_accounts_class_can(gw, kueue):
    admin = gw.headers("root", (), admin=True)
    # team-b fills the whole ClusterQueue (4 x 8 of 32 GPUs) at the default class.
    b = submit(gw, "team-b", "bob", workers=4)
    drive_until(gw, lambda: job_state(gw, b, "running"), timeout_s=90)

    # alice in team-a asks for the highest priority there is.
    a = submit(gw, "team-a", "alice", priority=1000)
    queued = drive_until(gw, lambda: job_state(gw, a, "queued"), timeout_s=60)
    wl = drive_until(gw, lambda: workload_of(kueue, queued["backend_job_id"]), timeout_s=30)
    assert class_of(wl) == "isthmus-normal", wl["spec"]
    deadline = time.monotonic() + 8  # Kueue preempts within a second or two when it will
    while time.monotonic() < deadline:
        gw.app.state.dispatcher.run_once()
        time.sleep(0.5)
    assert job_state(gw, b, "running"), "team-b's gang was preempted by a user's priority in team-a"
    assert job_state(gw, a, "queued")

    # An administrator gives team-a a higher class: now its jobs may preempt team-b's.
    r = gw.client.patch("/v1/admin/accounts/team-a", json={"priority_class": "isthmus-high"}, headers=admin)
    assert r.status_code == 200 and r.json()["priority_class"] == "isthmus-high", r.text
    a2 = submit(gw, "team-a", "alice", priority=-1000)
    running = drive_until(gw, lambda: job_state(gw, a2, "running"), timeout_s=90)
    assert class_of(workload_of(kueue, running["backend_job_id"])) == "isthmus-high"
    drive_until(gw, lambda: job_state(gw, b, "requeued", "queued"), timeout_s=30)
