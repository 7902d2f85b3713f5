"""The child process behind PyslurmTransport: one libslurm, one slurm.conf, JSON lines.

Run as ``python pyslurm_worker.py <slurm.conf>`` by :mod:`adapters.slurm.pyslurm_transport`,
never imported by the gateway. Why a process and not a thread: pyslurm calls libslurm
while holding the GIL, so a slurmctld that does not answer would freeze every thread of
the gateway (event loop included) for libslurm's own MessageTimeout, and no timeout in
the same process could fire. A process can be killed at its deadline; libslurm also reads
one slurm.conf per process, so each cluster gets its own worker.

Protocol: one JSON object per line each way. Requests ``{"op": ..., ...}``; answers
``{"ok": <result>}`` or ``{"error": {"errno": int|None, "message": str, "kind": str}}``.
The first line the worker prints is the answer to its own start-up (versions, or why
pyslurm is unusable). Only the standard library and pyslurm are imported here.
"""

from __future__ import annotations

import enum
import json
import os
import sys
import warnings
from typing import Any


def _gres_text(gres: Any) -> str:
    """pyslurm's GRES dict (``{"gpu": 8}`` or ``{"gpu:a100": 8}``) as Slurm's own text."""
    if isinstance(gres, str):
        return gres
    parts = []
    for name, count in (gres or {}).items():
        count = getattr(count, "count", count)
        parts.append(f"{name}:{count}")
    return ",".join(parts)


def _tres_per_node(job: Any) -> str:
    """The job's per-node GRES request as Slurm's text (``gres/gpu:8``).

    Without accounting, ``tres_alloc_str`` carries no GPUs, so job_record.py counts them as
    per-node request x nodes, as for REST and the CLI.
    """
    gres = job.gres_per_node or {}   # {"gres/gpu": 8} or {"gpu:a100": 8}
    parts = []
    for name, count in dict(gres).items():
        name = str(name)
        parts.append(f"{name if name.startswith('gres/') else 'gres/' + name}:{count}")
    return ",".join(parts)


def job_record(job: Any) -> dict[str, Any]:
    """A pyslurm Job in the shape of Slurm's JSON job record (what job_record.job_status reads)."""
    signal = job.exit_code_signal or 0
    code = job.exit_code
    return {
        "job_id": job.id,
        # libslurm's state string is the base state, or the flag that overrides it
        # (COMPLETING, CONFIGURING, REQUEUED, ...), exactly as squeue prints it.
        "job_state": [s for s in str(job.state or "").split(",") if s],
        "state_reason": job.state_reason or "",
        "comment": job.comment or "",
        "user_name": job.user_name,
        # what adoption checks (backend.find_by_gateway_id) and requeue detection read
        "partition": job.partition or "",
        "account": job.account or "",
        "submit_time": job.submit_time or 0,
        "restart_cnt": job.requeue_count or 0,
        "nodes": job.allocated_nodes or "",
        "start_time": job.start_time or 0,
        "end_time": job.end_time or 0,
        "exit_code": {"status": ["SIGNALED"] if signal else (["EXITED"] if code is not None else []),
                      "return_code": code, "signal": {"id": signal}},
        "tres_per_node": _tres_per_node(job),
    }


def node_record(node: Any) -> dict[str, Any]:
    return {
        "name": node.name,
        "state": [s for s in str(node.state or "").split("+") if s],
        "gres": _gres_text(node.configured_gres),
        "partitions": list(node.partitions or []),
        "alloc_cpus": node.allocated_cpus or 0,
        "cpus": node.total_cpus,
    }


# pyslurm's names of reservation flags -> Slurm's own (what scontrol and the JSON print);
# the names not listed here are the same in both.
_FLAG_NAMES = {"MAINTENANCE": "MAINT", "IGNORE_RUNNING_JOBS": "IGNORE_JOBS", "STATIC_NODES": "STATIC",
               "PARTITION_NODES_ONLY": "PART_NODES", "USER_DELETION": "USER_DELETE",
               "PURGE": "PURGE_COMP", "SPECIFIC_NODES": "SPEC_NODES",
               "NO_JOB_HOLD_AFTER_END": "NO_HOLD_JOBS_AFTER_END"}


