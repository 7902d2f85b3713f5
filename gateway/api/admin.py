"""HTTP only: /v1/admin/... — accounts, quotas, members, credits, ledger, usage, fair share.

Every route requires the admin role (``require_admin``) and runs in the request's one
transaction: a refused change leaves nothing behind.
"""

from __future__ import annotations

import base64
import binascii
import csv
import io
from datetime import date, datetime, timedelta
from typing import Annotated, Literal

from fastapi import APIRouter, Body, Depends, Path, Query, Request, Response
from sqlalchemy.orm import Session

from gateway.accounts import service as accounts
from gateway.accounts.schemas import POOL_NAME_PATTERN, Pool, QuotaIn
from gateway.admin import lifecycle
from gateway.admin.schemas import (
    AccountCreate,
    AccountUpdate,
    AdjustmentIn,
    AdminAccountOut,
    BillingWeightIn,
    BillingWeightOut,
    FairShareTable,
    LedgerEntryKind,
    LedgerEntryOut,
    LedgerPage,
    MemberIn,
    MemberOut,
    OrphanOut,
    UsagePeriod,
    UsageReport,
    UsageRow,
)
from gateway.api.accounts import fairshare_out, usage_out
from gateway.domain.shapes import normalise_gpu_type
from gateway.identity.dependency import require_admin
from gateway.identity.principal import Principal
from gateway.kit.db import get_session
from gateway.kit.errors import Invalid, problem_responses
from gateway.kit.names import ACCOUNT_NAME_RE
from gateway.kit.params import AccountName, UserName
from gateway.kit.timeutil import as_utc, utcnow
from gateway.ledger import breakdown, repository
from gateway.ledger import service as ledger
from gateway.ledger.decayed import Ledger
from gateway.models.accounts import AccountMember
from gateway.pools.service import require_known

router = APIRouter(prefix="/v1/admin", tags=["admin"], dependencies=[Depends(require_admin)])

NAME = ACCOUNT_NAME_RE
USER = r"^[a-z_][a-z0-9_-]{0,31}$"
CSV = "text/csv"
USAGE_COLUMNS = ["account", "pool", "period", "jobs", "usage_gpu_seconds", "adjustment_gpu_seconds",
                 "net_gpu_seconds", "net_gpu_hours"]


def _ledger(request: Request) -> Ledger:
    return request.app.state.ledger


def _quota_values(q: QuotaIn) -> dict:
    values = {k: q.__dict__[k] for k in q.model_fields_set}  # no DeprecationWarning for the old aliases
    if "budget_gpu_hours" in values:
        h = values.pop("budget_gpu_hours")
        values["budget_gpu_seconds"] = None if h is None else round(h * 3600)
    # The deprecated per-pool fields are the pools named slurm and kubernetes (the old two).
    per_pool = dict(values.get("max_gpus_per_pool") or {})
    for old in ("slurm", "kubernetes"):
        if f"max_gpus_{old}" in values:
            per_pool.setdefault(old, values.pop(f"max_gpus_{old}"))
    if per_pool:
        values["max_gpus_per_pool"] = per_pool
    else:
        values.pop("max_gpus_per_pool", None)
    return values


def _admin_account(session: Session, name: str, ledger: Ledger) -> AdminAccountOut:
    acc = accounts.get_or_raise(session, name=name)
    base = usage_out(session, name, ledger)
    return AdminAccountOut(**base.model_dump(), parent=acc.parent_name, shares=acc.shares,
                           description=acc.description or "", priority_class=acc.priority_class,
                           members=[_member_out(m) for m in accounts.members(session, name)])


def _member_out(m: AccountMember) -> MemberOut:
    return MemberOut(account=m.account_name, username=m.username, role=m.role, created_at=as_utc(m.created_at))


# ----------------------------------------------------------------- accounts


@router.post("/accounts", status_code=201, response_model=AdminAccountOut, operation_id="createAccount",
             summary="Create an account",
             description="Create an organisation (no parent), team or sub-team, optionally with its quota.",
             responses=problem_responses(401, 403, 409, 422))
