"""The Helm chart installed for real on the stack's control plane and its real node (issue #47, item 4).

The gateway image (stack/images.sh, podman) is imported into the node's containerd the way
stack/kube/node.sh imports the worker image, keyed by podman's image id. The chart is
installed with Helm v4 (stack/kube/helm.sh) into a namespace of its own, against a fresh
database on the stack's Postgres, with one API pod, one dispatch worker and two pools: the
stack's Slurm 22.05 and Kueue on the real node (its kubeconfig and certificates from a Secret).
That Postgres and slurmrestd listen on loopback only, so the release
runs with hostNetwork and the API binds the node's private address (10.246.0.1, on the
loopback device: reachable from this machine only). The stack has no kube-proxy, so the test
does what kube-proxy would do for the Service: it takes a ready endpoint from the Service's
EndpointSlice, which holds the API pods only once their /readyz passes, and submits there.
A job per pool must run there to the end, once, charged once.
"""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import wait_for
from tests.deploy.helm_support import (  # noqa: F401 (fixtures)
    CHART,
    FINAL,
    NODE_IP,
    SHAPES,
    helm,
    image,
    job_body,
    kube,
    release_namespace,
    slurm,
)

pytestmark = [pytest.mark.kubernetes, pytest.mark.slurm, pytest.mark.uses("podman")]
CONTAINER_UID = 10001


@pytest.fixture
def release(kube, helm, image, slurm, tmp_path):
    """One API pod and one dispatch worker, all on the node's network."""
    with release_namespace(kube, helm, slurm, tmp_path) as rel:
        rel.helm_run("install", CHART, rel.values(image))
        yield rel


def test_chart_installs_and_runs_jobs_on_slurm_and_kueue_submitted_through_the_service(kube, release):
    ns = release.ns
    # The migration hook ran before the API started: the schema is at head.
    assert release.query("select version_num from alembic_version")[0][0]
    # ... and was deleted on success (hook-succeeded), with its Secret.
    assert kube.get(f"/apis/batch/v1/namespaces/{ns}/jobs/gw-isthmus-migrate").status_code == 404
    assert kube.get(f"/api/v1/namespaces/{ns}/secrets/gw-isthmus-migrate").status_code == 404

    # The pod runs as the image's non-root user with a read-only root filesystem.
    (pod,) = release.pods("api")
    assert pod["spec"]["securityContext"]["runAsUser"] == CONTAINER_UID
    assert pod["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True

    # What kube-proxy would do for Service gw-isthmus: a ready endpoint of its EndpointSlice.
    url = release.endpoint()
    assert url == f"http://{NODE_IP}:{release.port}"
    ready = httpx.get(f"{url}/readyz", timeout=10)
    assert ready.status_code == 200 and ready.json()["database"] == "ok", ready.text

    headers = {"Authorization": f"Bearer {release.token}"}
    jobs = {}
    for pool in SHAPES:
        r = httpx.post(f"{url}/v1/jobs", json=job_body(pool, f"helm-{pool}"), headers=headers, timeout=30)
        assert r.status_code == 202, r.text
        jobs[pool] = r.json()["id"]

    # The release's dispatch worker sends each to its pool (the stack's Slurm 22.05; Kueue
    # on the real node, where it runs in containerd), where it runs to the end.
    def final(job):
        j = httpx.get(f"{url}/v1/jobs/{job}", headers=headers, timeout=10).json()
        return j if j["state"] in FINAL else None

    for pool, job in jobs.items():
        done = wait_for(lambda job=job: final(job), 180, f"the job on {pool} to end", release.diag)
        assert done["state"] == "succeeded" and done["exit_code"] == 0 and done["backend_job_id"], (pool, done)
        kinds = [k for (k,) in release.query("select kind from ledger_entry where job_id = :j", j=job)]
        assert kinds.count("reserve") == 1 and kinds.count("start") == 1 and kinds.count("usage") == 1, (pool, kinds)
    assert release.query("select count(*) from job")[0][0] == 2
