"""Two pools on the one control plane (stack/kube/up.sh): ClusterQueue ``isthmus-gpu`` over
the a100 nodes and ``isthmus-h100`` over the h100 nodes, each ResourceFlavor selecting its
nodes by the GPU product label. Each pool's capacity counts only its own nodes, and a job
queued on one pool runs on that pool's nodes."""

from __future__ import annotations

import uuid

import pytest

from adapters.base import BackendState

from .conftest import FAKE_RUN_FOR, request
from .test_gang import wait_state

pytestmark = [pytest.mark.kubernetes, pytest.mark.usefixtures("clean")]


# ``h100``: the second pool's backend (tests/backends/kubernetes/conftest.py).


def test_each_pool_counts_only_its_own_nodes(backend, h100, kube_env):
    (a,) = backend.capacity().pools
    (h,) = h100.capacity().pools
    per_node = int(kube_env["ISTHMUS_KUBE_GPUS_PER_NODE"])
    assert (a.total_nodes, a.total_gpus, a.gpu_types) == (
        int(kube_env["ISTHMUS_KUBE_NODES"]), int(kube_env["ISTHMUS_KUBE_GPU_QUOTA"]), (kube_env["ISTHMUS_KUBE_GPU_TYPE"],))
    assert (h.total_nodes, h.total_gpus, h.gpu_types) == (
        int(kube_env["ISTHMUS_KUBE_H100_NODES"]), int(kube_env["ISTHMUS_KUBE_H100_GPU_QUOTA"]),
        (kube_env["ISTHMUS_KUBE_H100_GPU_TYPE"],))
    assert a.gpus_per_node == h.gpus_per_node == per_node


def test_a_job_on_the_second_pool_runs_on_its_nodes(h100, kube, accounts, kube_env):
    job = h100.submit(request(f"h100-{uuid.uuid4().hex[:8]}", account=accounts[0], workers=2, gpus=8,
                              labels={FAKE_RUN_FOR: "30s"})).backend_job_id
    wait_state(h100, job, {BackendState.RUNNING})
    pods = kube.pods_of(job)
    assert len(pods) == 2 and all(p.spec.node_name.startswith("kwok-h100-") for p in pods), \
        [p.spec.node_name for p in pods]
    assert h100.capacity().pools[0].free_gpus == int(kube_env["ISTHMUS_KUBE_H100_GPU_QUOTA"]) - 16
    h100.cancel(job)