def create_account(request: Request, response: Response, body: AccountCreate,
                   principal: Principal = Depends(require_admin),
                   session: Session = Depends(get_session, scope="function")) -> AdminAccountOut:
    lifecycle.create(session, name=body.name, parent_name=body.parent, shares=body.shares, by=principal.who,
                    description=body.description, priority_class=body.priority_class)
    if body.quota is not None:
        accounts.set_quota(session, name=body.name, values=_quota_values(body.quota), by=principal.who)
    response.headers["Location"] = f"/v1/admin/accounts/{body.name}"
    return _admin_account(session, body.name, _ledger(request))


@router.get("/accounts", response_model=list[AdminAccountOut], operation_id="listAllAccounts",
            summary="List all accounts with quotas, usage and fair share", responses=problem_responses(401, 403))
def list_all_accounts(request: Request, session: Session = Depends(get_session, scope="function")) -> list[AdminAccountOut]:
    return [_admin_account(session, n, _ledger(request)) for n in sorted(accounts.load_tree(session))]


@router.get("/accounts/{name}", response_model=AdminAccountOut, operation_id="getAccount", summary="Get an account",
            responses=problem_responses(401, 403, 404, 422))
def get_account(name: AccountName, request: Request, session: Session = Depends(get_session, scope="function")) -> AdminAccountOut:
    return _admin_account(session, name, _ledger(request))


@router.patch("/accounts/{name}", response_model=AdminAccountOut, operation_id="updateAccount",
              summary="Change an account's parent, shares, description or priority class",
              description="Moving an account moves its subtree's running totals to the new ancestors. "
                          "A move below itself (a cycle) is a 422 naming `body.parent`.",
              responses=problem_responses(401, 403, 404, 409, 422))
def update_account(name: AccountName, request: Request, body: AccountUpdate,
                   principal: Principal = Depends(require_admin),
                   session: Session = Depends(get_session, scope="function")) -> AdminAccountOut:
    lifecycle.update(session, name=name, changes=body.model_dump(include=body.model_fields_set),
                    by=principal.who)
    return _admin_account(session, name, _ledger(request))


@router.delete("/accounts/{name}", status_code=204, operation_id="deleteAccount", summary="Delete an account",
               description="Refused (409) while the account has child accounts, active jobs, held reservations "
                           "or any job history. Its ledger entries are kept.",
               responses=problem_responses(401, 403, 404, 409, 422))
def delete_account(name: AccountName, principal: Principal = Depends(require_admin),
                   session: Session = Depends(get_session, scope="function")) -> Response:
    lifecycle.delete(session, name=name, by=principal.who)
    return Response(status_code=204)


@router.put("/accounts/{name}/quota", response_model=AdminAccountOut, operation_id="setAccountQuota",
            summary="Set an account's quotas",
            description="Fields present are set; `null` removes a limit (the nearest ancestor's then applies); "
                        "absent fields are unchanged. Negative or absurd values are a 422 naming the field.",
            responses=problem_responses(401, 403, 404, 422))
def set_quota(name: AccountName, request: Request, body: QuotaIn, principal: Principal = Depends(require_admin),
              session: Session = Depends(get_session, scope="function")) -> AdminAccountOut:
    accounts.set_quota(session, name=name, values=_quota_values(body), by=principal.who)
    return _admin_account(session, name, _ledger(request))


@router.get("/accounts/{name}/members", response_model=list[MemberOut], operation_id="listAccountMembers",
            summary="List recorded members", responses=problem_responses(401, 403, 404, 422))
def list_members(name: AccountName, session: Session = Depends(get_session, scope="function")) -> list[MemberOut]:
    accounts.get_or_raise(session, name=name)
    return [_member_out(m) for m in accounts.members(session, name)]


@router.put("/accounts/{name}/members/{username}", response_model=MemberOut, operation_id="setAccountMember",
            summary="Add a member or change their role",
            description="Records `username` as member or coordinator. Who may submit is decided by the token's "
                        "groups; see docs/ledger.md.",
            responses=problem_responses(401, 403, 404, 422))
