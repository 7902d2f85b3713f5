"""Turn a Slurm JSON job record into the contract's ``JobStatus``: its state, exit code,
reason in a user's words, failure kind, and the gateway id its comment carries.

Records from slurmrestd, the CLIs' ``--json`` and the pyslurm worker have the same shapes
(parse.py's docstring lists how they differ by data_parser version); the values read the
same way in every record (``number``, ``timestamp``, ``expand_hostlist``) are parse.py's.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from adapters.base import NODE_FAILURE, TIME_LIMIT, BackendState, JobStatus
from adapters.slurm.parse import expand_hostlist, number, timestamp

GATEWAY_COMMENT_PREFIX = "isthmus:"

# Slurm base state -> gateway state. Flags such as COMPLETING or CONFIGURING arrive as
# extra entries (v0.0.40+) or as the base state itself (v0.0.38).
STATE_MAP: Mapping[str, BackendState] = {
    "PENDING": BackendState.QUEUED,
    "SUSPENDED": BackendState.QUEUED,
    "CONFIGURING": BackendState.STARTING,
    "RUNNING": BackendState.RUNNING,
    "COMPLETING": BackendState.RUNNING,
    "STAGE_OUT": BackendState.RUNNING,
    "COMPLETED": BackendState.SUCCEEDED,
    "FAILED": BackendState.FAILED,
    "NODE_FAIL": BackendState.FAILED,
    "OUT_OF_MEMORY": BackendState.FAILED,
    "TIMEOUT": BackendState.FAILED,
    "BOOT_FAIL": BackendState.FAILED,
    "DEADLINE": BackendState.FAILED,
    "SPECIAL_EXIT": BackendState.FAILED,
    "CANCELLED": BackendState.CANCELLED,
    "REVOKED": BackendState.CANCELLED,
    "PREEMPTED": BackendState.REQUEUED,
    "REQUEUED": BackendState.REQUEUED,
    "REQUEUE_HOLD": BackendState.REQUEUED,
    "REQUEUE_FED": BackendState.REQUEUED,
    "RESIZING": BackendState.RUNNING,
}
# Flags that override the base state (a requeued job is PENDING with flag REQUEUED).
_FLAG_PRIORITY = ("REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "PREEMPTED", "CONFIGURING")


def states(record: Mapping[str, Any]) -> list[str]:
    raw = record.get("job_state")
    if isinstance(raw, str):
        return [s for s in raw.upper().split(",") if s]
    if isinstance(raw, list):
        return [str(s).upper() for s in raw]
    return []


def map_state(names: list[str]) -> BackendState:
    for flag in _FLAG_PRIORITY:
        if flag in names:
            return STATE_MAP[flag]
    for name in names:
        if name in STATE_MAP:
            return STATE_MAP[name]
    return BackendState.QUEUED if not names else BackendState.FAILED


def exit_code(record: Mapping[str, Any]) -> int | None:
    """The job's exit code; a signal ``n`` is reported as ``128 + n`` like a shell does."""
    raw = record.get("exit_code")
    if isinstance(raw, Mapping):
        status = [str(s).upper() for s in (raw.get("status") or [])]
        signal = raw.get("signal") or {}
        sig = number(signal.get("id", signal.get("signal_id"))) if isinstance(signal, Mapping) else None
        if "SIGNALED" in status and sig:
            return 128 + sig
        if "PENDING" in status:
            return None
        return number(raw.get("return_code"))
    wait_status = number(raw)
    if wait_status is None:
        return None
    if wait_status & 0x7F:  # terminated by a signal
        return 128 + (wait_status & 0x7F)
    return (wait_status >> 8) & 0xFF



def gateway_comment(gateway_job_id: str, attempt: int = 1) -> str:
    """The comment of the gateway's submission of one attempt at a job: ``isthmus:<id>``,
    then ``isthmus:<id>/<n>`` for the n-th attempt (each attempt is its own Slurm job)."""
    return f"{GATEWAY_COMMENT_PREFIX}{gateway_job_id}" + (f"/{attempt}" if attempt > 1 else "")


def _comment_of(record: Mapping[str, Any]) -> str:
    comment = record.get("comment") or ""
    if isinstance(comment, Mapping):  # some versions nest comments
        comment = comment.get("job") or ""
    return str(comment)


def gateway_id_of(record: Mapping[str, Any]) -> str | None:
    comment = _comment_of(record)
    if comment.startswith(GATEWAY_COMMENT_PREFIX):
        job_id, _, attempt = comment[len(GATEWAY_COMMENT_PREFIX):].partition("/")
        return job_id if not attempt or attempt.isdigit() else None
    return None


def attempt_of(record: Mapping[str, Any]) -> int:
    """The gateway attempt a gateway job's comment names (1 when it names none)."""
    _, _, attempt = _comment_of(record).partition("/")
    return int(attempt) if attempt.isdigit() else 1


