"""The batch script and job description the gateway hands to Slurm.

Every argv element and env value is passed through :func:`shlex.quote`, so quotes,
``$(...)``, backticks, newlines and ``;`` reach the program literally: the shell that
runs the batch script only ever sees single-quoted words.
"""

from __future__ import annotations

import dataclasses
import math
import os
import pwd
import re
import shlex
from collections.abc import Sequence
from datetime import datetime

from adapters.base import SubmissionRejected, SubmitRequest, VolumeMount
from adapters.slurm.job_record import gateway_comment

# Slurm terminates a step by sending TERM to every process in it; the wrapper's own TERM
# may arrive just after its child died of it, hence the short grace before reporting a
# signal death as the worker's own failure. The wrapper waits for its child whatever
# signal it gets: TERM (a cancel, a time limit, a preemption's stop) lets the command end
# as it handles TERM (a checkpoint, within the cluster's KillWait), and USR1/USR2 (the
# gateway's preemption signal, docs/recovery.md) reach the command without ending the
# wrapper. ``trap ":"`` (a handler, not "ignore") leaves the command its default actions.
TASK_WRAPPER = ('t=0; trap "t=1" TERM; trap ":" USR1 USR2; "$@" & p=$!; '
                'while :; do wait "$p"; rc=$?; kill -0 "$p" 2>/dev/null || break; done; '
                '[ "$t" = 1 ] && exit 0; if [ "$rc" -gt 128 ]; then sleep 1; [ "$t" = 1 ] && exit 0; fi; exit "$rc"')
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_JOB_NAME = re.compile(r"[^A-Za-z0-9_.:-]+")
# A Slurm node name as the gateway passes it on (--exclude, scontrol update): whole-string match.
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")


def node_names(names) -> tuple[str, ...]:
    """``names`` that are plain node names, sorted (anything else is refused, never passed on)."""
    bad = [n for n in names if not NODE_NAME.fullmatch(n)]
    if bad:
        raise SubmissionRejected(f"not a node name: {bad[0]!r}", backend="slurm")
    return tuple(sorted(set(names)))


@dataclasses.dataclass(frozen=True)
class JobSpec:
    """A submission in Slurm's terms, independent of the transport."""

    name: str
    comment: str
    user: str
    partition: str
    account: str | None
    nodes: int
    gres: str  # per node, e.g. "gpu:8" or "gpu:a100:8"
    cpus_per_node: int
    memory_mib_per_node: int
    time_limit_min: int
    work_dir: str
    output: str
    script: str
    # Never requeued by Slurm (node failure, preemption, ``scontrol requeue``): each run is
    # admitted and charged by the gateway (docs/slurm.md, "Requeues").
    requeue: bool = False
    # The gateway-made reservation the job runs in (``--reservation``); None: none.
    reservation: str | None = None
    # One network domain (docs/planning.md, "Topology"): topology/block ``--segment=<nodes>``;
    # topology/tree ``--switches=1@<wait>`` (one leaf switch, waiting at most that long).
    segment: int | None = None
    switches_wait_s: int | None = None
    # Nodes the job must not get (``--exclude``; docs/recovery.md, "Node health").
    exclude: tuple[str, ...] = ()


# How long a gang that requires one leaf switch lets Slurm wait for one (Slurm caps it at
# SchedulerParameters=max_switch_wait); one that prefers it waits 5 minutes, then spans switches.
SWITCH_WAIT_REQUIRED_S = 7 * 24 * 3600
SWITCH_WAIT_PREFERRED_S = 300


def slurm_duration(seconds: int) -> str:
    """Seconds as Slurm's ``D-HH:MM:SS`` (what sbatch and libslurm read a time from)."""
    m, sec = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    d, h = divmod(h, 24)
    return f"{d}-{h:02d}:{m:02d}:{sec:02d}"


def topology_flags(request: SubmitRequest) -> dict[str, int | None]:
    """``segment`` / ``switches_wait_s`` of a JobSpec for the request's topology wish (the level
    is the pool's word: ``block`` or ``switch``, adapters/slurm/parse.py)."""
    t = request.topology
    if t is None:
        return {}
    if t.level == "block":  # topology/block packs into the fewest blocks by itself
        return {"segment": request.workers} if t.required else {}
    if t.level == "switch":
        return {"switches_wait_s": SWITCH_WAIT_REQUIRED_S if t.required else SWITCH_WAIT_PREFERRED_S}
    raise SubmissionRejected(f"this Slurm pool has no topology level {t.level!r} (block or switch)", backend="slurm")


@dataclasses.dataclass(frozen=True)
class ReservationSpec:
    """A gateway-made reservation in Slurm's terms: ``node_count`` whole nodes of ``partition``
    for the Slurm ``accounts`` over ``[start, end)`` (times tz-aware)."""

    name: str
    partition: str
    accounts: tuple[str, ...]
    node_count: int
    start: datetime
    end: datetime


def worker_output_path(work_dir: str, gateway_job_id: str, worker: int | str) -> str:
    """Where worker ``worker`` of a gateway job writes its stdout and stderr (docs/logs.md).

    One file per task (srun's ``%t`` is the task rank, and there is one task per node, so
    the rank is the worker index), named by the gateway id so the gateway finds it without
    asking Slurm. ``work_dir`` is on the shared filesystem the gateway host mounts too.
    """
    return f"{work_dir.rstrip('/')}/isthmus-{gateway_job_id}-worker-{worker}.out"


