"""stack/pools.py: the pools file (ISTHMUS_POOLS_FILE) for the test stack's systems."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
FIVE = ["slurm-22", "slurm-24", "slurm-26", "kube-a100", "kube-h100"]
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def _fake_stack(root: Path) -> Path:
    for i, version in enumerate(("22.05", "24.11", "25.11", "26.05")):
        d = root / f"slurm-{version}"
        d.mkdir(parents=True)
        (d / "env").write_text(
            f"SLURMRESTD_URL='http://127.0.0.1:{16820 + 100 * i}'\nSLURM_JWT_KEY='{d}/jwt.key'\n"
            f"SLURM_PARTITION='gpu'\nSLURM_WORK_DIR='{d}/work'\nSLURM_CONF='{d}/slurm.conf'\n")
    (root / "kube").mkdir()
    (root / "kube" / "env").write_text(
        f"KUBECONFIG={root}/kube/kubeconfig\nISTHMUS_KUBE_CLUSTER_QUEUE=isthmus-gpu\nISTHMUS_KUBE_LOCAL_QUEUE=isthmus\n"
        "ISTHMUS_KUBE_GPU_TYPE=a100\nISTHMUS_KUBE_H100_CLUSTER_QUEUE=isthmus-h100\n"
        "ISTHMUS_KUBE_H100_LOCAL_QUEUE=isthmus-h100\nISTHMUS_KUBE_H100_GPU_TYPE=h100\n")
    return root


def _pools(stack_dir: Path) -> list[dict]:
    out = subprocess.run([sys.executable, str(REPO / "stack" / "pools.py"), str(stack_dir)],
                         capture_output=True, text=True, check=True, cwd="/").stdout
    doc = yaml.safe_load(out)
    assert set(doc) == {"pools"}
    return doc["pools"]


def _queue(pool: dict) -> tuple:
    s = pool["settings"]
    return (s["rest_url"], s["partition"]) if pool["kind"] == "slurm" else (s["kubeconfig"], s["cluster_queue"])


def _check_five(pools: list[dict]) -> None:
    assert [p["name"] for p in pools] == FIVE
    assert all(DNS_LABEL.fullmatch(p["name"]) for p in pools)
    assert [p["kind"] for p in pools] == ["slurm"] * 3 + ["kubernetes"] * 2
    assert len({_queue(p) for p in pools}) == 5, [_queue(p) for p in pools]
    for p in pools:
        assert set(p) <= {"name", "kind", "gpu_types", "weight", "cost", "settings"}
        keys = {"transport", "rest_url", "jwt_key_path", "partition", "work_dir", "slurm_conf"} \
            if p["kind"] == "slurm" else {"kubeconfig", "cluster_queue", "local_queue"}
        assert set(p["settings"]) == keys


def test_the_pools_file_names_five_pools_with_distinct_queues(tmp_path):
    pools = _pools(_fake_stack(tmp_path))
    _check_five(pools)
    assert [p.get("gpu_types") for p in pools[3:]] == [["a100"], ["h100"]]
    assert pools[0]["settings"]["rest_url"] == "http://127.0.0.1:16820"  # 22.05, not 25.11
    assert pools[2]["settings"]["rest_url"] == "http://127.0.0.1:17120"  # 26.05


def test_systems_that_are_not_up_are_left_out(tmp_path):
    (tmp_path / "slurm-24.11").mkdir()
    (tmp_path / "slurm-24.11" / "env").write_text(
        "SLURMRESTD_URL='http://127.0.0.1:16920'\nSLURM_JWT_KEY='k'\nSLURM_PARTITION='gpu'\n"
        "SLURM_WORK_DIR='w'\nSLURM_CONF='c'\n")
    assert [p["name"] for p in _pools(tmp_path)] == ["slurm-24"]


def test_the_running_stack_gives_five_pools():
    stack = REPO / ".stack"
    needed = [stack / f"slurm-{v}" / "env" for v in ("22.05", "24.11", "26.05")] + [stack / "kube" / "env"]
    if not all(p.exists() for p in needed) or "ISTHMUS_KUBE_H100_CLUSTER_QUEUE" not in needed[-1].read_text():
        if os.environ.get("ISTHMUS_REQUIRE_STACK") == "1":
            pytest.fail("the stack is not up with its five pools (ISTHMUS_REQUIRE_STACK=1)")
        pytest.skip("the stack is not up with its five pools")
    _check_five(_pools(stack))
