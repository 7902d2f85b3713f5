"""The /ui dashboard: server-rendered pages over the same services and tenancy as the API.

Every page resolves the caller from the session's access token (``auth.principal_of``), then
reads through the same repository functions as the API (``readable_jobs``,
``visible_accounts``), never through HTTP calls to itself. Templates autoescape; every
state-changing form carries the session's CSRF token (docs/ui.md). Logging in and out is
``login.py``; rendering and the error pages ``rendering.py``; the jobs table ``jobs_table.py``.
"""

from __future__ import annotations

import re
import secrets
from datetime import UTC, datetime, timedelta
from typing import Annotated

import anyio
from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.responses import PlainTextResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles

from gateway.accounts import service as accounts
from gateway.domain.routing import topology_words
from gateway.domain.states import JobState
from gateway.domain.windows import hold_words, shortfall
from gateway.domain.windows import words as window_words
from gateway.identity.principal import Principal
from gateway.jobs import checkpoints, preemption
from gateway.jobs import reads as job_reads
from gateway.jobs import repository as jobs_repo
from gateway.jobs import service as jobs
from gateway.kit.db import in_read_thread, reading, transaction
from gateway.kit.errors import Forbidden, GatewayError, Invalid, NotFound
from gateway.kit.streams import HeldStreamingResponse
from gateway.kit.timeutil import utcnow
from gateway.ledger import reading as ledger_reading
from gateway.models.specs import checkpoint_dir_of, spec_of
from gateway.pools import nodehealth
from gateway.pools import reservations as advance
from gateway.pools import service as pools
from gateway.pools import windows as pool_windows
from gateway.ui import login, plots, statement
from gateway.ui.auth import (
    LoginRequired,
    check_csrf,
    posted_csrf,
    posted_form,
    principal_of,
)
from gateway.ui.headers import UiHeadersMiddleware
from gateway.ui.jobs_table import estimate_of, job_pool, table_rows
from gateway.ui.rendering import HERE, html_error_pages, render
from gateway.ui.session import UiSessionMiddleware

router = APIRouter(prefix="/ui", include_in_schema=False)
WAITING = ("pending", "dispatching", "queued", "requeued")


# ------------------------------------------------------------------ pages
# The pages that only read run in the read threads (kit/db.py in_read_thread: a few at once per
# worker, issue #46); the forms and streams as before.


@router.get("/", name="ui_jobs")
async def jobs_page(request: Request, state: str = "", account: str = "", pool: str = ""):
    return await in_read_thread(_jobs_page, request, state, account, pool)


def _jobs_page(request: Request, state: str = "", account: str = "", pool: str = ""):
    principal = principal_of(request)
    with reading(request.app.state.db) as session:
        rows = job_reads.list_readable(session, principal, states=[state] if state else (), account=account or None,
                                       pool=pool or None, limit=200, columns="table", as_tuples=True)
        names = accounts.visible_accounts(session, accounts=principal.accounts, username=principal.username,
                                          is_admin=principal.is_admin)
    pool_names = sorted(getattr(request.app.state, "backends", {}) or {})
    return render(request, "jobs.html", {"table": table_rows(rows), "states": [s.value for s in JobState],
                                         "accounts": names, "pools": pool_names,
                                         "filters": {"state": state, "account": account, "pool": pool}},
                  principal=principal)


@router.get("/jobs/{job_id}", name="ui_job")
async def job_page(request: Request, job_id: str, partial: str = ""):
    return await in_read_thread(_job_page, request, job_id, partial)


def _job_page(request: Request, job_id: str, partial: str = ""):
    principal = principal_of(request)
    with reading(request.app.state.db) as session:
        row = job_reads.one(session, principal, job_id)  # a statement built once (issue #46)
        if row is None:
            raise NotFound(f"no job {job_id!r} visible to you")
        job = job_reads.as_job(row)
        events = job_reads.events(session, job.id)
        ctx = {"job": job, "spec": spec_of(job, session), "pool": job_pool(job) or "", "final": job.job_state.final, "estimate": estimate_of(job),
               "checkpoint_dir": checkpoint_dir_of(job, getattr(request.app.state, "storage", None)),
               "attempts": jobs.attempts_of(session, job.id) if job.attempt > 1 else [],
               "at_risk": checkpoints.at_risk(job),
               "preemption": preemption.current(session, job) if job.borrowed else None,
               "events": [{"at": e.at, "kind": e.kind, "actor": e.actor, "from": e.from_state,
                           "to": e.to_state, "reason": e.reason} for e in events]}
        return render(request, "job_live.html" if partial == "live" else "job.html", ctx, principal=principal)


