"""Slurm JSON shapes -> contract types, for every data_parser version seen on the clusters.

The records are the fields the adapter reads, copied from real 22.05 (v0.0.38) and
24.11/26.05 (v0.0.42) answers; the reservations are whole answers of all four versions. The
cluster tests exercise the same code end to end.
"""

from __future__ import annotations

import shlex
import subprocess
from datetime import UTC, datetime

import pytest

from adapters.base import BackendState, SubmissionRejected, Window
from adapters.slurm.job_record import exit_code, job_status, map_state
from adapters.slurm.parse import (
    NO_END,
    expand_hostlist,
    pool_capacity,
    reservation_text,
    topology,
    topology_text,
    windows,
)
from adapters.slurm.script import build_spec, render_script


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
    from adapters.slurm.job_record import attempt_of, gateway_comment

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


# ---------------------------------------------------------------------- reservations
#
# Real answers of the local clusters, captured 2026-12-06 right after
#   scontrol create reservation ReservationName=cap-maint-<t> StartTime=now+1hour Duration=60 Nodes=gpu4 Users=root Flags=MAINT
#   scontrol create reservation ReservationName=cap-acct-<t>  StartTime=now+1hour Duration=30 Nodes=gpu[3-4] Accounts=research
#   scontrol create reservation ReservationName=cap-open-<t>  StartTime=now+2hours Duration=UNLIMITED Nodes=gpu2 Users=root,alice
# (Slurm turns Duration=UNLIMITED into 365 days on every version here.) Only the records are
# kept; each is as Slurm printed it.