def set_member(name: AccountName, username: UserName, body: Annotated[MemberIn, Body()] = MemberIn(),  # noqa: B008 - read, never changed
               principal: Principal = Depends(require_admin),
               session: Session = Depends(get_session, scope="function")) -> MemberOut:
    import re

    if not re.fullmatch(USER, username):
        raise Invalid("path.username", "must be a POSIX user name")
    return _member_out(accounts.set_member(session, name=name, username=username, role=body.role.value,
                                           by=principal.who))


@router.delete("/accounts/{name}/members/{username}", status_code=204, operation_id="removeAccountMember",
               summary="Remove a member", responses=problem_responses(401, 403, 404, 422))
def remove_member(name: AccountName, username: UserName, principal: Principal = Depends(require_admin),
                  session: Session = Depends(get_session, scope="function")) -> Response:
    accounts.remove_member(session, name=name, username=username, by=principal.who)
    return Response(status_code=204)


# ----------------------------------------------------------------- ledger


def _cursor(last_id: int) -> str:
    return base64.urlsafe_b64encode(f"le:{last_id}".encode()).decode().rstrip("=")


def _uncursor(cursor: str) -> int:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode("ascii")
        if not raw.startswith("le:"):
            raise ValueError
        return int(raw[3:])
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise Invalid("query.cursor", "not a cursor returned by this API") from None


def _entry_out(e) -> LedgerEntryOut:
    return LedgerEntryOut(id=e.id, at=as_utc(e.at), account=e.account_name, kind=e.kind, job_id=e.job_id,
                          pool=e.pool, gpu_type=e.gpu_type, username=e.username, gpus=e.gpus,
                          committed_gpu_seconds=e.committed_gpu_seconds, gpu_seconds=e.gpu_seconds,
                          billing_weight=e.billing_weight, actor=e.actor, reason=e.reason or "", data=e.data)


@router.post("/ledger/adjustments", status_code=201, response_model=LedgerEntryOut,
             operation_id="createLedgerAdjustment", summary="Grant or revoke credit",
             description="Append a `credit` (budget back), `debit` (budget taken) or `refund` (part of a finished "
                         "job's usage back) entry with a reason. Entries are never edited; revoke a credit with "
                         "a debit.",
             responses=problem_responses(401, 403, 422))
def create_adjustment(body: AdjustmentIn, principal: Principal = Depends(require_admin),
                      session: Session = Depends(get_session, scope="function")) -> LedgerEntryOut:
    e = ledger.adjust(session, account=body.account, kind=body.kind, gpu_seconds=round(body.gpu_hours * 3600),
                      by=principal.who, reason=body.reason, job_id=body.job_id,
                      pool=body.pool)
    return _entry_out(e)


@router.get("/ledger", response_model=LedgerPage, operation_id="listLedgerEntries", summary="View the ledger",
            description="Entries oldest first, filtered; follow `next_cursor` for the next page.",
            responses=problem_responses(401, 403, 422))
