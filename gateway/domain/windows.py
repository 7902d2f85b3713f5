"""Windows on a pool (maintenances, reservations for someone else) as the planner's outages, in words.

A window comes from one of two places (docs/planning.md):

* the gateway's own, made by an admin (``/v1/admin/pools/{name}/windows``): the backend
  does not know it, so the snapshot still shows its nodes free; it is booked from
  ``max(start, now)`` to its end;
* the backend's own (a Slurm reservation, ``adapters.base.Window`` in the capacity
  snapshot): once active, its nodes are already not idle in the snapshot, so they come
  back at its end instead.

Units follow the pool: whole nodes on a node-exclusive pool, GPUs elsewhere (a node is
``gpus_per_node`` GPUs). A window without named nodes takes the whole pool. Pure: the
dispatch round and the scheduling simulator call the same code.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone

from gateway.domain.planner import Outage
from gateway.domain.routing import PoolView

FAR = datetime(9999, 1, 1, tzinfo=timezone.utc)  # a window with no end


@dataclasses.dataclass(frozen=True)
class PlannedWindow:
    """A window as the gateway plans with it (either source)."""

    pool: str
    start: datetime
    end: datetime
    nodes: tuple[str, ...] = ()  # () = the whole pool
    maintenance: bool = True
    reason: str = ""  # the admin's reason, or the backend's words
    source: str = "gateway"  # "gateway" | the backend's kind ("slurm")
    name: str = ""  # the gateway window's id, or the backend's name for it
    in_snapshot: bool = False  # a backend window: active ones are already not idle


def from_backend(views: Mapping[str, PoolView]) -> list[PlannedWindow]:
    """The backends' own windows in the round's capacity snapshot."""
    out: list[PlannedWindow] = []
    for name, view in views.items():
        if view.capacity is None:
            continue
        for pc in view.capacity.pools:
            for w in pc.windows:
                out.append(PlannedWindow(pool=name, start=w.start, end=w.end, nodes=tuple(w.nodes),
                                         maintenance=w.maintenance, reason=w.detail, source=view.kind,
                                         name=w.name, in_snapshot=True))
    return out


def units(window: PlannedWindow, view: PoolView) -> int:
    """What the window takes of the pool, in the planner's unit (never more than the pool has)."""
    if view.node_exclusive:
        total = view.total_nodes
        taken = len(window.nodes) if window.nodes else total
    else:
        total = view.total_gpus
        taken = len(window.nodes) * view.gpus_per_node if window.nodes else total
    return max(0, min(taken, total))


def when(start: datetime, end: datetime) -> str:
    """"from Tue 8 Dec 06:00 to 10:00 UTC": the day only once when both are on the same one."""
    start, end = start.astimezone(timezone.utc), end.astimezone(timezone.utc)
    first = f"{start:%a} {start.day} {start:%b %H:%M}"
    if end >= FAR:
        return f"from {first} UTC, with no end set"
    if end.date() == start.date():
        return f"from {first} to {end:%H:%M} UTC"
    return f"from {first} to {end:%a} {end.day} {end:%b %H:%M} UTC"


def words(window: PlannedWindow) -> str:
    """The window in a job's reason: which pool, what, when, and why."""
    what = "in maintenance" if window.maintenance else "reserved"
    if window.nodes:
        n = len(window.nodes)
        subject = f"{n} node{'s' if n != 1 else ''} of {window.pool} ({', '.join(window.nodes[:4])}" \
                  f"{', ...' if n > 4 else ''}) {'is' if n == 1 else 'are'} {what}"
    else:
        subject = f"{window.pool} is {what}"
    why = f" ({window.reason})" if window.reason else ""
    return f"{subject} {when(window.start, window.end)}{why}"


def limit_words(seconds: float) -> str:
    """A time limit as people say it: "8 h", "1 h 30 min", "45 min", "2 d 4 h"."""
    s = int(seconds)
    d, rest = divmod(s, 86400)
    h, rest = divmod(rest, 3600)
    m = rest // 60
    parts = [f"{d} d" if d else "", f"{h} h" if h else "", f"{m} min" if m else ""]
    return " ".join(p for p in parts if p) or f"{s} s"


def crossing_words(crossed: Iterable[str], time_limit_s: float) -> str:
    """"<window>; this job's 8 h limit would cross it" (several: "them")."""
    crossed = list(dict.fromkeys(crossed))
    if not crossed:
        return ""
    it = "it" if len(crossed) == 1 else "them"
    return f"{'; '.join(crossed)}; this job's {limit_words(time_limit_s)} limit would cross {it}"


def outages(views: Mapping[str, PoolView], windows: Iterable[PlannedWindow], *, now: datetime) -> list[Outage]:
    """The planner's outages of every window that has not ended, on pools with a snapshot."""
    t_now = now.timestamp()
    out: list[Outage] = []
    for w in windows:
        view = views.get(w.pool)
        if view is None or view.capacity is None:
            continue
        end = w.end.timestamp() if w.end < FAR else float("inf")
        if end <= t_now:
            continue
        n = units(w, view)
        if n:
            out.append(Outage(pool=w.pool, units=n, start=w.start.timestamp(), end=end, words=words(w),
                              in_snapshot=w.in_snapshot))
    return out
