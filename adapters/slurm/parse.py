"""Turn Slurm's JSON node, reservation and topology records into the contract's dataclasses,
and read the values every record carries the same way (``number``, ``timestamp``,
``expand_hostlist``). A job record becomes a ``JobStatus`` in job_record.py.

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
    PoolCapacity,
    TopologyDomain,
    Window,
)


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
            p = pools.setdefault(part, {"total_nodes": 0, "idle_nodes": 0, "total_gpus": 0, "names": [],
                                        "free_gpus": 0, "per_node": set(), "types": set(), "mem": 0, "cpus": 0})
            p["total_nodes"] += 1
            p["names"].append(str(node.get("name") or ""))
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
            nodes=tuple(sorted(n for n in p["names"] if n)),
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
