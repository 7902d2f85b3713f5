"""/ui/accounts/{name}/statement: an account's statement in the dashboard, and its CSV
(docs/ledger.md, "Statements"). The same service, the same reader check and the same CSV
as GET /v1/accounts/{name}/statement; the browser's session instead of a bearer token."""

from __future__ import annotations

from datetime import date

from fastapi import APIRouter, Request
from fastapi.responses import Response

from gateway.domain.prices import PriceList
from gateway.kit.db import in_read_thread, reading
from gateway.kit.errors import Invalid
from gateway.kit.names import ACCOUNT_NAME
from gateway.kit.timeutil import utcnow
from gateway.ledger import statements
from gateway.ledger.statement_views import csv_filename, to_csv, to_out
from gateway.ui.auth import principal_of
from gateway.ui.rendering import render

router = APIRouter(prefix="/ui", include_in_schema=False)


def _day(value: str, field: str) -> date | None:
    if not value:
        return None
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise Invalid(field, "a day as YYYY-MM-DD") from None


def _read(request: Request, name: str, since: str, until: str, children: str, detail: str):
    principal = principal_of(request)
    if not ACCOUNT_NAME.fullmatch(name):
        raise Invalid("path.name", "not an account name")
    first, end = statements.period(since=_day(since, "query.since"), until=_day(until, "query.until"), now=utcnow())
    with reading(request.app.state.db) as session:
        statements.readable(session, account=name, children=children == "true", accounts_in_token=principal.accounts,
                            username=principal.username, is_admin=principal.is_admin)
        st = statements.statement(session, account=name, since=first, until=end,
                                  prices=getattr(request.app.state, "prices", None) or PriceList(),
                                  children=children == "true", detail=detail == "attempts")
    return principal, st


@router.get("/accounts/{name}/statement", name="ui_statement")
async def statement_page(request: Request, name: str, since: str = "", until: str = "", children: str = "",
                         detail: str = ""):
    return await in_read_thread(_page, request, name, since, until, children, detail)


def _page(request: Request, name: str, since: str, until: str, children: str, detail: str):
    principal, st = _read(request, name, since, until, children, detail)
    query = f"since={st.since.isoformat()}&until={st.until.isoformat()}" + ("&children=true" if st.children else "") \
        + ("&detail=attempts" if detail == "attempts" else "")
    return render(request, "statement.html", {"s": to_out(st), "query": query, "detail": detail == "attempts"},
                  principal=principal)


@router.get("/accounts/{name}/statement.csv", name="ui_statement_csv")
async def statement_csv(request: Request, name: str, since: str = "", until: str = "", children: str = "",
                        detail: str = ""):
    return await in_read_thread(_csv, request, name, since, until, children, detail)


def _csv(request: Request, name: str, since: str, until: str, children: str, detail: str):
    _, st = _read(request, name, since, until, children, detail)
    return Response(to_csv(st), media_type="text/csv; charset=utf-8",
                    headers={"Content-Disposition": f'attachment; filename="{csv_filename(st)}"',
                             "Cache-Control": "no-store"})
