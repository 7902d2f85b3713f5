"""A statement on the wire: JSON (pydantic models, money as decimal strings) and CSV
(RFC 4180, for a spreadsheet as it is). One rendering for the API, the dashboard and,
through the API, the CLI (docs/ledger.md, "Statements")."""

from __future__ import annotations

import csv
import io
from decimal import Decimal

from pydantic import BaseModel, Field

from gateway.domain.prices import gpu_hours
from gateway.ledger.statements import Statement

CSV_COLUMNS = ["period_start", "period_end", "account", "kind", "pool", "gpu_type", "job_id", "attempt", "jobs",
               "gpu_seconds", "gpu_hours", "price_per_gpu_hour", "cost", "currency"]
# A spreadsheet runs a cell that starts with one of these as a formula (CSV injection, OWASP).
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def money(d: Decimal | None) -> str | None:
    """A decimal as plain digits with '.', never an exponent (``1E+2`` -> ``100``)."""
    return None if d is None else format(d, "f")


class StatementAttemptOut(BaseModel):
    job_id: str
    attempt: int | None = Field(description="The job's attempt number (docs/recovery.md); null if the job is gone.")
    gpu_seconds: int
    gpu_hours: float


class LineOut(BaseModel):
    account: str
    kind: str = Field(description="usage, or a ledger adjustment: refund, credit, debit.")
    pool: str | None
    gpu_type: str | None
    jobs: int
    entries: int = Field(description="Ledger entries summed into this line.")
    gpu_seconds: int = Field(description="Billing-weighted GPU-seconds charged, signed as in the ledger "
                                         "(credits and refunds are negative).")
    gpu_hours: float
    price_per_gpu_hour: str | None = Field(description="From the pools file; null: no price for this pool and GPU type.")
    cost: str | None = Field(description="gpu_seconds x price / 3600, rounded half up to the cent (a decimal string).")
    attempts: list[StatementAttemptOut] | None = Field(None, description="With detail=attempts: the jobs' attempts behind the line.")


class SubtotalOut(BaseModel):
    account: str
    gpu_seconds: int
    gpu_hours: float
    cost: str


class BudgetOut(BaseModel):
    gpu_hours: float | None = Field(description="The account's effective GPU-hour budget (null: none).")
    source: str | None = Field(description="The account that sets it (itself or an ancestor).")
    period: str
    used_gpu_seconds: int = Field(description="Charged to the account's whole subtree in the statement's period.")
    used_gpu_hours: float


class StatementOut(BaseModel):
    account: str
    children: bool
    since: str = Field(description="First day (UTC), ISO 8601.")
    until: str = Field(description="Day after the last (UTC), ISO 8601.")
    currency: str
    lines: list[LineOut]
    subtotals: list[SubtotalOut]
    gpu_seconds: int = Field(description="Sum of the lines: what the ledger charged these accounts in the period.")
    gpu_hours: float
    usage_gpu_seconds: int
    adjustment_gpu_seconds: int
    cost: str = Field(description="Sum of the lines' rounded costs.")
    unpriced_gpu_seconds: int
    budget: BudgetOut


def _h(seconds: int) -> float:
    return float(gpu_hours(seconds))


def to_out(s: Statement) -> StatementOut:
    lines = [LineOut(account=x.account, kind=x.kind, pool=x.pool, gpu_type=x.gpu_type, jobs=x.jobs, entries=x.entries,
                     gpu_seconds=x.gpu_seconds, gpu_hours=_h(x.gpu_seconds), price_per_gpu_hour=money(x.price),
                     cost=money(x.cost),
                     attempts=None if x.attempts is None else [
                         StatementAttemptOut(job_id=a.job_id, attempt=a.attempt, gpu_seconds=a.gpu_seconds,
                                    gpu_hours=_h(a.gpu_seconds)) for a in x.attempts])
             for x in s.lines]
    b = s.budget
    return StatementOut(
        account=s.account, children=s.children, since=s.since.isoformat(), until=s.until.isoformat(),
        currency=s.currency, lines=lines,
        subtotals=[SubtotalOut(account=a, gpu_seconds=g, gpu_hours=_h(g), cost=money(c) or "0.00")
                   for a, g, c in s.subtotals()],
        gpu_seconds=s.gpu_seconds, gpu_hours=_h(s.gpu_seconds), usage_gpu_seconds=s.usage_gpu_seconds,
        adjustment_gpu_seconds=s.adjustment_gpu_seconds, cost=money(s.cost) or "0.00",
        unpriced_gpu_seconds=s.unpriced_gpu_seconds,
        budget=BudgetOut(gpu_hours=None if b.gpu_seconds is None else b.gpu_seconds / 3600, source=b.source,
                         period=b.period, used_gpu_seconds=b.used_gpu_seconds, used_gpu_hours=_h(b.used_gpu_seconds)))


def _cell(value: object) -> str:
    """A CSV cell: numbers as plain decimals; text that a spreadsheet would run as a formula
    gets a leading single quote."""
    if value is None:
        return ""
    if isinstance(value, Decimal):
        return format(value, "f")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    text = str(value)
    return "'" + text if text.startswith(_FORMULA_START) else text


def to_csv(s: Statement) -> str:
    """The statement as CSV: a header row, one row per line (with ``detail``, each usage
    line followed by rows of kind ``attempt``, which carry no cost), and a last row of kind
    ``total``. UTF-8, ``\\r\\n`` line ends, ISO dates, numbers with '.'."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\r\n")
    w.writerow(CSV_COLUMNS)
    period = [s.since.isoformat(), s.until.isoformat()]
    for x in s.lines:
        w.writerow([_cell(v) for v in (*period, x.account, x.kind, x.pool, x.gpu_type, None, None, x.jobs,
                                       x.gpu_seconds, gpu_hours(x.gpu_seconds), x.price, x.cost, s.currency)])
        for a in x.attempts or ():
            w.writerow([_cell(v) for v in (*period, x.account, "attempt", x.pool, x.gpu_type, a.job_id, a.attempt,
                                           1, a.gpu_seconds, gpu_hours(a.gpu_seconds), x.price, None, s.currency)])
    w.writerow([_cell(v) for v in (*period, s.account, "total", None, None, None, None,
                                   sum(x.jobs for x in s.lines if x.kind == "usage"), s.gpu_seconds,
                                   gpu_hours(s.gpu_seconds), None, s.cost, s.currency)])
    return buf.getvalue()


def csv_filename(s: Statement) -> str:
    return f"isthmus-statement-{s.account}-{s.since.isoformat()}-{s.until.isoformat()}.csv"