@router.get("/jobs/{job_id}/output", name="ui_output")
def output(request: Request, job_id: str,
           worker: Annotated[int, Query(ge=0, le=100_000)] = 0,
           tail: Annotated[int | None, Query(ge=1, le=1_000_000)] = None) -> Response:
    """One worker's output as text, for the job page (the session's twin of GET /v1/jobs/{id}/logs).

    The same tenancy and the same reader as the API (gateway/jobs/logs.py: chunks, bounded
    memory). A job with no output to show answers the reason as plain text with the API's
    status (409 not yet, 404 not yours, 501 no readable output, 503 pool unreachable): the
    page shows it in place of the output.
    """
    from gateway.jobs import logs

    principal = principal_of(request)
    sessions = request.app.state.sessionmaker
    try:
        with transaction(sessions) as session:
            job = jobs.get_or_raise(session, principal=principal, job_id=job_id)
        # Read outside the transaction (a pod log read is a network call); the loaded job
        # stays readable (expire_on_commit=False).

        def job_final() -> bool:
            with sessions() as s:
                return jobs_repo.is_final(s, job.id, logs.FINAL_STATES)

        body, permit = logs.open_held(request.app.state.streams, principal.subject,
                                      getattr(request.app.state, "backends", None) or {}, job, worker,
                                      keep_dir=request.app.state.settings.output_keep_dir, tail=tail, follow=False,
                                      job_final=job_final)
    except GatewayError as exc:
        return PlainTextResponse(exc.detail or exc.title, status_code=exc.status, headers=_TEXT_HEADERS)
    return HeldStreamingResponse(body, permit=permit, media_type="text/plain; charset=utf-8", headers=_TEXT_HEADERS)


# The output is whatever the job printed: never let a browser sniff it into HTML.
_TEXT_HEADERS = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}


@router.get("/events", name="ui_events")
async def events_stream(request: Request, after: Annotated[int | None, Query(ge=0, le=2**62)] = None) -> Response:
    """The caller's job events as server-sent events: GET /v1/events/stream through the session.

    The job page listens and re-renders on its job's events (ui.js), instead of waiting for
    its timer. The same hub, tenancy, resume (``Last-Event-ID``, which EventSource sends on
    reconnect, or ``after``) and bounds as the API's stream (docs/logs.md); a reconnect
    checks the session's token again.
    """
    from gateway.jobs import events

    principal = await anyio.to_thread.run_sync(principal_of, request)  # may fetch the provider's keys
    last = request.headers.get("last-event-id")
    if last is not None:
        if not re.fullmatch(r"[0-9]{1,19}", last):
            raise Invalid("header.Last-Event-ID", "must be an event id sent by this stream")
        after = int(last)
    permit = request.app.state.streams.acquire(principal.subject)  # counts with the API's streams
    body = events.sse(request.app.state.event_hubs.current(), principal, after_id=after,
                      max_stream_s=request.app.state.settings.events_max_stream_s)
    return HeldStreamingResponse(body, permit=permit, media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})


@router.post("/jobs/{job_id}/cancel", name="ui_cancel")
def cancel(request: Request, job_id: str, csrf: str = Depends(posted_csrf)):
    principal = principal_of(request)
    check_csrf(request, csrf)
    with transaction(request.app.state.sessionmaker) as session:
        jobs.cancel(session, principal=principal, job_id=job_id, reason="")
    wake = getattr(getattr(request.app.state, "dispatcher", None), "wake", None)
    if callable(wake):
        wake()
    return RedirectResponse(request.url_for("ui_job", job_id=job_id), status_code=303)


@router.get("/accounts", name="ui_accounts")
async def accounts_page(request: Request):
    return await in_read_thread(_accounts_page, request)


def _accounts_page(request: Request):
    principal = principal_of(request)
    ledger = request.app.state.ledger
    with reading(request.app.state.db) as session:
        names = accounts.visible_accounts(session, accounts=principal.accounts, username=principal.username,
                                          is_admin=principal.is_admin)
        today = utcnow().date()
        since = today.replace(day=1)
        # The statements built once first: they are sent as text only while the session has
        # not begun a transaction, which its first ORM statement (the fair share's) does.
        usage = [(name, ledger.account_usage(session, account=name, shares={}, pools=False),
                  ledger_reading.usage(session, since=since, until=today + timedelta(days=1), period="day",
                                       account=name)) for name in names]
        fs = ledger.fairshare(session)
        ranked = sorted(fs.values(), key=lambda f: -f.factor)
        position = {f.account: i + 1 for i, f in enumerate(ranked)}
        items = []
        for name, u, days in usage:
            eff, bal = u["effective"], u["balance"]
            budget = eff["budget_gpu_seconds"].value
            items.append({
                "name": name, "reserved_gpus": bal.reserved_gpus, "max_gpus": eff["max_gpus"].value,
                "queued_jobs": bal.queued_jobs, "used_h": _h(u["used_gpu_seconds"]),
                "committed_h": _h(bal.committed_gpu_seconds), "remaining_h": _h(u["remaining_gpu_seconds"]),
                "budget_h": _h(budget), "period": u["period"],
                "factor": fs[name].factor if name in fs else None, "position": position.get(name),
                "of": len(ranked), "burndown": plots.burndown(days, budget=budget, since=since, today=today)})
    return render(request, "accounts.html", {"accounts": items}, principal=principal)