def _reservation_flags(pyslurm, resv: Any) -> list[str]:
    """The reservation's flags in Slurm's spelling (``MAINT``, ``IGNORE_JOBS``, ...)."""
    flag_type = pyslurm.ReservationFlags
    if getattr(enum, "FlagBoundary", None) and getattr(flag_type, "_boundary_", None) is enum.FlagBoundary.STRICT:
        # pyslurm's ReservationFlags is a strict enum.Flag: a bit it has no name for (e.g.
        # REPLACE_DOWN or FORCE_START in pyslurm 25.11.2) makes ``resv.flags`` raise, and one
        # such reservation would hide all the others. Keep the bits it names.
        flag_type._boundary_ = enum.FlagBoundary.CONFORM
    flags = resv.flags
    names = [_FLAG_NAMES.get(f.name, f.name) for f in flag_type if f.value and f in flags]
    recur = str(getattr(resv, "reoccurrence", "") or "")  # cleared from flags by pyslurm
    return names + ([recur] if recur and recur != "NO" else [])


def reservation_record(resv: Any, pyslurm) -> dict[str, Any]:
    """A pyslurm Reservation in the shape of Slurm's JSON reservation record (parse.windows)."""
    return {
        "name": resv.name,
        "node_list": resv.nodes or "",
        "partition": resv.partition or "",
        "start_time": resv.start_time or 0,
        # pyslurm gives None for Slurm's INFINITE (and unset): no end.
        "end_time": resv.end_time,
        "flags": _reservation_flags(pyslurm, resv),
        "users": list(resv.users or []),
        "accounts": list(resv.accounts or []),
        "groups": list(resv.groups or []),
    }


def _all_jobs(pyslurm) -> list[Any]:
    jobs = pyslurm.Jobs.load()
    out = []
    for value in jobs.values():  # one level per cluster in pyslurm >= 24.x
        out.extend(value.values() if isinstance(value, dict) else [value])
    return out


def _submit(pyslurm, req: dict[str, Any]) -> int:
    desc = pyslurm.JobSubmitDescription(
        name=req["name"], comment=req["comment"], partitions=req["partition"],
        account=req.get("account") or None,
        user_id=req["uid"], group_id=req["gid"],
        nodes=req["nodes"], ntasks=req["nodes"], ntasks_per_node=1,
        cpus_per_task=req["cpus_per_node"], memory_per_node=req["memory_mib_per_node"],
        resource_sharing="exclusive", time_limit=int(req["time_limit_min"]),
        # Never requeued by Slurm behind the gateway's back (docs/dispatch.md, "Requeues").
        is_requeueable=bool(req.get("requeue", False)),
        working_directory=req["work_dir"], standard_output=req["output"],
        script=req["script"], environment=dict(req["environment"]),
    )
    if req.get("gres"):
        desc.gres_per_node = req["gres"]
    if req.get("reservation"):
        desc.reservations = [req["reservation"]]
    if req.get("segment"):
        desc.segment_size = int(req["segment"])
    if req.get("exclude"):
        desc.excluded_nodes = list(req["exclude"])
    if req.get("switches_wait_s"):
        desc.switches = {"count": 1, "max_wait_time": req["switches_time"]}
    return int(desc.submit())