def mount_lines(mounts: Sequence[VolumeMount]) -> list[str]:
    """Shell lines that make or check each storage directory before the gang starts.

    A Slurm job has no mount namespace: it sees a storage where the cluster's shared file
    system has it, at the storage's own path (docs/storage.md). A per-account or checkpoint
    directory is created when missing, by the job's user and for that user only (umask 077);
    any other directory must exist, else the job fails at once saying which, rather than
    running without its data. Paths are the gateway's (validated, single-quoted here).
    """
    lines: list[str] = []
    for m in mounts:
        if m.provider != "shared" or m.path != m.directory:
            raise SubmissionRejected(f"storage {m.storage!r}: a Slurm pool shows storage only at its own path on "
                                     f"the nodes' shared file system (asked: {m.path} via {m.provider})",
                                     backend="slurm")
        path = shlex.quote(m.path)
        # No component below the storage's root may be a link: a job of the account could
        # have replaced its checkpoint directory with one into another account's (issue #45).
        below = m.path[len(m.root.rstrip("/")):].strip("/") if m.root and m.path.startswith(m.root) else ""
        parts = below.split("/") if below else []
        for i in range(len(parts)):
            comp = f"{m.root.rstrip('/')}/{'/'.join(parts[:i + 1])}"
            what = shlex.quote(f"isthmus: {comp} is a symbolic link: a job's directories are never links")
            lines.append(f"[ ! -L {shlex.quote(comp)} ] || {{ echo {what} >&2; exit 66; }}")
        if m.create:
            lines.append(f"(umask 077 && mkdir -p -- {path}) 2>/dev/null")
        what = shlex.quote(f"isthmus: storage {m.storage!r} is not available at {m.path} on this node")
        lines.append(f"[ -d {path} ] || {{ echo {what} >&2; exit 66; }}")
        if not m.read_only:
            what = shlex.quote(f"isthmus: storage {m.storage!r} is not writable at {m.path} for this job's user")
            lines.append(f"[ -w {path} ] || {{ echo {what} >&2; exit 66; }}")
    return lines


def render_script(command: list[str] | tuple[str, ...], env: dict[str, str], nodes: int,
                  output: str | None = None, mounts: Sequence[VolumeMount] = ()) -> str:
    if not command:
        raise SubmissionRejected("command is empty", backend="slurm")
    lines = ["#!/bin/sh", "# generated by isthmus: every word below is single-quoted"]
    lines += mount_lines(mounts)
    for key, value in sorted(env.items()):
        if not _ENV_NAME.fullmatch(key):
            raise SubmissionRejected(f"invalid environment variable name {key!r}", backend="slurm")
        if "\0" in value:
            raise SubmissionRejected(f"environment variable {key} contains a NUL byte", backend="slurm")
        lines.append(f"export {key}={shlex.quote(value)}")
    for arg in command:
        if "\0" in arg:
            raise SubmissionRejected("command contains a NUL byte", backend="slurm")
    # One task per node; srun starts the command on every node of the gang at once and
    # kills the gang when one worker fails. srun then reports the highest task code, and
    # the killed peers' 143 would hide the real failure, so each task runs under a tiny
    # wrapper that exits 0 when Slurm terminates the step. (The job state still says
    # CANCELLED/TIMEOUT when that is why it ended; the command's stdin is /dev/null.)
    srun = ["srun", f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1",
            "--kill-on-bad-exit=1", *([f"--output={output}"] if output else []), "--", "/bin/sh", "-c", TASK_WRAPPER, "isthmus-task"]
    lines.append("exec " + " ".join(shlex.quote(a) for a in srun) + " "
                 + " ".join(shlex.quote(a) for a in command))
    return "\n".join(lines) + "\n"


def refuse_job_user(user: str) -> None:
    """A job never runs as root or as the gateway's own user (issue #12, finding 6).

    The CLI transport runs a command as the gateway itself when the user is its own
    (right for queries and cancels), and the REST transport falls back to its token user
    when the user is empty: either would run the job's script with the gateway's or
    SlurmUser's privileges. The gateway refuses system users at submit (403); this is the
    backstop, shared by both transports, for anything that reaches the adapter anyway.
    """
    me = pwd.getpwuid(os.geteuid()).pw_name
    if not user or user in ("root", me):
        raise SubmissionRejected(f"jobs never run as {user or '(no user)'} (root or the gateway's own user)",
                                 backend="slurm")
    try:
        uid = pwd.getpwnam(user).pw_uid
    except KeyError:
        return  # not known here; the cluster resolves (or refuses) it
    if uid == 0:
        raise SubmissionRejected(f"jobs never run as {user} (uid 0)", backend="slurm")


def build_spec(request: SubmitRequest, *, partition: str, account: str | None,
               work_dir: str) -> JobSpec:
    if request.workers < 1:
        raise SubmissionRejected("workers must be at least 1", backend="slurm")
    refuse_job_user(request.user)
    gres = f"gpu:{request.gpu_type}:{request.gpus_per_worker}" if request.gpu_type \
        else f"gpu:{request.gpus_per_worker}"
    name = _JOB_NAME.sub("-", request.name or "isthmus")[:100] or "isthmus"
    return JobSpec(
        name=name,
        comment=gateway_comment(request.gateway_job_id, request.attempt),
        user=request.user,
        partition=partition,
        account=account,
        nodes=request.workers,
        gres=gres if request.gpus_per_worker > 0 else "",
        cpus_per_node=max(1, request.cpus_per_worker),
        memory_mib_per_node=max(1, request.memory_mib_per_worker),
        # Slurm's limit is in whole minutes; round up so the job never gets less.
        time_limit_min=max(1, math.ceil(request.time_limit_s / 60)),
        work_dir=work_dir,
        output=f"{work_dir.rstrip('/')}/slurm-%j.out",
        script=render_script(list(request.command), dict(request.env), request.workers,
                             output=worker_output_path(work_dir, request.gateway_job_id, "%t"), mounts=request.mounts),
        reservation=request.reservation or None,
        exclude=node_names(request.exclude_nodes),
        **topology_flags(request),
    )
