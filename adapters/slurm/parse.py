"""Turn Slurm's JSON job/node records into the contract's dataclasses.

slurmrestd and the CLIs' ``--json`` output share Slurm's data_parser, so one parser
serves both transports. The shapes differ by data_parser version, and this module
accepts all of them:

* v0.0.38 (Slurm 22.05): ``job_state`` is a string, times are plain integers, and
  ``exit_code`` is the raw wait(2) status (``3 << 8`` for ``exit 3``).
* v0.0.40 .. v0.0.42 (Slurm 23.11 .. 25.x and later): ``job_state`` is a list of
  strings, numbers are ``{"set", "infinite", "number"}`` structs and ``exit_code`` is
  ``{"status": [...], "return_code": ..., "signal": {"id": ..., "name": ...}}``.

Reservations (:func:`windows`) arrive in the same JSON shapes, except from 22.05's CLI,
which has no ``--json`` for them: :func:`reservation_text` turns its text into the same
record first, and the pyslurm worker builds the record from pyslurm's objects.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping
from datetime import UTC, datetime, tzinfo
from typing import Any

from adapters.base import (
    NODE_FAILURE,
    TIME_LIMIT,
    BackendState,
    JobStatus,
    PoolCapacity,
    TopologyDomain,
    Window,
)

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


def number(value: Any) -> int | None:
    """An integer from either a plain int or a ``{"set", "infinite", "number"}`` struct."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, Mapping):
        if not value.get("set", True) or value.get("infinite"):
            return None
        value = value.get("number")
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


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


def timestamp(value: Any) -> datetime | None:
    n = number(value)
    if not n or n <= 0:
        return None
    return datetime.fromtimestamp(n, tz=UTC)


_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def expand_hostlist(hostlist: str) -> tuple[str, ...]:
    """``gpu[1-3,7],cpu01`` -> ``("gpu1", "gpu2", "gpu3", "gpu7", "cpu01")``."""
    out: list[str] = []
    for part in _split_top_level(hostlist or ""):
        out.extend(_expand_one(part))
    return tuple(out)


