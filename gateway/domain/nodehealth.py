"""Which nodes are suspect, which a retry avoids, what each bad node cost: one rule, pure
(issue #48; docs/recovery.md, "Node health").

The input is the registry's record of attempts that ended (each attempt's pool, nodes,
account, end and outcome, and its charged GPU-seconds), plus the backends' own verdicts on
nodes where they give one (a Slurm node set DOWN or DRAIN with a reason; a Kubernetes node
NotReady or cordoned), plus the times an admin cleared a node. Nothing here reads a database
or a cluster.

The rule:

* an **infrastructure failure** is an attempt's end that the backend blames on its nodes
  (``node_failure``, the retry rule's word: gateway/domain/retry.py). A preemption, the job's
  own exit, a time limit and a cancel say nothing about a node;
* a node is **suspect** when infrastructure failures on it ended attempts of at least
  ``min_accounts`` different accounts within ``window_s`` (one account's broken job that fails
  wherever it lands is not the node's fault; two accounts' jobs failing on the same node is),
  or when its backend itself has it down or drained for a reason that is not the gateway's;
* a suspect node stays suspect (quarantined: no gang is placed on it) until an admin clears
  it after its last failure, or, where ``quiet_s`` is set, until no failure has touched it for
  ``quiet_s``;
* a **retry avoids** the nodes whose failure ended that job's earlier attempts, for
  ``avoid_s`` after that failure;
* a failure is **blamed** on the nodes of the attempt that its backend had out of service
  when the failure was seen (``failed_nodes``: a Slurm node DOWN, a Kubernetes node NotReady
  or gone); when the backend named none, on every node of the attempt (each was part of it);
* the GPU-hours an infrastructure failure **cost** are the failed attempt's charged
  GPU-seconds, shared out evenly over the nodes it is blamed on.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta

from gateway.domain.retry import EXIT_CODE, NODE_FAILURE

INFRASTRUCTURE = frozenset({NODE_FAILURE})

Node = tuple[str, str]  # (pool, node name)


@dataclasses.dataclass(frozen=True)
class AttemptEnd:
    """One ended attempt as the registry keeps it."""

    job_id: str
    account: str
    pool: str
    nodes: tuple[str, ...]
    ended_at: datetime
    outcome: str  # retry.py's words: node_failure, preempted, exit_code, ... (or succeeded)
    charged_gpu_seconds: int = 0
    failed_nodes: tuple[str, ...] = ()  # those its backend had out of service at the failure

    @property
    def infrastructure(self) -> bool:
        return self.outcome in INFRASTRUCTURE

    @property
    def blamed(self) -> tuple[str, ...]:
        """The nodes the failure is blamed on (module docstring)."""
        named = tuple(n for n in self.failed_nodes if n in self.nodes)
        return named or self.nodes


# An attempt's end in the record's words (AttemptEnd.outcome).
SUCCEEDED, CANCELLED, TIME_LIMIT, LOST = "succeeded", "cancelled", "time_limit", "lost"


def outcome_of(final_state: str, *, failure: str = "", exit_code: int | None = None, seen: bool = True) -> str:
    """How a job's last attempt ended, from its final state (``succeeded``, ``failed``,
    ``cancelled``) and what the backend said: ``failure`` (retry.py's and the adapters' word,
    ``node_failure`` or ``time_limit``), its exit code, and whether the backend still showed
    the job (``seen``; False: it disappeared, ``lost``)."""
    if final_state in (SUCCEEDED, CANCELLED):
        return final_state
    if failure:
        return failure
    if not seen:
        return LOST
    return EXIT_CODE if exit_code else "failed"


@dataclasses.dataclass(frozen=True)
class Thresholds:
    """The rule's settings (documented defaults in docs/recovery.md)."""

    window_s: float = 3600.0  # failures counted together
    min_accounts: int = 2  # distinct accounts whose attempts a node failed within the window
    quiet_s: float | None = None  # a suspect node clears itself after this long without failure
    avoid_s: float = 6 * 3600.0  # a retry avoids the node that failed its job for this long

    def __post_init__(self) -> None:
        if self.window_s <= 0 or self.avoid_s < 0 or self.min_accounts < 1:
            raise ValueError("window_s > 0, avoid_s >= 0 and min_accounts >= 1")
        if self.quiet_s is not None and self.quiet_s <= 0:
            raise ValueError("quiet_s, when set, must be > 0")


@dataclasses.dataclass(frozen=True)
class Verdict:
    """A node's standing, with the words the waiting reasons, the pool's page and the admins'
    event use."""

    pool: str
    node: str
    suspect: bool
    reason: str
    failures: int  # infrastructure failures on it in the window
    accounts: tuple[str, ...]  # whose attempts they ended
    last_failure: datetime | None
    lost_gpu_seconds: float  # all its infrastructure failures ever cost (in the record given)
    by_backend: bool = False  # suspect because its backend has it out of service (not its failures)


