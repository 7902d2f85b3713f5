"""The quota rules, pure: whether a gang fits its account chain's limits, what a GPU-hour
budget says of a job, which jobs no limit would ever admit (issue #46).

Every entry point judges by these functions over a read-only :class:`ChainView` of the
account chains (their limits, what their subtrees hold, what they were charged this
period) and the pools' billing terms:

* a single job's reservation (``gateway/ledger/service.py::reserve``, under the chain's
  lock) and ``admission_check`` (``gateway/ledger/rules.py``, no lock);
* the submit path: the budget verdict of a job or of a job set's shape, and the
  never-admissible check (``gateway/jobs/admission.py``);
* the caps on waiting jobs at submit (:func:`cap_refusal` over the counts
  ``gateway/jobs/caps.py::read_caps`` read, for single jobs, batches and job sets);
* a requeued run's re-admission against the budgets (:func:`requeue_refusal`,
  ``gateway/ledger/requeues.py``);
* the dispatch round: :class:`Tally` answers ``decide`` (gateway/domain/decide.py) from
  the view the round read with its snapshot, counts what the round reserved before each
  job, and returns the reservations it wants; the apply step writes them under the
  chains' locks and judges the limited chains again there with fresh totals
  (``gateway/ledger/round.py``).

Nothing here reads a database or changes a row; the words of every refusal are the
ledger's (docs/ledger.md).
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from datetime import date, datetime, timedelta
from typing import Any

from gateway.domain.shapes import normalise_gpu_type
from gateway.domain.tree import walk_up


@dataclasses.dataclass(frozen=True)
class Quota:
    """An account's limits (one ``account_quota`` row; None: not set)."""

    max_gpus: int | None = None
    budget_gpu_seconds: int | None = None
    budget_period: str = "month"
    budget_window_days: int = 30


@dataclasses.dataclass
class Held:
    """What an account's subtree holds now: reserved GPUs and committed GPU-seconds."""

    reserved_gpus: int = 0
    committed_gpu_seconds: int = 0


@dataclasses.dataclass(frozen=True)
class PoolTerms:
    """What the ledger knows of the pools: each known pool's cost, the routable ones (by
    name), and the billing weights ((pool, GPU type or "*") -> weight)."""

    costs: Mapping[str, float | None] = dataclasses.field(default_factory=dict)
    routable: tuple[str, ...] = ()
    weights: Mapping[tuple[str, str], float] = dataclasses.field(default_factory=dict)

    def known(self) -> frozenset[str]:
        return frozenset(self.costs)

    def weight(self, pool: str, gpu_type: str | None) -> float:
        """The GPU type's weight in ``pool``, else the pool's default ("*"), else the pool's cost, else 1."""
        gpu_type = normalise_gpu_type(gpu_type)
        for key in ((pool, gpu_type or "*"), (pool, "*")):
            if key in self.weights:
                return float(self.weights[key])
        cost = self.costs.get(pool)
        return float(cost) if cost is not None else 1.0

    def cheapest(self, gpu_type: str | None) -> float:
        """The lowest weight of the routable pools (1 with none): a job routable to either
        pool is not judged by the dearer one."""
        return min((self.weight(p, gpu_type) for p in self.routable), default=1.0)


@dataclasses.dataclass
class ChainView:
    """The account chains as read (a round's, or one job's under its lock).

    ``held`` and ``pool_held`` are what the subtrees hold; a :class:`Tally` adds the
    round's reservations to its own copy. ``charged`` is what each account WITH a budget
    was charged in its budget's current period. ``pool_limited`` names the accounts with a
    per-pool limit on any pool (whether the per-job rules apply at all).
    """

    parent: Mapping[str, str | None]
    quotas: Mapping[str, Quota] = dataclasses.field(default_factory=dict)
    held: dict[str, Held] = dataclasses.field(default_factory=dict)
    pool_limits: Mapping[tuple[str, str], int] = dataclasses.field(default_factory=dict)
    pool_held: dict[tuple[str, str], int] = dataclasses.field(default_factory=dict)
    charged: Mapping[str, int] = dataclasses.field(default_factory=dict)
    pool_limited: frozenset[str] = frozenset()
    pools: PoolTerms = dataclasses.field(default_factory=PoolTerms)

    def chain(self, account: str) -> tuple[str, ...] | None:
        """The account and its ancestors, root first; None when it cannot be walked here."""
        return walk_up(self.parent, account)

    def counting(self) -> ChainView:
        """A copy whose totals (``held``, ``pool_held``) reservations may be added to (:func:`add`),
        leaving this view as read."""
        return dataclasses.replace(self, held={n: dataclasses.replace(h) for n, h in self.held.items()},
                                   pool_held=dict(self.pool_held))

    def limited(self, names: Iterable[str]) -> bool:
        """Whether a limit the ledger judges (``max_gpus``, a budget, a per-pool limit) is set
        on any of ``names``."""
        for n in names:
            q = self.quotas.get(n)
            if n in self.pool_limited or (q is not None and (q.max_gpus is not None
                                                             or q.budget_gpu_seconds is not None)):
                return True
        return False