def _split_top_level(text: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur:
        parts.append(cur)
    return [p.strip() for p in parts if p.strip() and p.strip() != "(null)"]


def _expand_one(part: str) -> list[str]:
    m = re.search(r"\[([^\]]*)\]", part)
    if not m:
        return [part]
    head, tail = part[: m.start()], part[m.end():]
    names: list[str] = []
    for rng in m.group(1).split(","):
        r = _RANGE.fullmatch(rng.strip())
        if not r:
            continue
        lo, hi = r.group(1), r.group(2) or r.group(1)
        width = len(lo)
        for i in range(int(lo), int(hi) + 1):
            names.extend(_expand_one(f"{head}{i:0{width}d}{tail}"))
    return names


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


# ------------------------------------------------------------------------ capacity

_BUSY_OR_GONE = {"ALLOCATED", "MIXED", "COMPLETING", "DOWN", "DRAIN", "DRAINING", "DRAINED",
                 "FAIL", "FAILING", "FUTURE", "INVALID", "MAINT", "MAINTENANCE", "NOT_RESPONDING",
                 "POWER_DOWN", "POWERED_DOWN", "POWERING_DOWN", "POWERING_UP", "REBOOT_REQUESTED",
                 "REBOOT_ISSUED", "RESERVED", "UNKNOWN", "PLANNED", "BLOCKED"}
_GRES_GPU = re.compile(r"(?:^|,)gpu(?::([A-Za-z0-9_.-]+))?:(\d+)")


def node_states(node: Mapping[str, Any]) -> set[str]:
    raw = node.get("state")
    names = [raw] if isinstance(raw, str) else list(raw or [])
    names += list(node.get("state_flags") or [])
    return {str(n).upper() for n in names}


def node_gpus(node: Mapping[str, Any]) -> tuple[int, tuple[str, ...]]:
    total, types = 0, []
    for typ, count in _GRES_GPU.findall(re.sub(r"\([^)]*\)", "", str(node.get("gres") or ""))):
        total += int(count)
        if typ and not typ.isdigit():
            types.append(typ)
    return total, tuple(types)


def node_idle(node: Mapping[str, Any], *, reserved: Collection[str] = (), held: Collection[str] = ()) -> bool:
    """Free for a whole-node gang (see :func:`pool_capacity` for ``reserved`` and ``held``)."""
    st = node_states(node)
    if node.get("name") in held:
        # Idle in the holder's own reservation: free for the holder, whatever Slurm plans on it
        # for jobs that cannot run there before the reservation ends (issue #45, finding 6).
        st = st - {"RESERVED", "PLANNED"}
    return ("IDLE" in st and not (st & _BUSY_OR_GONE) and not number(node.get("alloc_cpus"))
            and node.get("name") not in reserved)


def pool_capacity(nodes: Iterable[Mapping[str, Any]], *, reserved: Collection[str] = (),
                  held: Collection[str] = ()) -> list[PoolCapacity]:
    """Each partition's capacity; a node named in ``reserved`` (one of an active reservation)
    is never idle, whatever state Slurm has got round to giving it. A node in ``held`` (one of
    the gateway's own active reservations) is idle when nothing but that reservation takes it:
    the gateway's planner keeps it for the reservation's account."""
    pools: dict[str, dict[str, Any]] = {}
    for node in nodes:
        gpus, types = node_gpus(node)
        idle = node_idle(node, reserved=reserved, held=held)
        for part in node.get("partitions") or []:
            p = pools.setdefault(part, {"total_nodes": 0, "idle_nodes": 0, "total_gpus": 0,
                                        "free_gpus": 0, "per_node": set(), "types": set(), "mem": 0, "cpus": 0})
            p["total_nodes"] += 1
            p["total_gpus"] += gpus
            p["per_node"].add(gpus)
            p["types"].update(types)
            p["mem"] = max(p["mem"], number(node.get("real_memory")) or 0)
            p["cpus"] = max(p["cpus"], number(node.get("cpus")) or 0)
            if idle:
                p["idle_nodes"] += 1
                p["free_gpus"] += gpus
    out = []
    for name, p in sorted(pools.items()):
        per_node = max(p["per_node"]) if p["per_node"] else 0
        out.append(PoolCapacity(
            pool=name, total_nodes=p["total_nodes"], idle_nodes=p["idle_nodes"],
            total_gpus=p["total_gpus"], free_gpus=p["free_gpus"], gpus_per_node=per_node,
            gpu_types=tuple(sorted(p["types"])),
            detail=f"{p['idle_nodes']}/{p['total_nodes']} nodes idle (exclusive allocation: "
                   f"a node with any job is not free)",
            memory_mib_per_node=int(p["mem"]), cpus_per_node=int(p["cpus"]),
        ))
    return out


# ------------------------------------------------------------------- reservations

# A reservation without an end ("EndTime=Unknown", ``"infinite": true``, unset). A fixed far
# future rather than datetime.max: the gateway compares, subtracts and adds time zones to
# window ends, and datetime.max overflows on any of that. The same instant as
# gateway/domain/windows.FAR, which the planner reads as "no end".
NO_END = datetime(9999, 1, 1, tzinfo=UTC)
_SLURM_NO_END = 0xFFFFFFFE  # NO_VAL; INFINITE is one more (v0.0.38 prints them as plain numbers)
_TEXT_KEY = re.compile(r"(?:^|\s)([A-Z][A-Za-z]*)=")


def reservation_text(text: str, *, tz: tzinfo | None = None) -> list[dict[str, Any]]:
    """``scontrol --oneliner show reservation`` (22.05 has no ``--json`` for it) as records in
    the JSON shape :func:`windows` reads. "No reservations in the system" is ``[]``.

    Times are best epoch seconds (the CLI transport runs scontrol with
    ``SLURM_TIME_FORMAT=%s``). Slurm's default, local time such as ``2026-12-06T04:00:00``,
    is read in ``tz`` (None: the gateway host's own zone), so whoever runs scontrol must
    know the zone it ran in (the CLI transport sets ``TZ=UTC``).
    """
    out: list[dict[str, Any]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("ReservationName="):
            continue
        fields: dict[str, str] = {}
        keys = list(_TEXT_KEY.finditer(line))
        for i, m in enumerate(keys):
            if m.group(1) in fields:  # core-spec pairs repeat NodeName=/CoreIDs=
                continue
            if m.group(1) == "Comment":  # free text, always last: spaces and "=" are its own
                fields["Comment"] = line[m.end():]
                break
            end = keys[i + 1].start() if i + 1 < len(keys) else len(line)
            v = line[m.end():end].strip()
            fields[m.group(1)] = "" if v in ("(null)", "N/A", "n/a") else v
        value = fields.get
        out.append({
            "name": value("ReservationName", ""),
            "start_time": _text_time(value("StartTime", ""), tz),
            "end_time": _text_time(value("EndTime", ""), tz),
            "node_list": value("Nodes", ""),
            "partition": value("PartitionName", ""),
            "flags": [f for f in value("Flags", "").split(",") if f],
            "users": value("Users", ""),
            "accounts": value("Accounts", ""),
            "groups": value("Groups", ""),
        })
    return out


def _text_time(text: str, tz: tzinfo | None) -> int | dict[str, Any] | None:
    """One of scontrol's times as the JSON would carry it ("Unknown" is 0 or INFINITE there)."""
    if not text or text == "None":
        return None
    if text == "Unknown":
        return {"set": True, "infinite": True, "number": 0}
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        local = datetime.fromisoformat(text)
    except ValueError:
        return None
    return int((local.replace(tzinfo=tz) if tz and not local.tzinfo else local.astimezone()).timestamp())


def _names(value: Any) -> list[str]:
    """A JSON list, or Slurm's comma-separated text, as names."""
    if isinstance(value, str):
        value = value.split(",")
    return [str(v).strip() for v in value or () if str(v).strip() and str(v).strip() != "(null)"]


def _who(users: list[str], kind: str) -> str:
    allowed = [u for u in users if not u.startswith("-")]
    if allowed:
        return f"{kind} {', '.join(allowed)}"
    return f"all {kind} but {', '.join(u[1:] for u in users)}" if users else ""


def window(record: Mapping[str, Any], partition_nodes: Iterable[str]) -> Window | None:
    """One Slurm reservation as a :class:`~adapters.base.Window` of the partition, or None when
    it takes none of ``partition_nodes``.

    Args:
        record: the reservation as any transport gives it: Slurm's JSON (v0.0.38 plain
            numbers, v0.0.40+ ``{"set", "infinite", "number"}`` structs), 22.05's text via
            :func:`reservation_text`, or the pyslurm worker's record (``end_time`` None).
        partition_nodes: the node names of the partition.

    Returns:
        The window, its times tz-aware UTC; a reservation without an end ends at
        :data:`NO_END`.
    """
    mine = set(partition_nodes)
    nodes = tuple(n for n in dict.fromkeys(expand_hostlist(str(record.get("node_list") or ""))) if n in mine)
    if not nodes:
        return None
    start = timestamp(record.get("start_time")) or datetime.fromtimestamp(0, tz=UTC)
    end_n = number(record.get("end_time"))
    end = NO_END if not end_n or end_n <= 0 or end_n >= _SLURM_NO_END else datetime.fromtimestamp(end_n, tz=UTC)
    flags = [f.upper() for f in _names(record.get("flags"))]
    maintenance = "MAINT" in flags
    name = str(record.get("name") or "")
    who = " and ".join(w for w in (_who(_names(record.get("users")), "users"),
                                _who(_names(record.get("accounts")), "accounts"),
                                _who(_names(record.get("groups")), "groups")) if w)
    detail = f"Slurm reservation {name}" + (" (MAINT)" if maintenance else "") + (f", for {who}" if who else "")
    return Window(name=name, start=start, end=end, nodes=nodes, maintenance=maintenance, detail=detail)


def windows(records: Iterable[Mapping[str, Any]], partition_nodes: Iterable[str], *,
            now: datetime | None = None) -> tuple[Window, ...]:
    """The windows of every reservation that has not ended at ``now`` and takes nodes of the
    partition, earliest first. Every transport's records go through here."""
    now = now or datetime.now(UTC)
    nodes = tuple(partition_nodes)
    found = [w for w in (window(r, nodes) for r in records) if w is not None and w.end > now]
    return tuple(sorted(found, key=lambda w: (w.start, w.name)))


def partition_nodes(nodes: Iterable[Mapping[str, Any]], partition: str) -> tuple[str, ...]:
    """The names of the nodes in ``partition`` (each node record lists its partitions)."""
    return tuple(str(n.get("name")) for n in nodes if partition in (n.get("partitions") or []) and n.get("name"))


# ------------------------------------------------------------------------ topology

# ``scontrol show topology``: topology/block prints ``BlockName=b1 BlockIndex=0 Nodes=...``
# (and ``AggregatedBlock=...`` for the larger sizes, which are not domains of their own);
# topology/tree ``SwitchName=s1 Level=0 LinkSpeed=1 Nodes=...`` (Level 0: a leaf switch).
_TOPO_LINE = re.compile(r"^(BlockName|SwitchName)=(\S+)(?:.*?\sLevel=(\d+))?.*?\sNodes=(\S+)")
TOPOLOGY_LEVELS = {"BlockName": "block", "SwitchName": "switch"}


def topology_text(text: str) -> list[tuple[str, str, tuple[str, ...]]]:
    """(level, domain name, nodes) of each block or leaf switch ``scontrol show topology`` prints;
    [] for topology/flat (no domains)."""
    out = []
    for line in text.splitlines():
        m = _TOPO_LINE.match(line.strip())
        if m is None:
            continue
        kind, name, level, nodes = m.groups()
        if kind == "SwitchName" and level not in (None, "0"):
            continue  # an upper switch joins leaf switches: the whole tree, no tighter than the pool
        out.append((TOPOLOGY_LEVELS[kind], name, expand_hostlist(nodes)))
    return out


def topology(domains: Iterable[tuple[str, str, tuple[str, ...]]], partition_nodes: Iterable[str],
             idle: Collection[str]) -> tuple[TopologyDomain, ...]:
    """The domains that have nodes of the partition, with how many of those are idle."""
    mine = set(partition_nodes)
    out = []
    for level, name, nodes in domains:
        ours = tuple(n for n in nodes if n in mine)
        if ours:
            out.append(TopologyDomain(level=level, name=name, nodes=ours, idle_nodes=sum(n in idle for n in ours)))
    return tuple(out)