def _cancel(pyslurm, job_id: int) -> str:
    """A job that is finished or unknown is the parent's rule (adapters.slurm.errors.stop): its
    RPCError goes back with Slurm's errno."""
    try:
        pyslurm.Job(job_id).cancel()
        return "cancelled"
    except pyslurm.RPCError:
        # pyslurm reads errno after slurm_kill_job without resetting it first, so a
        # stale errno can look like a failure: believe the job's state instead (loading a
        # job slurmctld no longer has raises its own ESLURM_INVALID_JOB_ID).
        job = pyslurm.Job.load(job_id)
        if str(job.state).split(",")[0] in ("PENDING", "RUNNING", "SUSPENDED", "CONFIGURING"):
            raise
        return "done"


def _signal(pyslurm, job_id: int, signal: str) -> str:
    """``scancel --batch --signal=...``: the batch step and its children (srun forwards it)."""
    if signal not in ("USR1", "USR2", "TERM", "INT", "HUP", "CONT"):
        raise ValueError(f"signal {signal!r} is not one the gateway sends")
    pyslurm.Job(job_id).send_signal(f"SIG{signal}", steps="batch")  # gone or done: the parent's rule
    return "signalled"


def handle(pyslurm, req: dict[str, Any]) -> Any:
    op = req.get("op")
    if op == "submit":
        return _submit(pyslurm, req)
    if op == "jobs":
        return [job_record(j) for j in _all_jobs(pyslurm)]
    if op == "job":
        try:
            return job_record(pyslurm.Job.load(int(req["job_id"])))
        except pyslurm.RPCError as exc:
            if getattr(exc, "errno", None) == 2017:  # ESLURM_INVALID_JOB_ID
                return None
            raise
    if op == "comments":
        return {str(j.id): j.comment or "" for j in _all_jobs(pyslurm)}
    if op == "cancel":
        return _cancel(pyslurm, int(req["job_id"]))
    if op == "signal":
        return _signal(pyslurm, int(req["job_id"]), str(req["signal"]))
    if op == "nodes":
        return [node_record(n) for n in pyslurm.Nodes.load().values()]
    if op == "reservations":  # values() spans every cluster's
        return [reservation_record(r, pyslurm) for r in pyslurm.Reservations.load().values()]
    if op == "version":   # the controller's, e.g. "25.11.7"
        return str(pyslurm.slurmctld.Config.load().version)
    raise ValueError(f"unknown op {op!r}")


def _error(kind: str, message: str, errno: int | None = None) -> dict[str, Any]:
    return {"error": {"kind": kind, "message": message, "errno": errno}}


def main() -> None:
    conf = sys.argv[1] if len(sys.argv) > 1 else None
    out = sys.stdout
    # Nothing but our JSON may reach stdout: libslurm's own messages go to stderr.
    sys.stdout = sys.stderr

    def send(obj: Any) -> None:
        out.write(json.dumps(obj) + "\n")
        out.flush()

    os.environ["PYSLURM_DISABLE_AUTO_INIT"] = "1"  # init with our conf, below
    # gres_per_node is marked deprecated, but it is the only plain view of tres_per_node.
    warnings.simplefilter("ignore", DeprecationWarning)
    try:
        import pyslurm
    except ImportError as exc:
        send(_error("unsupported", f"pyslurm does not import: {exc}"))
        return
    try:
        pyslurm.slurm_init(conf)
    except Exception as exc:  # noqa: BLE001 - reported to the parent verbatim
        send(_error("unavailable", f"libslurm could not read {conf}: {exc}"))
        return
    send({"ok": {"pyslurm": pyslurm.__version__, "pid": os.getpid()}})
    for line in sys.stdin:
        try:
            req = json.loads(line)
        except ValueError:
            send(_error("protocol", "request is not JSON"))
            continue
        try:
            send({"ok": handle(pyslurm, req)})
        except pyslurm.RPCError as exc:
            send(_error("slurm", str(getattr(exc, "msg", None) or exc), getattr(exc, "errno", None)))
        except (ValueError, TypeError, KeyError) as exc:
            # pyslurm validates the description itself (e.g. a malformed GRES string).
            send(_error("invalid", f"{type(exc).__name__}: {exc}"))


if __name__ == "__main__":
    main()
