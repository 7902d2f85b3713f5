"""The lanes (tests/lanes.py): which shared systems a test holds, that two workers never hold
one at once, and that a cluster a module takes is idle whatever the module before it left."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import slurm_cli
from tests.conftest import REPO
from tests.dispatch.conftest import slurm_env
from tests.lanes import _settle_slurm

SUITE = '''
import json, os, time
import pytest

def record(name):
    path = os.environ["LANES_LOG"]
    start = time.time()
    time.sleep(0.3)
    with open(path, "a") as fh:
        fh.write(json.dumps({"test": name, "worker": os.environ.get("PYTEST_XDIST_WORKER"),
                             "start": start, "end": time.time()}) + "\\n")
'''


def _module(name: str, marks: str, n: int = 3) -> str:
    body = "".join(f"def test_{name}_{i}():\n    record({name!r})\n\n" for i in range(n))
    return f"from conftest import record\nimport pytest\npytestmark = [{marks}]\n\n{body}"


def _suite(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(SUITE)
    (tmp_path / "pytest.ini").write_text("[pytest]\naddopts = --strict-markers\nmarkers =\n  kubernetes\n  oidc\n")


def _run(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.lanes", "-p", "no:cacheprovider", "-q", *args, str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO), "LANES_LOG": str(tmp_path / "log.jsonl"),
             "ISTHMUS_LANES_DIR": str(tmp_path / "locks"), "ISTHMUS_LANES_SETTLE": "0", **env})


def test_modules_sharing_a_cluster_never_overlap_and_a_two_cluster_module_holds_both(tmp_path):
    _suite(tmp_path)
    modules = {
        "a": 'pytest.mark.slurm("24.11")', "b": 'pytest.mark.slurm("24.11")',
        "c": "pytest.mark.kubernetes", "d": "pytest.mark.kubernetes",
        "e": 'pytest.mark.slurm("24.11"), pytest.mark.kubernetes',
        "f": 'pytest.mark.slurm("26.05")', "g": "pytest.mark.oidc", "h": "pytest.mark.oidc",
    }
    holds = {"a": {"slurm-24.11"}, "b": {"slurm-24.11"}, "c": {"kube"}, "d": {"kube"},
             "e": {"slurm-24.11", "kube"}, "f": {"slurm-26.05"}, "g": {"oidc"}, "h": {"oidc"}}
    for name, marks in modules.items():
        (tmp_path / f"test_{name}.py").write_text(_module(name, marks))
    done = _run(tmp_path, "-n", "4", "--dist", "loadgroup")
    assert done.returncode == 0, done.stdout + done.stderr
    runs = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert len(runs) == 3 * len(modules)
    by_module: dict[str, tuple[float, float]] = {}
    for r in runs:
        s, e = by_module.get(r["test"], (r["start"], r["end"]))
        by_module[r["test"]] = (min(s, r["start"]), max(e, r["end"]))
    clashes = [(x, y) for x in modules for y in modules if x < y and holds[x] & holds[y]
               and by_module[x][0] < by_module[y][1] and by_module[y][0] < by_module[x][1]]
    assert clashes == [], f"modules holding one system ran at once: {clashes}"


def test_an_unknown_system_name_is_refused_at_collection(tmp_path):
    _suite(tmp_path)
    (tmp_path / "test_x.py").write_text(_module("x", 'pytest.mark.uses("slurm-99")', n=1))
    done = _run(tmp_path)
    assert done.returncode != 0 and "unknown shared system(s) ['slurm-99']" in done.stdout + done.stderr


def test_an_order_other_than_the_known_ones_is_refused(tmp_path):
    _suite(tmp_path)
    (tmp_path / "test_x.py").write_text(_module("x", "", n=1))
    done = _run(tmp_path, ISTHMUS_TEST_ORDER="sideways")
    assert done.returncode != 0 and "use longest, reverse or random:<seed>" in done.stdout + done.stderr


@pytest.mark.slurm("22.05")
def test_a_slurm_cluster_taken_by_a_module_is_idle_whatever_an_earlier_one_left():
    """What an earlier module left (here: a job this test submits as if it had) is cancelled
    when the next module takes the cluster, and its nodes are idle again."""
    env = slurm_env("22.05")
    submitted = slurm_cli.run(env, "sbatch", "--parsable", f"--partition={env['SLURM_PARTITION']}", "--nodes=2",
                              "--exclusive", f"--chdir={env['SLURM_WORK_DIR']}", "--output=/dev/null", "--wrap",
                              "sleep 300")
    job = submitted.stdout.strip().split(";")[0]
    deadline = time.monotonic() + 30
    while "RUNNING" not in _squeue(env, job):
        assert time.monotonic() < deadline, "the leftover job never started"
        time.sleep(0.3)

    _settle_slurm("22.05")

    assert _squeue(env, job) == ""
    states = slurm_cli.run(env, "sinfo", "-h", "-N", "-p", env["SLURM_PARTITION"], "-o", "%T").stdout.split()
    assert states and all(s.rstrip("*") == "idle" for s in states), states


def _squeue(env, job: str) -> str:
    return slurm_cli.run(env, "squeue", "-h", "-j", job, "-o", "%T", check=False).stdout.strip()


def test_a_reports_group_is_the_last_at_sign_only_when_a_group_follows():
    from tests.lanes import split_group

    assert split_group("tests/a.py::t[x]@slurm-22.05+kube") == ("tests/a.py::t[x]", "slurm-22.05+kube")
    assert split_group("tests/w.py::t[user@93.184.215.14/hook]@tests.w") == ("tests/w.py::t[user@93.184.215.14/hook]",
                                                                            "tests.w")
    assert split_group("tests/w.py::t[user@93.184.215.14/hook]") == ("tests/w.py::t[user@93.184.215.14/hook]", "")