# Base states in which Slurm ended a job for its nodes, not for anything the job did.
NODE_FAILURE_STATES = frozenset({"NODE_FAIL", "BOOT_FAIL"})
TIME_LIMIT_STATES = frozenset({"TIMEOUT", "DEADLINE"})


def failure_of(state: BackendState, names: Iterable[str]) -> str:
    """``JobStatus.failure`` of a Slurm job: its nodes failed, or it hit its time limit."""
    if state is not BackendState.FAILED:
        return ""
    if NODE_FAILURE_STATES & set(names):
        return NODE_FAILURE
    return TIME_LIMIT if TIME_LIMIT_STATES & set(names) else ""


_GPU_TRES = re.compile(r"gres[/:]gpu(?::[^=:,]+)?[=:](\d+)")


def _gpus_per_node(record: Mapping[str, Any]) -> int:
    m = _GPU_TRES.search(str(record.get("tres_per_node") or ""))
    return int(m.group(1)) if m else 0


def _allocated_gpus(record: Mapping[str, Any], nodes: tuple[str, ...]) -> int:
    m = re.search(r"(?:^|,)gres/gpu=(\d+)", str(record.get("tres_alloc_str") or ""))
    if m:
        return int(m.group(1))
    return _gpus_per_node(record) * len(nodes)


# Pending reasons that mean the job will not start as submitted until an administrator acts
# (the job's user or its association is unknown to the cluster); see user_words.
HELD_REASONS = frozenset({"BeginTime", "InvalidAccount", "InvalidQOS"})


def user_words(slurm_reason: str, record: Mapping[str, Any]) -> str:
    """Slurm's pending reasons that mean "this will not start as submitted", in a user's words.

    The gateway never submits with --begin, so BeginTime means slurmctld tried to launch
    the job, failed, and put it back with a delay: on a test or a real cluster that is
    almost always a user without a POSIX account on the nodes (checked on 22.05).
    """
    # An unknown user has no user_name in the record (slurmctld cannot resolve it).
    user = f"user {record['user_name']!r}" if record.get("user_name") else "the job's user"
    account = str(record.get("account") or "")
    if slurm_reason == "BeginTime":
        return (f"Slurm could not start the job as {user} and retries it later (Slurm reason BeginTime); "
                f"usually the user has no POSIX account on the cluster's nodes")
    if slurm_reason == "InvalidAccount":
        return (f"Slurm does not let {user} charge account {account!r} (Slurm reason InvalidAccount); "
                f"the cluster's admins must add the user to that Slurm account")
    if slurm_reason == "InvalidQOS":
        return f"Slurm does not let {user} use the job's QOS (Slurm reason InvalidQOS)"
    return slurm_reason


def job_status(record: Mapping[str, Any]) -> JobStatus:
    names = states(record)
    state = map_state(names)
    raw_state = ",".join(names)
    slurm_reason = str(record.get("state_reason") or "")
    if slurm_reason == "None":
        slurm_reason = ""
    if state is BackendState.QUEUED:
        reason = user_words(slurm_reason, record) or raw_state
    elif state in (BackendState.FAILED, BackendState.CANCELLED, BackendState.REQUEUED):
        base = names[0] if names else raw_state
        reason = f"{base}: {slurm_reason}" if slurm_reason else base
    else:
        reason = slurm_reason
    holds = state in (BackendState.STARTING, BackendState.RUNNING)
    nodes = expand_hostlist(str(record.get("nodes") or "")) if (holds or state.final) else ()
    started = timestamp(record.get("start_time")) if (holds or state.final) else None
    ended = timestamp(record.get("end_time")) if state.final else None
    if started and ended and ended < started:  # cancelled while pending
        started = ended
    # Slurm resets a requeued job's submit time to the requeue and counts restarts; no other
    # field says when a requeue took the gang down (the start time is the next run's).
    requeued_at = timestamp(record.get("submit_time")) if (number(record.get("restart_cnt")) or 0) > 0 else None
    return JobStatus(
        backend_job_id=str(number(record.get("job_id"))),
        gateway_job_id=gateway_id_of(record),
        state=state,
        reason=reason,
        exit_code=exit_code(record) if state.final else None,
        started_at=started,
        ended_at=ended,
        nodes=nodes,
        allocated_gpus=_allocated_gpus(record, nodes) if holds else 0,
        raw_state=raw_state,
        requeued_at=requeued_at,
        held=slurm_reason if state is BackendState.QUEUED and slurm_reason in HELD_REASONS else "",
        failure=failure_of(state, names),
    )


def submitted_by(record: Mapping[str, Any]) -> str:
    """The POSIX user a job runs as (``user_name``; 22.05 REST may give only ``user_id``)."""
    name = record.get("user_name") or ""
    if not name and number(record.get("user_id")) is not None:
        import pwd

        try:
            name = pwd.getpwuid(number(record.get("user_id"))).pw_name
        except KeyError:
            name = ""
    return str(name)