def list_ledger(
    account: Annotated[str | None, Query(pattern=NAME)] = None,
    include_subaccounts: Annotated[bool, Query(description="With `account`: also its descendants.")] = False,
    job_id: Annotated[str | None, Query(max_length=36)] = None,
    kind: Annotated[list[LedgerEntryKind] | None, Query(description="Repeatable.")] = None,
    pool: Annotated[Pool | None, Query()] = None,
    since: Annotated[datetime | None, Query(description="Entries at or after (ISO 8601).")] = None,
    until: Annotated[datetime | None, Query(description="Entries before (ISO 8601).")] = None,
    cursor: Annotated[str | None, Query(max_length=128)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    session: Session = Depends(get_session, scope="function"),
) -> LedgerPage:
    if since and until and as_utc(until) <= as_utc(since):
        raise Invalid("query.until", "must be after `since`")
    rows = repository.list_entries(session, account=account, include_subaccounts=include_subaccounts,
                                   job_id=job_id, kinds=[k.value for k in kind or []],
                                   pool=pool, since=as_utc(since),
                                   until=as_utc(until), after_id=_uncursor(cursor) if cursor else 0,
                                   limit=limit + 1)
    more = len(rows) > limit
    rows = rows[:limit]
    return LedgerPage(items=[_entry_out(e) for e in rows], next_cursor=_cursor(rows[-1].id) if more else None)


UsageSince = Annotated[date | None, Query(description="First day (UTC); default: first of this month.")]
UsageUntil = Annotated[date | None, Query(description="Day after the last; default: tomorrow.")]
UsagePeriodQ = Annotated[UsagePeriod, Query()]
UsageAccount = Annotated[str | None, Query(pattern=NAME, description="This account and its descendants.")]


def _usage_rows(session: Session, since: date | None, until: date | None, period: UsagePeriod,
                account: str | None) -> tuple[date, date, list[dict]]:
    today = utcnow().date()
    since = since or today.replace(day=1)
    until = until or today + timedelta(days=1)
    if until <= since:
        raise Invalid("query.until", "must be after `since`")
    if (until - since).days > 3660:
        raise Invalid("query.since", "the report spans at most 10 years")
    names = None
    if account:
        tree = accounts.load_tree(session)
        if account not in tree:
            raise Invalid("query.account", f"unknown account {account!r}")
        names = accounts.descendants(tree, account)
    return since, until, repository.usage_report(session, since=since, until=until, period=period.value,
                                                 accounts_in=names)


def _usage_csv(since: date, until: date, rows: list[dict]) -> Response:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=USAGE_COLUMNS)
    w.writeheader()
    for r in rows:
        w.writerow({**r, "pool": r["pool"] or ""})
    return Response(buf.getvalue(), media_type="text/csv; charset=utf-8", headers={
        "Content-Disposition": f'attachment; filename="isthmus-usage-{since}-{until}.csv"'})


@router.get("/usage", response_model=UsageReport, operation_id="getUsageReport",
            summary="Usage per account x pool x period",
            description="Net charges of each account's own jobs (billing-weighted) per pool and period, plus admin "
                        "adjustments. The same report as CSV: getUsageReportCsv.",
            responses=problem_responses(401, 403, 422))
def usage_report(
    request: Request,
    since: UsageSince = None,
    until: UsageUntil = None,
    period: UsagePeriodQ = UsagePeriod.MONTH,
    account: UsageAccount = None,
    # Kept for curl users and older CLIs; not in the spec, where one operation has one
    # response type (CSV is its own operation).
    format: Annotated[Literal["json", "csv"] | None, Query(include_in_schema=False)] = None,
    session: Session = Depends(get_session, scope="function"),
):
    since, until, rows = _usage_rows(session, since, until, period, account)
    if format == "csv" or (format is None and CSV in request.headers.get("accept", "")):
        return _usage_csv(since, until, rows)
    return UsageReport(since=since.isoformat(), until=until.isoformat(), period=period,
                       items=[UsageRow(**r) for r in rows])


@router.get("/usage.csv", response_class=Response, operation_id="getUsageReportCsv",
            summary="Usage per account x pool x period, as CSV",
            description="getUsageReport as `text/csv` (a header row, then one row per item); columns: "
                        + ", ".join(USAGE_COLUMNS) + ". `pool` is empty for adjustments not tied to a pool.",
            responses={200: {"description": "The report as CSV", "content": {CSV: {
                "schema": {"type": "string"},
                "example": "account,pool,period,jobs,usage_gpu_seconds,adjustment_gpu_seconds,net_gpu_seconds,"
                           "net_gpu_hours\r\nteam-a,slurm,2026-11,12,360000,0,360000,100.0\r\n"}}},
                       **problem_responses(401, 403, 422)})
def usage_report_csv(
    since: UsageSince = None,
    until: UsageUntil = None,
    period: UsagePeriodQ = UsagePeriod.MONTH,
    account: UsageAccount = None,
    session: Session = Depends(get_session, scope="function"),
) -> Response:
    since, until, rows = _usage_rows(session, since, until, period, account)
    return _usage_csv(since, until, rows)


