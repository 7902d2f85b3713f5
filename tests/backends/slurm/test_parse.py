"""Slurm JSON shapes -> contract types, for every data_parser version seen on the clusters.

The records are the fields the adapter reads, copied from real 22.05 (v0.0.38) and
24.11/26.05 (v0.0.42) answers; the cluster tests exercise the same code end to end.
"""

from __future__ import annotations

import shlex
import subprocess

import pytest

from adapters.base import BackendState, SubmissionRejected
from adapters.slurm.parse import (
    exit_code,
    expand_hostlist,
    job_status,
    map_state,
    pool_capacity,
)
from adapters.slurm.script import render_script


@pytest.mark.parametrize("names,state", [
    (["PENDING"], BackendState.QUEUED), (["CONFIGURING"], BackendState.STARTING),
    (["RUNNING", "CONFIGURING"], BackendState.STARTING), (["RUNNING"], BackendState.RUNNING),
    (["COMPLETING"], BackendState.RUNNING), (["COMPLETED"], BackendState.SUCCEEDED),
    (["FAILED"], BackendState.FAILED), (["NODE_FAIL"], BackendState.FAILED),
    (["OUT_OF_MEMORY"], BackendState.FAILED), (["TIMEOUT"], BackendState.FAILED),
    (["BOOT_FAIL"], BackendState.FAILED), (["DEADLINE"], BackendState.FAILED),
    (["CANCELLED"], BackendState.CANCELLED), (["CANCELLED", "COMPLETING"], BackendState.CANCELLED),
    (["PREEMPTED"], BackendState.REQUEUED), (["PENDING", "REQUEUED"], BackendState.REQUEUED),
    (["REQUEUE_HOLD"], BackendState.REQUEUED),
])
def test_state_map(names, state):
    assert map_state(names) is state


def test_exit_code_shapes():
    assert exit_code({"exit_code": 3 << 8}) == 3            # v0.0.38: raw wait status
    assert exit_code({"exit_code": 9}) == 128 + 9            # v0.0.38: killed by SIGKILL
    v42 = {"status": ["EXITED"], "return_code": {"set": True, "infinite": False, "number": 3},
           "signal": {"id": {"set": False, "infinite": False, "number": 0}, "name": ""}}
    assert exit_code({"exit_code": v42}) == 3
    sig = {"status": ["SIGNALED"], "return_code": {"set": True, "number": 0},
           "signal": {"id": {"set": True, "number": 15}, "name": "TERM"}}
    assert exit_code({"exit_code": sig}) == 143


def test_hostlists():
    assert expand_hostlist("gpu[1-4]") == ("gpu1", "gpu2", "gpu3", "gpu4")
    assert expand_hostlist("gpu[01-02,7],cpu1") == ("gpu01", "gpu02", "gpu7", "cpu1")
    assert expand_hostlist("") == ()


def test_pending_v038_and_running_v042():
    pending = job_status({"job_id": 5, "job_state": "PENDING", "state_reason": "Resources",
                          "comment": "isthmus:g1", "nodes": "", "start_time": 0, "end_time": 0})
    assert (pending.state, pending.reason, pending.gateway_job_id) == (BackendState.QUEUED, "Resources", "g1")
    assert pending.nodes == () and pending.allocated_gpus == 0
    running = job_status({"job_id": 6, "job_state": ["RUNNING"], "state_reason": "None",
                          "nodes": "gpu[1-2]", "tres_per_node": "gres/gpu:8",
                          "start_time": {"set": True, "number": 1700000000},
                          "end_time": {"set": True, "number": 1700003600}})
    assert running.nodes == ("gpu1", "gpu2") and running.allocated_gpus == 16
    assert running.ended_at is None and running.started_at.tzinfo is not None


def test_capacity_counts_only_idle_nodes_as_free():
    nodes = [{"name": f"gpu{i}", "state": s, "gres": "gpu:8", "partitions": ["gpu"], "alloc_cpus": a}
             for i, (s, a) in enumerate([("idle", 0), (["IDLE"], 0), (["ALLOCATED"], 8),
                                         (["IDLE", "DRAIN"], 0)])]
    (pool,) = pool_capacity(nodes)
    assert (pool.total_nodes, pool.idle_nodes, pool.total_gpus, pool.free_gpus) == (4, 2, 32, 16)


def test_script_quotes_every_word():
    argv = ["printf", "%s|", "$(id)", "`id`", "a'b", "x\ny", "; echo no"]
    script = render_script(argv, {"V": "$(id) ' \n"}, nodes=2)
    # Run the script with srun removed: the shell must hand over every word unchanged.
    local = script.replace("exec srun --nodes=2 --ntasks=2 --ntasks-per-node=1 "
                           "--kill-on-bad-exit=1 -- ", "") + 'printf "%s" "$V" >&2\n'
    out = subprocess.run(["sh", "-c", local], capture_output=True, text=True, check=False)
    assert out.stdout == "$(id)|`id`|a'b|x\ny|; echo no|"
    assert out.stderr == "$(id) ' \n"
    assert "exec srun --nodes=2" in script and shlex.quote("$(id)") in script
    assert "srun --nodes=2 --ntasks=2 --ntasks-per-node=1 --kill-on-bad-exit=1 -- /bin/sh -c" in script
    with pytest.raises(SubmissionRejected):
        render_script(["true"], {"BAD NAME": "x"}, nodes=1)


def test_each_attempt_is_its_own_slurm_job_and_a_failure_says_whose_it_was():
    from adapters.slurm.parse import attempt_of, gateway_comment

    assert gateway_comment("g1") == "isthmus:g1" and gateway_comment("g1", 3) == "isthmus:g1/3"
    third = job_status({"job_id": 7, "job_state": ["NODE_FAIL"], "comment": "isthmus:g1/3", "nodes": "gpu1",
                        "start_time": 1700000000, "end_time": 1700000100})
    assert third.gateway_job_id == "g1" and attempt_of({"comment": "isthmus:g1/3"}) == 3
    assert third.state is BackendState.FAILED and third.failure == "node_failure"
    assert job_status({"job_id": 8, "job_state": "BOOT_FAIL", "comment": ""}).failure == "node_failure"
    assert job_status({"job_id": 9, "job_state": ["TIMEOUT"]}).failure == "time_limit"
    assert job_status({"job_id": 10, "job_state": ["FAILED"]}).failure == ""
    assert job_status({"job_id": 11, "job_state": ["RUNNING"], "nodes": "gpu1"}).failure == ""
    # Not ours: a comment that only looks like an attempt.
    assert job_status({"job_id": 12, "job_state": "PENDING", "comment": "isthmus:g1/x"}).gateway_job_id is None