@router.get("/pools", name="ui_pools")
def pools_page(request: Request):
    principal = principal_of(request)
    health = pools.current(getattr(request.app.state, "dispatcher", None))
    with transaction(request.app.state.sessionmaker) as session:
        waiting = jobs_repo.waiting_per_pool(session, WAITING)
        windows = _windows(session, health)
    items = [{"name": name, "kind": h.kind, "ok": h.ok, "reason": h.reason, "total_gpus": h.view.total_gpus,
              "free_gpus": h.view.free_gpus, "total_nodes": h.view.total_nodes, "idle_nodes": h.view.idle_nodes,
              "waiting": waiting.get(name, 0),
              "topology": topology_words((d.level, d.name, d.idle_nodes, len(d.nodes))
                                         for p in (h.view.capacity.pools if h.view.capacity else ()) for d in p.topology)}
             for name, h in health.items()]
    return render(request, "pools.html", {"pools": items, "unrouted": waiting.get("auto", 0), "windows": windows},
                  principal=principal)


def _windows(session, health) -> list[dict]:
    """Every window that has not ended, both sources (gateway/pools/windows.py), as the pages show them."""
    now = utcnow()
    return [{"id": w.name, "pool": w.pool, "source": w.source, "start": f"{w.start:%Y-%m-%d %H:%M} UTC",
             "end": "no end" if pool_windows.is_open_ended(w) else f"{w.end:%Y-%m-%d %H:%M} UTC",
             "nodes": ", ".join(w.nodes) or "all", "reason": w.reason, "active": w.start <= now,
             "maintenance": w.maintenance, "words": window_words(w)}
            for w in pool_windows.shown(session, {name: h.view for name, h in health.items()}, now=now)]


@router.get("/admin", name="ui_admin")
async def admin_page(request: Request, days: int = 30):
    return await in_read_thread(_admin_page, request, days)


def _admin_page(request: Request, days: int = 30):
    principal = principal_of(request)
    if not principal.is_admin:
        raise Forbidden("the admin page needs the admin role")
    days = max(1, min(days, 366))
    today = utcnow().date()
    since = today - timedelta(days=days - 1)
    health = pools.current(getattr(request.app.state, "dispatcher", None))  # before the transaction (SQLite)
    with reading(request.app.state.db) as session:
        # The statements built once first (sent as text until an ORM statement begins a transaction).
        rows = ledger_reading.usage(session, since=since, until=today + timedelta(days=1), period="month")
        effective = accounts.effective_quotas(session)
        pool_names = pools.configured_names(session)
        windows = _windows(session, health)
        views = {name: h.view for name, h in health.items()}
        held = [{"id": h.id, "words": hold_words(h), "shortfall": shortfall(h, views.get(h.pool)), "by": h.by,
                 "native_note": h.native_note}
                for h in advance.planned(session, now=utcnow())]
        nodes = [{"pool": n.verdict.pool, "node": n.verdict.node, "suspect": n.verdict.suspect,
                  "reason": n.verdict.reason, "lost_h": round(n.verdict.lost_gpu_seconds / 3600, 2),
                  "drained": n.drained_at is not None, "drain_error": n.drain_error}
                 for n in nodehealth.listing(session, now=utcnow(),
                                             thresholds=nodehealth.thresholds_of(request.app.state.settings))]
        quotas = []
        for name in sorted(effective):
            eff = effective[name]
            quotas.append({"name": name, "max_gpus": eff["max_gpus"].value,
                           "budget_h": _h(eff["budget_gpu_seconds"].value),
                           "source": eff["budget_gpu_seconds"].source})
    matrix: dict[tuple[str, str], float] = {}
    for r in rows:
        key = (r["account"], r["pool"] or "(adjustment)")
        matrix[key] = matrix.get(key, 0.0) + r["net_gpu_seconds"] / 3600
    pools_seen = sorted({p for _, p in matrix})
    accounts_seen = sorted({a for a, _ in matrix})
    return render(request, "admin.html", {
        "since": since, "days": days, "pools": pools_seen, "accounts": accounts_seen,
        "matrix": {f"{a}\x1f{p}": round(v, 2) for (a, p), v in matrix.items()},
        "chart": plots.stacked_bars(accounts_seen, pools_seen, matrix), "quotas": quotas, "windows": windows, "held": held,
        "pool_names": pool_names, "nodes": nodes}, principal=principal)


