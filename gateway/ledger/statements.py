"""Statements (issue #49, item 3): per account (and sub-account), per period, per pool and
GPU type: GPU-hours charged, their cost at the pools file's prices, the ledger's credits,
debits and refunds as lines of their own, the budget used, and each usage line traceable to
the jobs' attempts.

Read only from ``ledger_entry``, the ledger's record of truth (docs/ledger.md, "Statements"):
a statement's lines are the entries of its accounts with ``at`` in ``[since, until)``, summed
per (account, kind, pool, GPU type), so the GPU-seconds of its lines add up EXACTLY to what
the ledger charged them in that period (the usage buckets, the balances and the budgets are
materialisations of the same entries). Who may read which statement: :func:`readable`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

from sqlalchemy import and_, case, func, select
from sqlalchemy.orm import Session

from gateway.accounts import service as accounts
from gateway.domain.prices import PriceList, cost
from gateway.kit.errors import Forbidden, Invalid, NotFound
from gateway.models.jobs import Job, JobAttempt
from gateway.models.ledger import LedgerEntry, Reservation

CHARGES = ("usage", "refund", "credit", "debit")  # the kinds that move GPU-seconds charged
MAX_DAYS = 3660


@dataclasses.dataclass(frozen=True)
class AttemptPart:
    """What one attempt of one job was charged on a line, in the period."""

    job_id: str
    attempt: int | None  # None: the job row is gone (its account was deleted)
    gpu_seconds: int


@dataclasses.dataclass(frozen=True)
class Line:
    account: str
    kind: str  # usage | refund | credit | debit
    pool: str | None
    gpu_type: str | None
    jobs: int  # distinct jobs behind the line
    entries: int  # ledger entries behind the line
    gpu_seconds: int  # billing-weighted, signed as in the ledger (credits and refunds < 0)
    price: Decimal | None  # per GPU-hour; None: unpriced
    cost: Decimal | None  # rounded half up to the cent, once
    attempts: tuple[AttemptPart, ...] | None = None  # with detail="attempts" only


@dataclasses.dataclass(frozen=True)
class Budget:
    gpu_seconds: int | None  # the account's effective budget (None: none set)
    source: str | None  # the account that sets it (its own name, or the ancestor it inherits from)
    period: str  # month | rolling
    used_gpu_seconds: int  # the account's subtree, charged in the statement's period


@dataclasses.dataclass(frozen=True)
class Statement:
    account: str
    children: bool
    since: date
    until: date
    currency: str
    accounts: tuple[str, ...]  # the accounts whose lines are shown
    lines: tuple[Line, ...]
    budget: Budget

    @property
    def gpu_seconds(self) -> int:
        return sum(line.gpu_seconds for line in self.lines)

    @property
    def usage_gpu_seconds(self) -> int:
        return sum(line.gpu_seconds for line in self.lines if line.kind == "usage")

    @property
    def adjustment_gpu_seconds(self) -> int:
        return sum(line.gpu_seconds for line in self.lines if line.kind != "usage")

    @property
    def cost(self) -> Decimal:
        """The sum of the lines' rounded costs (unpriced lines count nothing)."""
        return sum((line.cost for line in self.lines if line.cost is not None), Decimal("0.00"))

    @property
    def unpriced_gpu_seconds(self) -> int:
        return sum(line.gpu_seconds for line in self.lines if line.cost is None)

    def subtotals(self) -> list[tuple[str, int, Decimal]]:
        """(account, GPU-seconds, cost) of each account shown, in order."""
        out = {name: [0, Decimal("0.00")] for name in self.accounts}
        for line in self.lines:
            row = out[line.account]
            row[0] += line.gpu_seconds
            row[1] += line.cost or 0
        return [(name, v[0], v[1]) for name, v in out.items()]


def period(*, since: date | None, until: date | None, now: datetime) -> tuple[date, date]:
    """``[since, until)`` in UTC days; by default the calendar month of ``now`` (UTC).

    Raises:
        Invalid: ``until`` not after ``since``, or a span over 10 years (naming the field).
    """
    today = now.astimezone(UTC).date()
    if since is None:
        since = (until - timedelta(days=1)).replace(day=1) if until is not None else today.replace(day=1)
    if until is None:
        until = (since.replace(day=28) + timedelta(days=4)).replace(day=1)  # the first of the next month
    if until <= since:
        raise Invalid("query.until", "must be after `since`")
    if (until - since).days > MAX_DAYS:
        raise Invalid("query.since", "a statement spans at most 10 years")
    return since, until


def readable(session: Session, *, account: str, children: bool, accounts_in_token: Iterable[str],
             username: str, is_admin: bool) -> None:
    """Whether the caller may read ``account``'s statement (with its sub-accounts' lines when
    ``children``). The one check, for the API, the dashboard and the CLI (through the API):
    an account the caller may see (the token's accounts, the subtrees of accounts the caller
    coordinates, every account for admins: the rule of ``/v1/accounts/{name}/usage``), and,
    for sub-accounts' lines, every account of the subtree.

    Raises:
        NotFound: an account the caller may not see (as for usage: its existence is not told).
        Forbidden: sub-accounts' lines the caller may not see (a member of the account who
            coordinates none of its sub-accounts).
    """
    visible = set(accounts.visible_accounts(session, accounts=frozenset(accounts_in_token), username=username,
                                            is_admin=is_admin))
    if account not in visible:
        raise NotFound(f"no account {account!r} visible to you")
    if children and not set(accounts.descendants(accounts.load_tree(session), account)) <= visible:
        raise Forbidden(f"the lines of {account!r}'s sub-accounts are for its coordinators and admins; "
                        "ask without children=true for the account's own statement")


