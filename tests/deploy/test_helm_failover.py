"""Failover under load on the real Helm deployment (issue #47, item 5, first half).

The chart is installed as in test_helm_install (tests/deploy/helm_support.py), with two API
pods and two dispatch workers. The API pods are in the pod network (``api.hostNetwork:
false``: an address each, so two on the one real node) and reach the stack's loopback
Postgres through the test's relay; the workers and the migration stay on the node's network
(slurmrestd and the control plane listen on loopback), with no health port so that two fit on
one node. A client submits short jobs to Slurm and Kueue, each with its own Idempotency-Key,
to a ready endpoint of the Service, retrying the same key on connection errors and 502/503/504.
Meanwhile one API pod's and one worker pod's process get SIGKILL on this machine (the pods run
on it: the container's PID from containerd), and kubelet restarts them.

Then: every accepted key is exactly one job, which ended succeeded; each job reached its pool
once (Slurm: the cluster's jobs carrying its id; Kueue: the batch Jobs labelled with it) and
was reserved, started and charged once; no other job exists; ``ledger.verify()`` is empty;
the client saw no answer but success and retriable ones.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from tests.conftest import wait_for
from tests.deploy.helm_support import (  # noqa: F401 (fixtures)
    CHART,
    CTR,
    Release,
    Submitter,
    check_jobs_once_and_balanced,
    helm,
    image,
    kube,
    release_namespace,
    run,
    slurm,
)

pytestmark = [pytest.mark.kubernetes, pytest.mark.slurm, pytest.mark.uses("podman")]
# A killed worker's claims are taken over when their lease ends: 20 s, not the default 120.
SETTINGS = {"DISPATCH_LEASE_S": 20}


@pytest.fixture
def release(kube, helm, image, slurm, tmp_path):
    with release_namespace(kube, helm, slurm, tmp_path, forward_db=True) as rel:
        rel.helm_run("install", CHART, rel.values(image, api_replicas=2, worker_replicas=2, api_pod_network=True,
                                                  settings=SETTINGS, worker={"healthPort": 0}))
        yield rel


def kill_9(release: Release, pod: dict) -> int:
    """kill -9 of the pod's container process on this machine (the real node); its PID."""
    cid = pod["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1]
    tasks = run(*CTR, "tasks", "ls").stdout.splitlines()
    pid = next(int(line.split()[1]) for line in tasks if line.split() and line.split()[0] == cid)
    os.kill(pid, signal.SIGKILL)
    return pid


def restarts(pod: dict) -> int:
    return sum(c.get("restartCount", 0) for c in pod["status"].get("containerStatuses") or [])


def killed_by_sigkill(pod: dict) -> bool:
    last = (pod["status"].get("containerStatuses") or [{}])[0].get("lastState", {}).get("terminated") or {}
    return last.get("exitCode") == 137


def test_kill_9_of_an_api_pod_and_a_worker_pod_under_load_loses_and_repeats_nothing(release):
    wait_for(lambda: len(release.endpoints()) == 2, 90, "both API pods ready", release.diag)
    sub = Submitter(release, ["slurm", "slurm", "kube-node", "slurm"], interval_s=0.8)
    t0 = time.monotonic()
    sub.start()
    try:
        wait_for(lambda: len(sub.accepted) >= 6, 60, "the client's first jobs", release.diag)
        api_pod, worker_pod = release.pods("api")[0], release.pods("worker")[0]
        kill_9(release, api_pod)
        kill_9(release, worker_pod)
        killed_at = len(sub.accepted)

        def back(component, name):
            pod = next((p for p in release.pods(component) if p["metadata"]["name"] == name), None)
            return pod and restarts(pod) >= 1 and killed_by_sigkill(pod) and all(
                c.get("ready") for c in pod["status"]["containerStatuses"])

        # kubelet restarts both (the same pods, not new ones); the client goes on meanwhile.
        wait_for(lambda: back("api", api_pod["metadata"]["name"]), 120, "the killed API pod back", release.diag)
        wait_for(lambda: back("worker", worker_pod["metadata"]["name"]), 120, "the killed worker back", release.diag)
        wait_for(lambda: len(release.endpoints()) == 2, 60, "both API pods ready again", release.diag)
        wait_for(lambda: len(sub.accepted) >= killed_at + 5, 60, "jobs after the restarts", release.diag)
    finally:
        sub.stop.set()
        sub.join(150)
    load_s = time.monotonic() - t0

    assert not sub.is_alive(), "the client did not stop"
    assert sub.not_retriable() == [], sub.not_retriable()
    pools = check_jobs_once_and_balanced(release, sub, timeout_s=180)
    assert set(pools.values()) == {"slurm", "kube-node"}, pools
    retried = [a for _, a in sub.answers if a not in ("200", "202")]
    print(f"{len(pools)} jobs in {load_s:.0f} s of load; answers other than 200/202: {retried}")