@router.get("/fairshare", response_model=FairShareTable, operation_id="getFairshareTable",
            summary="Fair-share table (like sshare)",
            description="Every account with raw and normalised shares, decayed usage (and its split over "
                        "pools, `raw_usage_gpu_hours_per_pool`), effective usage and the factor F = 2^(-U_E/S), "
                        "tree order. Fair share is one factor per account across every pool.", responses=problem_responses(401, 403))
def fairshare_table(request: Request, session: Session = Depends(get_session, scope="function")) -> FairShareTable:
    now = utcnow()
    fs = _ledger(request).fairshare(session, now=now)
    tree = accounts.load_tree(session)
    kids = accounts.children_map(tree)
    order: list[str] = []
    stack = list(reversed(kids.get(None, [])))
    while stack:
        n = stack.pop()
        order.append(n)
        stack.extend(reversed(kids.get(n, [])))
    # Usage per pool (like sshare's per-cluster rows): the factor's exact decayed usage,
    # apportioned over pools by the decayed daily buckets (gateway/ledger/breakdown.py).
    own = {n: fs[n].raw_usage - sum(fs[k].raw_usage for k in kids.get(n, [])) for n in order}
    parts = breakdown.raw_usage_by_pool(
        {n: (a.parent_name if a.parent_name in tree else None) for n, a in tree.items()}, own,
        _ledger(request).own_pool_weights(session, now=now))
    items = []
    for n in order:
        out = fairshare_out(fs[n])
        out.raw_usage_gpu_hours_per_pool = {p: v / 3600 for p, v in sorted(parts.get(n, {}).items())}
        items.append(out)
    return FairShareTable(at=now, half_life_s=_ledger(request).half_life_s, items=items)


@router.get("/billing-weights", response_model=list[BillingWeightOut], operation_id="listBillingWeights",
            summary="GPU billing weights", responses=problem_responses(401, 403))
def list_weights(session: Session = Depends(get_session, scope="function")) -> list[BillingWeightOut]:
    return [BillingWeightOut(pool=w.pool, gpu_type=w.gpu_type, weight=w.weight)
            for w in repository.billing_weights(session)]


@router.put("/billing-weights/{pool}/{gpu_type}", response_model=BillingWeightOut, operation_id="setBillingWeight",
            summary="Set a GPU type's billing weight in a pool",
            description="`gpu_type` `*` sets the pool's default. GPU types are case-insensitive and stored in "
                        "lower case, as jobs record them. Applies to reservations made from now on.",
            responses=problem_responses(401, 403, 422))
def set_weight(pool: Annotated[str, Path(pattern=POOL_NAME_PATTERN, max_length=63)], gpu_type: Annotated[str, "gpu type"], body: BillingWeightIn,
               principal: Principal = Depends(require_admin),
               session: Session = Depends(get_session, scope="function")) -> BillingWeightOut:
    import re

    if not re.fullmatch(r"^(\*|[A-Za-z0-9][A-Za-z0-9._-]{0,31})$", gpu_type):
        raise Invalid("path.gpu_type", "a GPU type like h100, or * for the pool default")
    require_known(session, pool, "path.pool")
    gpu_type = normalise_gpu_type(gpu_type)  # the form jobs are recorded in
    w = repository.set_billing_weight(session, pool=pool, gpu_type=gpu_type, weight=body.weight, by=principal.who)
    return BillingWeightOut(pool=pool, gpu_type=gpu_type, weight=w.weight)


@router.get("/orphans", response_model=list[OrphanOut], operation_id="listOrphans",
            summary="Backend jobs unknown to the registry",
            description="Lists every job on every configured backend that carries a gateway id the "
                        "registry does not know (e.g. submitted by another gateway against the same "
                        "cluster, or left behind by a restore). Nothing is changed; cancel them on the "
                        "backend if they should not run.",
            responses=problem_responses(401, 403))
def list_orphans(request: Request) -> list[OrphanOut]:
    return [OrphanOut(**o) for o in request.app.state.dispatcher.orphans()]
