"""Pod hardening read back from the API server (issue #12, finding 9): no service-account
token, non-root (as the mapped uid where known), no privilege escalation, and a request's
labels never pose as the Job controller's or the gateway's."""

from __future__ import annotations

import dataclasses
import time
import uuid

import pytest

from adapters.kubernetes import KubernetesBackend

from .conftest import request

pytestmark = [pytest.mark.kubernetes, pytest.mark.usefixtures("clean")]


@pytest.fixture
def mapped(settings):
    b = KubernetesBackend(dataclasses.replace(settings, uid_map={"alice": 1001}))
    yield b
    b.close()


def _pods(kube, backend_job_id, n, timeout_s=45.0):
    deadline = time.monotonic() + timeout_s
    while True:
        pods = kube.pods_of(backend_job_id)
        if len(pods) >= n:
            return pods
        assert time.monotonic() < deadline, f"{backend_job_id}: {len(pods)} of {n} pods after {timeout_s}s"
        time.sleep(0.3)


def _check_hardened(pod_spec, uid):
    assert pod_spec.automount_service_account_token is False
    sc = pod_spec.security_context
    assert sc.run_as_non_root is True
    assert sc.run_as_user == uid
    assert sc.seccomp_profile.type == "RuntimeDefault"
    (c,) = pod_spec.containers
    assert c.security_context.allow_privilege_escalation is False
    assert c.security_context.privileged is False
    assert c.security_context.capabilities.drop == ["ALL"]
    # no token volume was injected by the ServiceAccount admission plugin either
    assert not any((v.projected is not None and any(s.service_account_token for s in v.projected.sources or []))
                   for v in pod_spec.volumes or []), pod_spec.volumes


def test_pods_are_hardened_and_run_as_the_mapped_uid(mapped, kube, accounts):
    gid = f"hard-{uuid.uuid4().hex[:8]}"
    job_id = mapped.submit(request(gid, account=accounts[0], workers=2, gpus=1)).backend_job_id
    ns, name = job_id.split("/")
    job = kube.batch.read_namespaced_job(name, ns)
    _check_hardened(job.spec.template.spec, 1001)
    for pod in _pods(kube, job_id, 2):  # admitted by Kueue, created by the Job controller
        _check_hardened(pod.spec, 1001)


def test_an_unmapped_user_still_runs_non_root(backend, kube, accounts):
    gid = f"hard-{uuid.uuid4().hex[:8]}"
    job_id = backend.submit(request(gid, account=accounts[0], workers=1, gpus=1)).backend_job_id
    (pod,) = _pods(kube, job_id, 1)
    _check_hardened(pod.spec, None)


def test_request_labels_cannot_pose_as_the_job_controllers_or_the_gateways(backend, kube, accounts):
    gid = f"hard-{uuid.uuid4().hex[:8]}"
    hostile = {"job-name": "someone-else", "controller-uid": "0000", "isthmus.io/account": "team-b",
               "batch.kubernetes.io/job-name": "someone-else", "kueue.x-k8s.io/queue-name": "other"}
    job_id = backend.submit(request(gid, account=accounts[0], workers=1, gpus=1, labels=hostile)).backend_job_id
    ns, name = job_id.split("/")
    job = kube.batch.read_namespaced_job(name, ns)
    (pod,) = _pods(kube, job_id, 1)
    for labels in (job.metadata.labels, pod.metadata.labels):
        assert labels.get("isthmus.io/account") == accounts[0]
        assert labels.get("kueue.x-k8s.io/queue-name", kube.settings.local_queue) == kube.settings.local_queue
    # the Job controller's own labels point at this Job
    assert pod.metadata.labels["job-name"] == name
    assert pod.metadata.labels["batch.kubernetes.io/job-name"] == name
    assert pod.metadata.labels["controller-uid"] == job.metadata.uid