# Slurm 22.05.8 (Debian 12): `SLURM_TIME_FORMAT=%s TZ=UTC scontrol --oneliner show reservation`,
# what the CLI transport runs on 22.05 (no --json there).
TEXT_2205 = (
    "ReservationName=cap-maint-7a8fba StartTime=1796533253 EndTime=1796536853 Duration=01:00:00 Nodes=gpu4 NodeCnt=1 CoreCnt=8 Features=(null) PartitionName=(null) Flags=MAINT,SPEC_NODES TRES=cpu=8 Users=root Groups=(null) Accounts=(null) Licenses=(null) State=INACTIVE BurstBuffer=(null) Watts=n/a MaxStartDelay=(null)\n"
    "ReservationName=cap-acct-7a8fba StartTime=1796533253 EndTime=1796535053 Duration=00:30:00 Nodes=gpu[3-4] NodeCnt=2 CoreCnt=16 Features=(null) PartitionName=(null) Flags=SPEC_NODES TRES=cpu=16 Users=(null) Groups=(null) Accounts=research Licenses=(null) State=INACTIVE BurstBuffer=(null) Watts=n/a MaxStartDelay=(null)\n"
    "ReservationName=cap-open-7a8fba StartTime=1796536853 EndTime=1828072853 Duration=365-00:00:00 Nodes=gpu2 NodeCnt=1 CoreCnt=8 Features=(null) PartitionName=(null) Flags=SPEC_NODES TRES=cpu=8 Users=root,alice Groups=(null) Accounts=(null) Licenses=(null) State=INACTIVE BurstBuffer=(null) Watts=n/a MaxStartDelay=(null)\n"
)
# Slurm 22.05.8: the same, in scontrol's default format (local time; that host runs in UTC).
TEXT_2205_LOCAL = (
    "ReservationName=cap-maint-7a8fba StartTime=2026-12-06T05:00:53 EndTime=2026-12-06T06:00:53 Duration=01:00:00 Nodes=gpu4 NodeCnt=1 CoreCnt=8 Features=(null) PartitionName=(null) Flags=MAINT,SPEC_NODES TRES=cpu=8 Users=root Groups=(null) Accounts=(null) Licenses=(null) State=INACTIVE BurstBuffer=(null) Watts=n/a MaxStartDelay=(null)\n"
    "ReservationName=cap-acct-7a8fba StartTime=2026-12-06T05:00:53 EndTime=2026-12-06T05:30:53 Duration=00:30:00 Nodes=gpu[3-4] NodeCnt=2 CoreCnt=16 Features=(null) PartitionName=(null) Flags=SPEC_NODES TRES=cpu=16 Users=(null) Groups=(null) Accounts=research Licenses=(null) State=INACTIVE BurstBuffer=(null) Watts=n/a MaxStartDelay=(null)\n"
    "ReservationName=cap-open-7a8fba StartTime=2026-12-06T06:00:53 EndTime=2027-12-06T06:00:53 Duration=365-00:00:00 Nodes=gpu2 NodeCnt=1 CoreCnt=8 Features=(null) PartitionName=(null) Flags=SPEC_NODES TRES=cpu=8 Users=root,alice Groups=(null) Accounts=(null) Licenses=(null) State=INACTIVE BurstBuffer=(null) Watts=n/a MaxStartDelay=(null)\n"
)
# Slurm 22.05.8 slurmrestd, GET /slurm/v0.0.38/reservations: plain numbers.
REST_2205 = [
    {"flags": ["MAINT", "SPEC_NODES"], "accounts": "", "burst_buffer": "", "core_count": 8, "core_spec_cnt": 0, "end_time": 1796536853, "features": "", "groups": "", "licenses": "", "max_start_delay": 0, "name": "cap-maint-7a8fba", "node_count": 1, "node_list": "gpu4", "partition": "", "start_time": 1796533253, "watts": 4294967294, "tres": "cpu=8", "users": "root"},
    {"flags": ["SPEC_NODES"], "accounts": "research", "burst_buffer": "", "core_count": 16, "core_spec_cnt": 0, "end_time": 1796535053, "features": "", "groups": "", "licenses": "", "max_start_delay": 0, "name": "cap-acct-7a8fba", "node_count": 2, "node_list": "gpu[3-4]", "partition": "", "start_time": 1796533253, "watts": 4294967294, "tres": "cpu=16", "users": ""},
    {"flags": ["SPEC_NODES"], "accounts": "", "burst_buffer": "", "core_count": 8, "core_spec_cnt": 0, "end_time": 1828072853, "features": "", "groups": "", "licenses": "", "max_start_delay": 0, "name": "cap-open-7a8fba", "node_count": 1, "node_list": "gpu2", "partition": "", "start_time": 1796536853, "watts": 4294967294, "tres": "cpu=8", "users": "root,alice"},
]
# Slurm 24.11.5 (Debian 13): `scontrol --json show reservations` (data_parser v0.0.42 structs).
JSON_2411 = [
    {"accounts": "", "burst_buffer": "", "core_count": 8, "core_specializations": [], "end_time": {"set": True, "infinite": False, "number": 1796536855}, "features": "", "flags": ["MAINT", "SPEC_NODES"], "groups": "", "licenses": "", "max_start_delay": 0, "name": "cap-maint-b55fcf", "node_count": 1, "node_list": "gpu4", "partition": "", "purge_completed": {"time": {"set": True, "infinite": False, "number": 300}}, "start_time": {"set": True, "infinite": False, "number": 1796533255}, "watts": {}, "tres": "cpu=8", "users": "root"},
    {"accounts": "research", "burst_buffer": "", "core_count": 16, "core_specializations": [], "end_time": {"set": True, "infinite": False, "number": 1796535055}, "features": "", "flags": ["SPEC_NODES"], "groups": "", "licenses": "", "max_start_delay": 0, "name": "cap-acct-b55fcf", "node_count": 2, "node_list": "gpu[3-4]", "partition": "", "purge_completed": {"time": {"set": True, "infinite": False, "number": 300}}, "start_time": {"set": True, "infinite": False, "number": 1796533255}, "watts": {}, "tres": "cpu=16", "users": ""},
    {"accounts": "", "burst_buffer": "", "core_count": 8, "core_specializations": [], "end_time": {"set": True, "infinite": False, "number": 1828072855}, "features": "", "flags": ["SPEC_NODES"], "groups": "", "licenses": "", "max_start_delay": 0, "name": "cap-open-b55fcf", "node_count": 1, "node_list": "gpu2", "partition": "", "purge_completed": {"time": {"set": True, "infinite": False, "number": 300}}, "start_time": {"set": True, "infinite": False, "number": 1796536855}, "watts": {}, "tres": "cpu=8", "users": "root,alice"},
]
# Slurm 26.05.5 (Debian sid) slurmrestd, GET /slurm/v0.0.42/reservations/.
REST_2605 = [
    {"accounts": "", "burst_buffer": "", "core_count": 8, "core_specializations": [], "end_time": {"set": True, "infinite": False, "number": 1796536856}, "features": "", "flags": ["MAINT", "SPEC_NODES"], "groups": "", "licenses": "", "max_start_delay": 0, "name": "cap-maint-27ad3a", "node_count": 1, "node_list": "gpu4", "partition": "", "purge_completed": {"time": {"set": True, "infinite": False, "number": 300}}, "start_time": {"set": True, "infinite": False, "number": 1796533256}, "watts": {}, "tres": "cpu=8", "users": "root"},
    {"accounts": "research", "burst_buffer": "", "core_count": 16, "core_specializations": [], "end_time": {"set": True, "infinite": False, "number": 1796535056}, "features": "", "flags": ["SPEC_NODES"], "groups": "", "licenses": "", "max_start_delay": 0, "name": "cap-acct-27ad3a", "node_count": 2, "node_list": "gpu[3-4]", "partition": "", "purge_completed": {"time": {"set": True, "infinite": False, "number": 300}}, "start_time": {"set": True, "infinite": False, "number": 1796533256}, "watts": {}, "tres": "cpu=16", "users": ""},
    {"accounts": "", "burst_buffer": "", "core_count": 8, "core_specializations": [], "end_time": {"set": True, "infinite": False, "number": 1828072856}, "features": "", "flags": ["SPEC_NODES"], "groups": "", "licenses": "", "max_start_delay": 0, "name": "cap-open-27ad3a", "node_count": 1, "node_list": "gpu2", "partition": "", "purge_completed": {"time": {"set": True, "infinite": False, "number": 300}}, "start_time": {"set": True, "infinite": False, "number": 1796536856}, "watts": {}, "tres": "cpu=8", "users": "root,alice"},
]
# Slurm 25.11.7 through pyslurm 25.11.2: the pyslurm worker's records (same first two
# reservations, then a third with Flags=TIME_FLOAT,REPLACE_DOWN NodeCnt=1, two flags
# pyslurm 25.11.2 has no name for; reading its flags raised before the worker kept them out).
PYSLURM_2511 = [
    {"name": "cap-maint-1e8351", "node_list": "gpu4", "partition": "", "start_time": 1796533332, "end_time": 1796536932, "flags": ["MAINT", "SPEC_NODES"], "users": ["root"], "accounts": [], "groups": []},
    {"name": "cap-acct-1e8351", "node_list": "gpu[3-4]", "partition": "", "start_time": 1796533332, "end_time": 1796535132, "flags": ["SPEC_NODES"], "users": [], "accounts": ["research"], "groups": []},
    {"name": "cap-repl-e7a0ac", "node_list": "gpu1", "partition": "gpu", "start_time": 1796540534, "end_time": 1796544134, "flags": [], "users": ["root"], "accounts": [], "groups": []},
]
GPU_NODES = ("gpu1", "gpu2", "gpu3", "gpu4")