def _admin_only(request: Request, form: dict[str, str]) -> Principal:
    principal = principal_of(request)
    check_csrf(request, form.get("csrf", ""))
    if not principal.is_admin:
        raise Forbidden("windows need the admin role")
    return principal


def _utc_field(form: dict[str, str], name: str) -> datetime:
    """A form's ``datetime-local`` field, read as UTC (the form says so)."""
    try:
        at = datetime.fromisoformat(form.get(name, "").strip())
    except ValueError:
        raise Invalid(f"form.{name}", "give a date and time, e.g. 2026-12-08T06:00") from None
    return at if at.tzinfo else at.replace(tzinfo=UTC)


@router.post("/admin/windows", name="ui_add_window")
def add_window(request: Request, form: dict[str, str] = Depends(posted_form)):
    """The admin page's form: the same rule as POST /v1/admin/pools/{name}/windows."""
    principal = _admin_only(request, form)
    nodes = [n.strip() for n in form.get("nodes", "").split(",") if n.strip()]
    with transaction(request.app.state.sessionmaker) as session:
        pool_windows.create(session, form.get("pool", ""), starts_at=_utc_field(form, "start"),
                            ends_at=_utc_field(form, "end"), reason=form.get("reason", ""), nodes=nodes,
                            by=principal.who, now=utcnow())
    return RedirectResponse(str(request.url_for("ui_admin")) + "#windows", status_code=303)


@router.post("/admin/windows/{pool}/{window_id}/delete", name="ui_delete_window")
def delete_window(request: Request, pool: str, window_id: str, form: dict[str, str] = Depends(posted_form)):
    principal = _admin_only(request, form)
    with transaction(request.app.state.sessionmaker) as session:
        pool_windows.remove(session, pool, window_id, by=principal.who)
    return RedirectResponse(str(request.url_for("ui_admin")) + "#windows", status_code=303)


@router.post("/admin/nodes/{pool}/{node}/clear", name="ui_clear_node")
def clear_node(request: Request, pool: str, node: str, form: dict[str, str] = Depends(posted_form)):
    """The admin page's Clear button: the same as POST /v1/admin/nodes/{pool}/{node}/clear."""
    principal = _admin_only(request, form)
    nodehealth.clear_and_resume(request.app.state.sessionmaker, request.app.state.backends, pool, node,
                                by=principal.who, now=utcnow())
    dispatcher = getattr(request.app.state, "dispatcher", None)
    if dispatcher is not None:
        dispatcher.node_watch.invalidate()
    return RedirectResponse(str(request.url_for("ui_admin")) + "#nodes", status_code=303)


def _h(seconds) -> float | None:
    return None if seconds is None else round(seconds / 3600, 2)


# ------------------------------------------------------------------ wiring


def install(app: FastAPI) -> None:
    """Mount /ui: static assets, the session middleware, the OIDC client, the pages."""
    settings = app.state.settings
    secret = settings.ui_session_secret
    if not secret:
        if not settings.dev_mode and settings.ui_oidc_issuer:
            from gateway.identity.setup import ConfigurationError

            raise ConfigurationError("ISTHMUS_UI_SESSION_SECRET must be set when ISTHMUS_UI_OIDC_ISSUER is "
                                     "(it signs the /ui session cookie); e.g. `openssl rand -hex 32`")
        secret = secrets.token_hex(32)  # dev mode, or /ui off: sessions last one process
    login.configure(app)
    app.add_middleware(UiSessionMiddleware, secret=secret)
    app.add_middleware(UiHeadersMiddleware)  # CSP, framing, referrer, nosniff on every /ui answer
    app.mount("/ui/static", StaticFiles(directory=HERE / "static"), name="ui-static")
    app.include_router(login.router)
    app.include_router(router)
    app.include_router(statement.router)  # an account's statement (docs/ledger.md)
    html_error_pages(app)

    @app.exception_handler(LoginRequired)
    async def _login_required(request: Request, exc: LoginRequired) -> Response:
        nxt = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        if request.method != "GET":
            nxt = "/ui/"
        return RedirectResponse(str(request.url_for("ui_login").include_query_params(next=nxt)), status_code=303)
