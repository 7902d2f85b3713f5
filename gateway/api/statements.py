"""HTTP only: /v1/accounts/{name}/statement — an account's statement as JSON or CSV
(docs/ledger.md, "Statements"). Who may read it: ``ledger.statements.readable``."""

from __future__ import annotations

from datetime import date
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query, Request, Response
from sqlalchemy.orm import Session

from gateway.domain.prices import PriceList
from gateway.identity.dependency import get_principal
from gateway.identity.principal import Principal
from gateway.kit.db import get_session
from gateway.kit.errors import problem_responses
from gateway.kit.params import AccountName
from gateway.kit.timeutil import utcnow
from gateway.ledger import statements
from gateway.ledger.statement_views import (
    CSV_COLUMNS,
    StatementOut,
    csv_filename,
    to_csv,
    to_out,
)

router = APIRouter(prefix="/v1/accounts", tags=["accounts"])
CSV = "text/csv"

Since = Annotated[date | None, Query(description="First day (UTC, ISO 8601); default: the first of this month "
                                                 "(or of the month before `until`).")]
Until = Annotated[date | None, Query(description="Day after the last (UTC, ISO 8601); default: the first of the "
                                                 "month after `since`.")]
Children = Annotated[bool, Query(description="Also the lines of every sub-account (coordinators and admins).")]
Detail = Annotated[str | None, Query(pattern="^attempts$", description="`attempts`: each line with the jobs' "
                                                                       "attempts behind it.")]


def _statement(request: Request, session: Session, principal: Principal, name: str, since: date | None,
               until: date | None, children: bool, detail: str | None) -> statements.Statement:
    since, until = statements.period(since=since, until=until, now=utcnow())
    statements.readable(session, account=name, children=children, accounts_in_token=principal.accounts,
                        username=principal.username, is_admin=principal.is_admin)
    prices = getattr(request.app.state, "prices", None) or PriceList()
    return statements.statement(session, account=name, since=since, until=until, prices=prices,
                                children=children, detail=detail == "attempts")


def _csv(s: statements.Statement) -> Response:
    return Response(to_csv(s), media_type="text/csv; charset=utf-8",
                    headers={"Content-Disposition": f'attachment; filename="{csv_filename(s)}"'})


@router.get("/{name}/statement", response_model=StatementOut, operation_id="getAccountStatement",
            summary="An account's statement: GPU-hours, cost, adjustments and budget for a period",
            description="Lines per (account, kind, pool, GPU type) of what the ledger charged in `[since, until)` "
                        "(UTC days; default the current calendar month): usage at the pools file's prices, and "
                        "refunds, credits and debits as lines of their own. The lines' GPU-seconds add up to the "
                        "ledger's charges to the cent; the cost total is the sum of the lines, each rounded half up "
                        "to the cent. For the account's members, its coordinators (and those of an ancestor) and "
                        "admins; `children=true` (sub-accounts' lines) needs every sub-account visible. The same as "
                        "CSV: getAccountStatementCsv, or `Accept: text/csv`.",
            responses=problem_responses(401, 403, 404, 422))
def get_statement(
    name: AccountName,
    request: Request,
    since: Since = None,
    until: Until = None,
    children: Children = False,
    detail: Detail = None,
    # For curl users: not in the spec, where one operation has one response type (CSV is its own).
    format: Annotated[Literal["json", "csv"] | None, Query(include_in_schema=False)] = None,
    principal: Principal = Depends(get_principal),
    session: Session = Depends(get_session, scope="function"),
):
    s = _statement(request, session, principal, name, since, until, children, detail)
    if format == "csv" or (format is None and CSV in request.headers.get("accept", "")):
        return _csv(s)
    return to_out(s)


@router.get("/{name}/statement.csv", response_class=Response, operation_id="getAccountStatementCsv",
            summary="An account's statement, as CSV",
            description="getAccountStatement as `text/csv` (RFC 4180, UTF-8, a header row, CRLF line ends, ISO "
                        "dates, plain decimal numbers); columns: " + ", ".join(CSV_COLUMNS) + ". One row per line, "
                        "rows of kind `attempt` after their line with detail=attempts (no cost of their own), and a "
                        "last row of kind `total`.",
            responses={200: {"description": "The statement as CSV", "content": {CSV: {
                "schema": {"type": "string"},
                "example": ",".join(CSV_COLUMNS) + "\r\n2026-11-01,2026-12-01,team-a,usage,slurm,h100,,,12,172800,"
                           "48.0000,2.50,120.00,EUR\r\n2026-11-01,2026-12-01,team-a,total,,,,,12,172800,48.0000,,"
                           "120.00,EUR\r\n"}}},
                       **problem_responses(401, 403, 404, 422)})
def get_statement_csv(
    name: AccountName,
    request: Request,
    since: Since = None,
    until: Until = None,
    children: Children = False,
    detail: Detail = None,
    principal: Principal = Depends(get_principal),
    session: Session = Depends(get_session, scope="function"),
) -> Response:
    return _csv(_statement(request, session, principal, name, since, until, children, detail))