def verdicts(ends: Iterable[AttemptEnd], *, now: datetime, thresholds: Thresholds = Thresholds(),
             cleared: Mapping[Node, datetime] | None = None,
             backend_down: Mapping[Node, str] | None = None,
             suspected: Mapping[Node, datetime] | None = None) -> dict[Node, Verdict]:
    """Every node that appears in ``ends``, ``backend_down`` or ``suspected``, with its verdict.

    ``cleared``: when an admin last cleared a node (failures before it no longer count);
    ``backend_down``: nodes the backend itself has down or drained, with its reason;
    ``suspected``: since when a node was found suspect earlier (a record kept by the caller, so
    that a quarantine outlives the failures the caller still reads): it stays so until cleared
    after that time, or, with ``quiet_s``, until that long passes without a failure.
    """
    cleared = cleared or {}
    backend_down = backend_down or {}
    suspected = suspected or {}
    window = timedelta(seconds=thresholds.window_s)
    failures: dict[Node, list[AttemptEnd]] = {}
    lost: dict[Node, float] = {}
    seen: set[Node] = set(backend_down) | set(suspected)
    for end in ends:
        blamed = end.blamed
        for node in end.nodes:
            key = (end.pool, node)
            seen.add(key)
            if not end.infrastructure or node not in blamed:
                continue
            lost[key] = lost.get(key, 0.0) + end.charged_gpu_seconds / len(blamed)
            if end.ended_at > cleared.get(key, datetime.min.replace(tzinfo=end.ended_at.tzinfo)):
                failures.setdefault(key, []).append(end)
    out: dict[Node, Verdict] = {}
    for key in sorted(seen):
        mine = sorted(failures.get(key, []), key=lambda e: e.ended_at)
        last = mine[-1].ended_at if mine else None
        suspect, reason, in_window = _standing(mine, now=now, window=window, thresholds=thresholds)
        since = suspected.get(key)
        if not suspect and since is not None and (key not in cleared or cleared[key] < since):
            quiet = thresholds.quiet_s is not None and now - max(since, last or since) >= timedelta(
                seconds=thresholds.quiet_s)
            if not quiet:
                suspect, reason = True, (f"quarantined since {since:%Y-%m-%d %H:%M} UTC after infrastructure failures "
                                         "of several accounts; until an admin clears it")
        by_backend = False
        if key in backend_down and not suspect:
            suspect, by_backend = True, True
            reason = f"its backend has it out of service: {backend_down[key]}"
        out[key] = Verdict(pool=key[0], node=key[1], suspect=suspect, reason=reason, failures=len(in_window),
                           accounts=tuple(sorted({e.account for e in in_window})), last_failure=last,
                           lost_gpu_seconds=lost.get(key, 0.0), by_backend=by_backend)
    return out


def _standing(mine: list[AttemptEnd], *, now: datetime, window: timedelta,
              thresholds: Thresholds) -> tuple[bool, str, list[AttemptEnd]]:
    """(suspect, why, the failures of the latest window) of one node from its failures since it
    was last cleared, oldest first."""
    if not mine:
        return False, "no infrastructure failure", []
    last = mine[-1].ended_at
    if thresholds.quiet_s is not None and now - last >= timedelta(seconds=thresholds.quiet_s):
        return False, f"no infrastructure failure for {_span(now - last)}: cleared itself", []
    # Suspect once any window of window_s held failures of enough accounts: it stays so
    # (quarantined) until cleared, even when the window has moved past them.
    for i, first in enumerate(mine):
        together = [e for e in mine[i:] if e.ended_at - first.ended_at <= window]
        accounts = sorted({e.account for e in together})
        if len(accounts) >= thresholds.min_accounts:
            return True, (f"{len(together)} infrastructure failures ended jobs of {len(accounts)} accounts "
                          f"({', '.join(accounts)}) within {_span(together[-1].ended_at - first.ended_at)}; "
                          f"quarantined until an admin clears it"
                          + (f" or {_span(timedelta(seconds=thresholds.quiet_s))} pass without one"
                             if thresholds.quiet_s is not None else "")), together
    recent = [e for e in mine if now - e.ended_at <= window]
    return False, (f"{len(recent)} infrastructure failure(s) of one account within {_span(window)}: "
                   "not the node's alone" if recent else "no recent infrastructure failure"), recent


def avoided(job_ends: Iterable[AttemptEnd], *, now: datetime, thresholds: Thresholds = Thresholds()) -> set[Node]:
    """The nodes a retry of a job avoids: those whose failure ended one of its attempts within
    ``avoid_s`` (Slurm ``--exclude``, a required node affinity ``NotIn`` on Kubernetes)."""
    horizon = timedelta(seconds=thresholds.avoid_s)
    return {(e.pool, node) for e in job_ends if e.infrastructure and now - e.ended_at <= horizon
            for node in e.blamed}


def _span(delta: timedelta) -> str:
    s = int(delta.total_seconds())
    if s >= 3600:
        return f"{s / 3600:.1f} h"
    if s >= 60:
        return f"{s // 60} min"
    return f"{s} s"