def statement(session: Session, *, account: str, since: date, until: date, prices: PriceList,
              children: bool = False, detail: bool = False) -> Statement:
    """``account``'s statement for ``[since, until)`` (UTC days); with ``children``, its
    sub-accounts' lines too; with ``detail``, each usage line split into jobs and attempts.

    Raises:
        NotFound: no such account.
    """
    tree = accounts.load_tree(session)
    if account not in tree:
        raise NotFound(f"no account {account!r}")
    subtree = _preorder(accounts.children_map(tree), account)
    names = tuple(subtree if children else [account])
    start, end = _utc(since), _utc(until)
    lines = []
    parts = _attempt_parts(session, names, start, end) if detail else {}
    for acc, kind, pool, gpu_type, jobs, n, gpu_seconds in session.execute(_lines(names, start, end)):
        price = prices.price(pool, gpu_type)
        key = (acc, kind, pool, gpu_type)
        lines.append(Line(account=acc, kind=kind, pool=pool, gpu_type=gpu_type, jobs=int(jobs), entries=int(n),
                          gpu_seconds=int(gpu_seconds), price=price, cost=cost(int(gpu_seconds), price),
                          attempts=tuple(parts.get(key, ())) if detail else None))
    order = {k: i for i, k in enumerate(CHARGES)}
    rank = {n: i for i, n in enumerate(names)}
    lines.sort(key=lambda x: (rank[x.account], order[x.kind], x.pool or "", x.gpu_type or ""))
    eff = accounts.effective_quota(session, account)
    b = eff["budget_gpu_seconds"]
    used = _charged(session, subtree, start, end)
    return Statement(account=account, children=children, since=since, until=until, currency=prices.currency,
                     accounts=names, lines=tuple(lines),
                     budget=Budget(gpu_seconds=b.value, source=b.source, period=eff["budget_period"] or "month",
                                   used_gpu_seconds=used))


def _preorder(kids: dict[str | None, list[str]], root: str) -> list[str]:
    """``root``, then each child's subtree in name order (how a statement lists its accounts)."""
    out, stack = [], [root]
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(sorted(kids.get(node, ()), reverse=True))
    return out


def _utc(day: date) -> datetime:
    return datetime(day.year, day.month, day.day, tzinfo=UTC)


E = LedgerEntry
# A refund entry names its job, not the GPU type: the job's reservation does (so a refund is
# priced like the usage it gives back).
_GPU_TYPE = func.coalesce(E.gpu_type, select(Reservation.gpu_type).where(Reservation.job_id == E.job_id)
                          .scalar_subquery())


def _in_period(names: tuple[str, ...], start: datetime, end: datetime):
    return and_(E.account_name.in_(names), E.at >= start, E.at < end, E.kind.in_(CHARGES), E.gpu_seconds != 0)


def _entries(names: tuple[str, ...], start: datetime, end: datetime, *, attempts: bool):
    """The period's charging entries, one row each, with the GPU type they are priced by
    (and their attempt): grouped by the caller over plain columns, which both databases group alike."""
    cols = [E.account_name.label("account"), E.kind.label("kind"), E.pool.label("pool"),
            _GPU_TYPE.label("gpu_type"), E.job_id.label("job_id"), E.gpu_seconds.label("gpu_seconds")]
    if attempts:
        # An entry belongs to the first ended attempt of its job that ended at or after it
        # (an attempt's last charge is booked at its end), else to the job's current attempt.
        ended = (select(func.min(JobAttempt.number))
                 .where(JobAttempt.job_id == E.job_id, JobAttempt.ended_at >= E.at).scalar_subquery())
        current = select(Job.attempt).where(Job.id == E.job_id).scalar_subquery()
        cols.append(case((E.job_id.is_(None), None), else_=func.coalesce(ended, current)).label("attempt"))
    return select(*cols).where(_in_period(names, start, end)).subquery("charges")


def _lines(names: tuple[str, ...], start: datetime, end: datetime):
    c = _entries(names, start, end, attempts=False).c
    return (select(c.account, c.kind, c.pool, c.gpu_type, func.count(func.distinct(c.job_id)), func.count(),
                   func.sum(c.gpu_seconds))
            .group_by(c.account, c.kind, c.pool, c.gpu_type))


def _attempt_parts(session: Session, names: tuple[str, ...], start: datetime,
                   end: datetime) -> dict[tuple, list[AttemptPart]]:
    """Per line, what each job's attempts were charged in the period."""
    c = _entries(names, start, end, attempts=True).c
    out: dict[tuple, list[AttemptPart]] = {}
    rows = session.execute(
        select(c.account, c.kind, c.pool, c.gpu_type, c.job_id, c.attempt, func.sum(c.gpu_seconds))
        .where(c.job_id.is_not(None))
        .group_by(c.account, c.kind, c.pool, c.gpu_type, c.job_id, c.attempt)
        .order_by(c.job_id, c.attempt))
    for acc, kind, pool, gt, job_id, number, gpu_seconds in rows:
        if gpu_seconds:
            out.setdefault((acc, kind, pool, gt), []).append(AttemptPart(
                job_id=job_id, attempt=None if number is None else int(number), gpu_seconds=int(gpu_seconds)))
    return out


def _charged(session: Session, names: list[str], start: datetime, end: datetime) -> int:
    return int(session.scalar(select(func.coalesce(func.sum(E.gpu_seconds), 0))
                              .where(_in_period(tuple(names), start, end))) or 0)