def committed_for(gpus: int, time_limit_s: int, weight: float) -> int:
    """GPU-seconds a gang commits: its GPUs x its time limit x the billing weight, rounded up."""
    return math.ceil(gpus * time_limit_s * weight - 1e-9)


def period_start(period: str, window_days: int, now: datetime) -> date:
    today = now.date()
    if period == "month":
        return today.replace(day=1)
    return today - timedelta(days=window_days - 1)


def period_label(period: str, window_days: int) -> str:
    return "this month" if period == "month" else f"in the last {window_days} days"


def hours(gpu_seconds: float) -> str:
    return f"{gpu_seconds / 3600:.1f}"


def refusal(view: ChainView, names: Sequence[str], *, gpus: int, pools: Sequence[str],
            committed: int) -> str | None:
    """Why a gang of ``gpus`` committing ``committed`` GPU-seconds does not fit the chain
    ``names`` (root first), the first failing limit leaf first; None when it fits.

    ``pools``: the pool it would run in, or every routable pool for "any": a per-pool limit
    refuses only when it blocks every one of them.
    """
    for name in reversed(names):
        q = view.quotas.get(name)
        h = view.held.get(name) or _NONE
        if q is not None and q.max_gpus is not None and h.reserved_gpus + gpus > q.max_gpus:
            return f"{name}: {h.reserved_gpus} of {q.max_gpus} concurrent GPUs in use, job needs {gpus}"
        blocked = []
        for p in pools:
            limit = view.pool_limits.get((name, p))
            used = view.pool_held.get((name, p), 0)
            if limit is not None and used + gpus > limit:
                blocked.append(f"{name}: {used} of {limit} concurrent GPUs in use in pool {p}, job needs {gpus}")
        if blocked and len(blocked) == len(pools):
            return "; ".join(blocked)
        # max_queued_jobs and max_queued_jobs_per_user are not the ledger's: they count the
        # jobs that wait to start, judged once, at submit (gateway/jobs/caps.py; docs/ledger.md).
        if q is not None and q.budget_gpu_seconds is not None:
            charged = view.charged.get(name, 0)
            if charged + h.committed_gpu_seconds + committed > q.budget_gpu_seconds:
                return (f"{name}: GPU-hour budget {period_label(q.budget_period, q.budget_window_days)}: "
                        f"{hours(charged)} used + {hours(h.committed_gpu_seconds)} committed of "
                        f"{hours(q.budget_gpu_seconds)} GPU-hours, job needs {hours(committed)}")
    return None


_NONE = Held()


def budget_verdict(view: ChainView, names: Sequence[str], *, total_gpus: int, time_limit_s: int,
                   gpu_type: str | None) -> tuple[str, str] | None:
    """Whether a job can ever run within the GPU-hour budgets of its chain (root first).

    None when it can (now or once other jobs end); ``("never", why)`` when it needs more
    than a whole budget period holds; ``("later", why)`` when this period's budget has too
    little left even with nothing else running (it runs once the period renews, or after an
    admin credit). Its need is its time limit at the cheapest routable pool's weight.
    """
    budgets = [(n, q) for n in reversed(names) if (q := view.quotas.get(n)) is not None
               and q.budget_gpu_seconds is not None]
    if not budgets:
        return None
    needs = committed_for(total_gpus, time_limit_s, view.pools.cheapest(gpu_type))
    for name, q in budgets:
        label = "monthly" if q.budget_period == "month" else f"{q.budget_window_days}-day"
        if needs > q.budget_gpu_seconds:
            return ("never", (f"{name}'s {label} GPU-hour budget is {hours(q.budget_gpu_seconds)} GPU-hours and "
                             f"this job needs {hours(needs)} ({total_gpus} GPUs x {time_limit_s / 3600:.2f} h "
                             f"time limit); ask for fewer GPUs or a shorter time limit"))
        left = q.budget_gpu_seconds - view.charged.get(name, 0)
        if needs > left:
            when = "the budget renews next month" if q.budget_period == "month" else "older usage leaves the window"
            return ("later", (f"{name}'s GPU-hour budget {period_label(q.budget_period, q.budget_window_days)} has "
                             f"{hours(max(left, 0))} of {hours(q.budget_gpu_seconds)} GPU-hours left and this job "
                             f"needs {hours(needs)}: it is held until {when} or an admin credits the account"))
    return None


