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
from datetime import UTC, datetime

from gateway.domain.planner import Hold, Outage
from gateway.domain.routing import PoolView

FAR = datetime(9999, 1, 1, tzinfo=UTC)  # a window with no end


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
    start, end = start.astimezone(UTC), end.astimezone(UTC)
    first = f"{start:%a} {start.day} {start:%b %H:%M}"
    if end >= FAR:
        return f"from {first} UTC, with no end set"
    if end.date() == start.date():
        return f"from {first} to {end:%H:%M} UTC"
    return f"from {first} to {end:%a} {end.day} {end:%b %H:%M} UTC"


def words(window: PlannedWindow, pool_nodes: int = 0) -> str:
    """The window in a job's reason: which pool, what, when, and why. A window on every one of
    the pool's ``pool_nodes`` nodes is the pool's."""
    what = "in maintenance" if window.maintenance else "reserved"
    if window.nodes and not (pool_nodes and len(window.nodes) >= pool_nodes):
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
            out.append(Outage(pool=w.pool, units=n, start=w.start.timestamp(), end=end,
                              words=words(w, view.total_nodes), in_snapshot=w.in_snapshot))
    return out


# ---------------------------------------------------------------- advance reservations (holds)


@dataclasses.dataclass(frozen=True)
class PlannedHold:
    """An advance reservation as the gateway plans with it: ``gpus`` or ``nodes`` of ``pool``
    held for ``account`` over ``[start, end)``."""

    id: str
    pool: str
    account: str
    start: datetime
    end: datetime
    gpus: int | None = None
    nodes: int | None = None
    reason: str = ""
    by: str = ""  # who made it
    native: str = ""  # the backend's own reservation of it, once the backend has it ("": none)
    native_note: str = ""  # what became of that, in words


def hold_need(gpus: int | None, nodes: int | None, view: PoolView) -> int:
    """What a hold of ``gpus`` or ``nodes`` asks of the pool, in the planner's unit (on a
    node-exclusive pool, GPUs take whole nodes)."""
    if view.node_exclusive:
        return nodes if nodes is not None else -(-int(gpus or 0) // max(view.gpus_per_node, 1))
    return gpus if gpus is not None else int(nodes or 0) * view.gpus_per_node


def shortfall(h: PlannedHold, view: PoolView | None) -> str:
    """Why the hold cannot be honoured in full on its pool now ("" when it can)."""
    if view is None or view.capacity is None:
        return f"{h.pool} does not answer: the reservation cannot be checked"
    need = hold_need(h.gpus, h.nodes, view)
    total, unit = (view.total_nodes, "nodes") if view.node_exclusive else (view.total_gpus, "GPUs")
    if need > total:
        return f"{h.pool} has {total} {unit} now; the reservation needs {need} (short by {need - total})"
    return ""


def hold_words(h: PlannedHold, *, for_others: bool = False) -> str:
    """The reservation in words: for admins (the API, the admin page) with its account and
    reason; ``for_others``, in the waiting reason of another account's job, only what and
    when: which account holds capacity, and why, is not another tenant's business (issue
    #45; docs/planning.md)."""
    amount = f"{h.gpus} GPU{'s' if h.gpus != 1 else ''}" if h.gpus is not None else \
        f"{h.nodes} node{'s' if h.nodes != 1 else ''}"
    verb = "is" if (h.gpus if h.gpus is not None else h.nodes) == 1 else "are"
    if for_others:
        return f"{amount} of {h.pool} {verb} reserved {when(h.start, h.end)}"
    why = f" ({h.reason})" if h.reason else ""
    return f"{amount} of {h.pool} {verb} reserved for {h.account} {when(h.start, h.end)}{why}"


HOLD_END_SLACK_S = 300.0


@dataclasses.dataclass(frozen=True)
class HoldGang:
    """A gang of a hold's account on its pool: its units, when it began (started, or dispatched)
    and its expected end, both as the planner's releases count them."""

    pool: str
    account: str
    units: int
    began: float
    ends: float


def holds(views: Mapping[str, PoolView], planned: Iterable[PlannedHold], gangs: Iterable[HoldGang], *,
          now: datetime) -> list[Hold]:
    """The planner's holds: each capped at its pool's total, with the gangs of its account that
    began inside it and end by its end counted in it (first come, up to its units)."""
    t_now = now.timestamp()
    free_gangs = sorted(gangs, key=lambda g: (g.began, g.ends))
    taken: set[int] = set()
    out: list[Hold] = []
    for h in sorted(planned, key=lambda h: (h.start, h.id)):
        view = views.get(h.pool)
        if view is None or view.capacity is None or h.end.timestamp() <= t_now:
            continue
        total = view.total_nodes if view.node_exclusive else view.total_gpus
        units = min(hold_need(h.gpus, h.nodes, view), total)
        if units <= 0:
            continue
        start, end = h.start.timestamp(), h.end.timestamp()
        in_use: list[tuple[float, int]] = []
        used = 0
        for i, g in enumerate(free_gangs):
            if i in taken or g.pool != h.pool or g.account != h.account:
                continue
            # Began inside it (a minute's slack for the claim's clock) and ends by its end (five
            # minutes' slack: a gang planned to end exactly at the end starts a little after its claim).
            if g.began >= start - 60 and g.ends <= end + HOLD_END_SLACK_S and used + g.units <= units:
                taken.add(i)
                used += g.units
                in_use.append((g.ends, g.units))
        # Its words appear only in other accounts' waiting reasons (planner.py): without the account or reason.
        out.append(Hold(h.id, h.pool, frozenset({h.account}), units, start, end, hold_words(h, for_others=True),
                        tuple(in_use)))
    return out