def at(epoch: int) -> datetime:
    return datetime.fromtimestamp(epoch, tz=UTC)


@pytest.mark.parametrize("records,tag,t0", [
    (reservation_text(TEXT_2205, tz=UTC), "7a8fba", 1796533253),
    (reservation_text(TEXT_2205_LOCAL, tz=UTC), "7a8fba", 1796533253),
    (REST_2205, "7a8fba", 1796533253),
    (JSON_2411, "b55fcf", 1796533255),
    (REST_2605, "27ad3a", 1796533256),
], ids=["22.05-text", "22.05-text-local-time", "22.05-rest-v0.0.38", "24.11-scontrol-json", "26.05-rest-v0.0.42"])
def test_reservations_of_every_shape_become_the_same_windows(records, tag, t0):
    found = windows(records, GPU_NODES, now=at(t0 - 3600))
    assert found == (
        Window(f"cap-acct-{tag}", at(t0), at(t0 + 1800), ("gpu3", "gpu4"), False,
               f"Slurm reservation cap-acct-{tag}, for accounts research"),
        Window(f"cap-maint-{tag}", at(t0), at(t0 + 3600), ("gpu4",), True,
               f"Slurm reservation cap-maint-{tag} (MAINT), for users root"),
        Window(f"cap-open-{tag}", at(t0 + 3600), at(t0 + 3600 + 365 * 86400), ("gpu2",), False,
               f"Slurm reservation cap-open-{tag}, for users root, alice"),
    )


def test_pyslurm_records_become_windows_too():
    t0 = 1796533332
    acct, maint, repl = windows(PYSLURM_2511, GPU_NODES, now=at(t0 - 3600))
    assert (maint.nodes, maint.maintenance, maint.start, maint.end) == (("gpu4",), True, at(t0), at(t0 + 3600))
    assert maint.detail == "Slurm reservation cap-maint-1e8351 (MAINT), for users root"
    assert acct.detail == "Slurm reservation cap-acct-1e8351, for accounts research" and not acct.maintenance
    assert (repl.name, repl.nodes, repl.maintenance) == ("cap-repl-e7a0ac", ("gpu1",), False)


def test_only_the_partitions_nodes_and_only_windows_that_have_not_ended():
    t0 = 1796533253
    # A partition of gpu1..gpu3: the maintenance of gpu4 is another partition's.
    mine = windows(REST_2205, ("gpu1", "gpu2", "gpu3"), now=at(t0 - 3600))
    assert [(w.name, w.nodes) for w in mine] == [("cap-acct-7a8fba", ("gpu3",)), ("cap-open-7a8fba", ("gpu2",))]
    # Half an hour in, the account's reservation has ended; the active maintenance has not.
    assert [w.name for w in windows(REST_2205, GPU_NODES, now=at(t0 + 1800))] == ["cap-maint-7a8fba", "cap-open-7a8fba"]
    assert windows(REST_2205, (), now=at(t0)) == ()