def never_admissible(view: ChainView, names: Sequence[str], *, account: str, total_gpus: int,
                     pools: Sequence[str]) -> str | None:
    """Why no concurrent-GPU limit of the chain would ever admit a gang of ``total_gpus`` on
    any of ``pools`` (the one it names, else every routable one of its kind), or None.

    The limit on a pool is the smallest ``max_gpus`` or per-pool limit set on the account or
    an ancestor: each level caps its subtree. The GPUs asked are a lower bound of what the
    gang holds, so nothing admissible is refused.
    """
    overall = sorted((q.max_gpus, "max_gpus", n) for n in names
                     if (q := view.quotas.get(n)) is not None and q.max_gpus is not None)
    if overall and total_gpus > overall[0][0]:  # max_gpus counts every pool together
        value, field, where = overall[0]
        return (f"this job can never run: it asks {total_gpus} GPUs at once, more than the concurrent-GPU limit "
                f"of account {account} on every pool ({field} = {value}, set on account {where})")
    if not pools or not (overall or any((n, p) in view.pool_limits for n in names for p in pools)):
        return None  # no pool to judge against (the job waits with the dispatcher's reason), or no limit
    limits: list[str] = []
    for pool in pools:
        candidates = overall + [(view.pool_limits[(n, pool)], f"max_gpus_per_pool[{pool}]", n)
                                for n in names if (n, pool) in view.pool_limits]
        tightest = min(candidates, default=None)
        if tightest is None or total_gpus <= tightest[0]:
            return None
        limits.append(f"{pool}: {tightest[1]} = {tightest[0]} (set on account {tightest[2]})")
    return (f"this job can never run: it asks {total_gpus} GPUs at once, more than the concurrent-GPU limit of "
            f"account {account} on every pool it may use ({'; '.join(limits)})")


def requeue_refusal(view: ChainView, names: Sequence[str], *, held: int, charge: int, charged_on: date,
                    now: datetime, committed: int) -> str | None:
    """Why a requeued gang's next run (``committed`` GPU-seconds) no longer fits a GPU-hour
    budget of its chain, or None (docs/ledger.md, "Requeue re-admission").

    ``held`` is what the job holds of each chain account's commitment now; ``charge`` is about
    to be charged on ``charged_on``. Only budgets are judged again: the gang's GPUs never left
    the ledger (the backend kept it queued), a new run's committed time did.
    """
    for name in reversed(names):
        q = view.quotas.get(name)
        if q is None or q.budget_gpu_seconds is None:
            continue
        since = period_start(q.budget_period, q.budget_window_days, now)
        used = view.charged.get(name, 0) + (charge if charged_on >= since else 0)
        others = (view.held.get(name) or _NONE).committed_gpu_seconds - held
        if used + others + committed > q.budget_gpu_seconds:
            return (f"{name}: GPU-hour budget {period_label(q.budget_period, q.budget_window_days)}: "
                    f"{hours(used)} used + {hours(others)} committed of {hours(q.budget_gpu_seconds)} "
                    f"GPU-hours, another run needs {hours(committed)}")
    return None


@dataclasses.dataclass(frozen=True)
class Reservation:
    """A gang the round reserves: its pool, the GPUs it holds there, the weight and the
    GPU-seconds it commits, its chain (root first) and whether a limit is set on it."""

    job: Any
    pool: str
    gpus: int
    gpu_type: str | None
    weight: float
    committed: int
    names: tuple[str, ...]
    limited: bool


