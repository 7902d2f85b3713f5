"""The README's Kubernetes first-job example, run literally against the Kueue test pool's
real node (stack/kube/node.sh): a real container, whose own output comes back.

As tests/e2e/test_readme.py does for Slurm: the block is read from README.md, and what
`make run-kube` does is done here the same way (ISTHMUS_BACKENDS from
stack/backends_json.py kube-node) on a free port, in a fresh home and a directory outside the clone.
"""

from __future__ import annotations

import json
import os
import re

import pytest

from adapters.envfile import read_env_file
from tests.conftest import REPO
from tests.e2e.test_readme import newcomer_gateway, readme_blocks, run_block

pytestmark = pytest.mark.kubernetes


@pytest.fixture(scope="module")
def readme_kube_gateway(tmp_path_factory):
    if not (REPO / ".stack" / "kube" / "node.env").exists():
        if os.environ.get("ISTHMUS_REQUIRE_STACK") == "1":
            pytest.fail(".stack/kube/node.env missing (ISTHMUS_REQUIRE_STACK=1)")
        pytest.skip(".stack/kube/node.env missing: start stack/kube/up.sh and stack/kube/node.sh")
    with newcomer_gateway(tmp_path_factory, "kube-node") as gw:
        yield gw


def test_readme_kubernetes_example_runs_a_job_to_success(readme_kube_gateway):
    (block,) = readme_blocks("First job on the Kubernetes test pool")
    assert "make run-kube" in block
    r = run_block(readme_kube_gateway, block)
    assert r.returncode == 0, r.stdout + r.stderr
    docs = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    job = next(d for d in docs if "state" in d and "id" in d)
    assert job["state"] == "succeeded" and job["exit_code"] == 0, job
    node = read_env_file(REPO / ".stack" / "kube" / "node.env")
    assert job["assigned_backend"] == "kubernetes" and job["nodes"] == [node["ISTHMUS_KUBE_NODE_NAME"]], job
    # The container's own output: its hostname is its pod's name, its uid alice's.
    alice = dict(p.split("=") for p in node["ISTHMUS_KUBE_NODE_UID_MAP"].split(","))["alice"]
    (hello,) = [line for line in r.stdout.splitlines() if line.startswith("hello from ")]
    assert re.fullmatch(rf"hello from isthmus-[a-z0-9-]+, uid {alice}, Debian 12\.\d+", hello), hello
    pools = next(d for d in docs if "items" in d and d["items"] and "healthy" in d["items"][0])
    assert [(p["name"], p["healthy"]) for p in pools["items"]] == [("kubernetes", True)]