def test_no_reservations_and_no_end():
    assert reservation_text("No reservations in the system\n") == [] and reservation_text("") == []
    # An end Slurm leaves unset or INFINITE: Duration=UNLIMITED never makes one here (365 days),
    # so these shapes come from the source (v0.0.38 reservations.c, data_parser
    # TIMESTAMP_NO_VAL, scontrol's "Unknown", pyslurm's None).
    base = dict(REST_2205[0])
    for end in (4294967295, 4294967294, 0, None, {"set": True, "infinite": True, "number": 0},
                {"set": False, "infinite": False, "number": 0}):
        (w,) = windows([{**base, "end_time": end}], GPU_NODES, now=at(1796533253))
        assert w.end == NO_END and w.end.tzinfo is not None
    (text,) = reservation_text(TEXT_2205.splitlines()[0].replace("EndTime=1796536853", "EndTime=Unknown"))
    assert windows([text], GPU_NODES, now=at(1796533253))[0].end == NO_END


def test_a_node_of_an_active_reservation_is_not_idle():
    nodes = [{"name": f"gpu{i}", "state": ["IDLE"], "gres": "gpu:8", "partitions": ["gpu"]} for i in (1, 2)]
    (pool,) = pool_capacity(nodes, reserved={"gpu2"})
    assert (pool.idle_nodes, pool.free_gpus) == (1, 8)


def test_a_node_of_the_gateways_own_active_reservation_stays_idle_to_the_planner():
    """slurmctld flags it RESERVED; the gateway plans that node as its hold, so it is free to
    the planner (which keeps it for the hold's account), unless something else takes it."""
    nodes = [{"name": f"gpu{i}", "state": ["IDLE", "RESERVED"], "gres": "gpu:8", "partitions": ["gpu"]}
             for i in (1, 2, 3)]
    nodes[2]["state"] = ["IDLE", "RESERVED", "DRAIN"]
    (pool,) = pool_capacity(nodes, held={"gpu1", "gpu3"})
    assert (pool.idle_nodes, pool.free_gpus) == (1, 8)  # gpu2: someone else's; gpu3: draining
    (pool,) = pool_capacity(nodes, reserved={"gpu1"}, held=set())
    assert pool.idle_nodes == 0


# ``scontrol show topology`` of the stack's clusters (stack/slurm/up.sh): topology/tree on
# 22.05, topology/block on 23.11 and later.
TREE_2205 = """\
SwitchName=s1 Level=0 LinkSpeed=1 Nodes=gpu[1-2]
SwitchName=s2 Level=0 LinkSpeed=1 Nodes=gpu[3-4]
SwitchName=top Level=1 LinkSpeed=1 Nodes=gpu[1-4] Switches=s[1-2]
"""
BLOCK_2511 = """\
BlockName=b1 BlockIndex=0 Nodes=gpu[1-2] BlockSize=2
BlockName=b2 BlockIndex=1 Nodes=gpu[3-4] BlockSize=2
AggregatedBlock=b[1-2] BlockIndex=0-1 Nodes=gpu[1-4] BlockSize=4
"""


def test_topology_domains_are_blocks_and_leaf_switches():
    assert topology_text(TREE_2205) == [("switch", "s1", ("gpu1", "gpu2")), ("switch", "s2", ("gpu3", "gpu4"))]
    assert topology_text(BLOCK_2511) == [("block", "b1", ("gpu1", "gpu2")), ("block", "b2", ("gpu3", "gpu4"))]
    assert topology_text("") == [] and topology_text("Topology plugin does not print\n") == []
    # Only the partition's nodes, and how many of them are idle
    doms = topology(topology_text(BLOCK_2511), ["gpu2", "gpu3", "gpu4"], idle={"gpu3"})
    assert [(d.name, d.nodes, d.idle_nodes) for d in doms] == [("b1", ("gpu2",), 0), ("b2", ("gpu3", "gpu4"), 1)]
    assert topology(topology_text(TREE_2205), ["gpu9"], idle=set()) == ()


def test_one_domain_becomes_segment_or_switches():
    from adapters.base import SubmitRequest, TopologyRequest

    def spec(level, required):
        req = SubmitRequest(gateway_job_id="j1", name="n", account="a", user="alice", command=("true",), workers=2,
                            gpus_per_worker=8, cpus_per_worker=1, memory_mib_per_worker=1024, time_limit_s=600,
                            topology=TopologyRequest(level, required) if level else None)
        return build_spec(req, partition="gpu", account=None, work_dir="/tmp")

    assert (spec("block", True).segment, spec("block", True).switches_wait_s) == (2, None)
    assert (spec("block", False).segment, spec(None, False).segment) == (None, None)  # block packs by itself
    assert spec("switch", True).switches_wait_s == 7 * 24 * 3600
    assert spec("switch", False).switches_wait_s == 300
    with pytest.raises(SubmissionRejected, match="no topology level 'rack'"):
        spec("rack", True)