class Tally:
    """The ledger as one round's decision sees it: the rules over the round's view, with
    what the round reserved before each job added (pure: the apply step writes
    :attr:`reservations` and judges the limited chains again under their locks).

    A chain that cannot be walked in the view (an account removed or a cycle since the
    pick) is refused, naming it, rather than guessed.
    """

    def __init__(self, view: ChainView) -> None:
        self.view = view.counting()
        self.reservations: list[Reservation] = []
        self._chains: dict[str, tuple[str, ...] | None] = {}
        self._limited: dict[str, bool] = {}

    def chain(self, account: str) -> tuple[str, ...] | None:
        if account not in self._chains:
            self._chains[account] = self.view.chain(account)
        return self._chains[account]

    def limited(self, account: str) -> bool:
        """Whether the per-job rules apply to the account's chain (True when it cannot be walked)."""
        if account not in self._limited:
            names = self.chain(account)
            self._limited[account] = names is None or self.view.limited(names)
        return self._limited[account]

    def known_pools(self) -> frozenset[str]:
        return self.view.pools.known()

    def budget_verdict(self, job: Any, gpu_type: str | None) -> tuple[str, str] | None:
        names = self.chain(job.account_name)
        if names is None:
            return None  # reserve() names the broken chain
        return budget_verdict(self.view, names, total_gpus=job.total_gpus, time_limit_s=job.time_limit_s,
                              gpu_type=gpu_type)

    def _terms(self, job: Any, pool: str, gpus: int, gpu_type: str | None) -> tuple[int, float, int]:
        held = max(int(gpus), job.total_gpus)  # never less than asked
        weight = self.view.pools.weight(pool, gpu_type)
        return held, weight, committed_for(held, job.time_limit_s, weight)

    def admission_check(self, job: Any, pool: str, gpus: int, gpu_type: str | None) -> tuple[bool, str]:
        """(fits, why not) of the gang in ``pool`` now, the round's earlier reservations counted."""
        names = self.chain(job.account_name)
        if names is None:
            return False, f"the account chain of {job.account_name!r} cannot be read (removed, or a cycle)"
        held, _, committed = self._terms(job, pool, gpus, gpu_type)
        why = refusal(self.view, names, gpus=held, pools=[pool], committed=committed)
        return why is None, why or f"fits the quotas of {' > '.join(names)}"

    def reserve(self, job: Any, pool: str, gpus: int, gpu_type: str | None) -> str | None:
        """Reserve the gang in ``pool`` for the round: the refusal's words, or None (recorded
        in :attr:`reservations` and counted against the chain for the jobs after it)."""
        names = self.chain(job.account_name)
        if names is None:
            return f"the account chain of {job.account_name!r} cannot be read (removed, or a cycle)"
        held, weight, committed = self._terms(job, pool, gpus, gpu_type)
        limited = self.limited(job.account_name)
        if limited:
            why = refusal(self.view, names, gpus=held, pools=[pool], committed=committed)
            if why is not None:
                return why
        self.reservations.append(Reservation(job, pool, held, normalise_gpu_type(gpu_type), weight, committed,
                                             names, limited))
        add(self.view, names, pool, held, committed)
        return None


def add(view: ChainView, names: Iterable[str], pool: str, gpus: int, committed: int) -> None:
    """Count a reservation against every account of its chain (what the ledger's write adds)."""
    for n in names:
        h = view.held.setdefault(n, Held())
        h.reserved_gpus += gpus
        h.committed_gpu_seconds += committed
        view.pool_held[(n, pool)] = view.pool_held.get((n, pool), 0) + gpus


def recheck(view: ChainView, reservations: Sequence[Reservation]) -> str | None:
    """The apply step's judgement: the limited chains' reservations, in the round's order,
    judged again over ``view`` read under the chains' locks. Why the first one no longer
    fits, or None. (A chain without limits cannot refuse; its check is that none was set.)"""
    view = view.counting()
    for r in reservations:
        if r.limited:
            why = refusal(view, r.names, gpus=r.gpus, pools=[r.pool], committed=r.committed)
            if why is not None:
                return f"job {r.job.id}: {why}"
        add(view, r.names, r.pool, r.gpus, r.committed)
    return None


# ----------------------------------------------------------------- the caps on waiting jobs


@dataclasses.dataclass
class CapRead:
    """One read of an account chain's caps and the counts they limit (gateway/jobs/caps.py).

    ``counts`` maps a counter (``("user", name)``, ``("account", name)``, ``("tree", name)``,
    ``("tree_user", name, user)``, ``("keys", subject)``) to what the database held;
    ``checks`` are the limits on them in the order they are judged; ``touches`` the counters
    one more job of this account and user adds to.
    """

    chain: list[Any]
    counts: dict[tuple, int]
    checks: list[tuple[tuple, int, str, bool]]  # counter, limit, message with {n}, hinted
    touches: tuple[tuple, ...]
    key_counter: tuple | None


class CapTally(collections.Counter):
    """What a transaction admitted since it read the counts: a batch's earlier members."""


_HINT = "wait for jobs to start or cancel some"


def cap_refusal(read: CapRead, tally: CapTally, *, adding: int = 1) -> str | None:
    """Why ``adding`` more jobs (and, read with a key, one new key) would pass a cap, counting
    what was read plus what ``tally`` admitted since; None when they fit. ``max_queued_jobs``
    means jobs that wait to start (pending, blocked, dispatching, queued, requeued), judged
    here, at submit, only (docs/ledger.md)."""
    hint = _HINT if adding == 1 else f"this request adds {adding}; {_HINT}"
    for counter, limit, message, hinted in read.checks:
        n = read.counts[counter] + tally[counter]
        if n + (1 if counter == read.key_counter else adding) > limit:
            return message.format(n=n) + (f"; {hint}" if hinted else "")
    return None


def count(read: CapRead, tally: CapTally, *, adding: int = 1) -> None:
    """Add ``adding`` admitted jobs (and a new key) to ``tally``."""
    for counter in read.touches:
        tally[counter] += adding
    if read.key_counter is not None:
        tally[read.key_counter] += 1
