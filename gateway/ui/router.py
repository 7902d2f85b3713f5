"""The /ui dashboard: server-rendered pages over the same services and tenancy as the API.

Every page resolves the caller from the session's access token with the gateway's own
authenticator (the token the provider gave at login, checked like a bearer token on every
request), then reads through the same repository functions as the API (``readable_jobs``,
``visible_accounts``), never through HTTP calls to itself. Templates autoescape; every
state-changing form carries the session's CSRF token (docs/ui.md).
"""

from __future__ import annotations

import functools
import hmac
import json
import logging
import re
import secrets
import warnings
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Annotated, Any
from urllib.parse import parse_qs, urlsplit

import anyio
from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import (
    HTMLResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
)
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from markupsafe import Markup
from starlette.exceptions import HTTPException as StarletteHTTPException

from gateway.accounts import service as accounts
from gateway.domain.routing import topology_words
from gateway.domain.states import JobState
from gateway.domain.windows import hold_words, shortfall
from gateway.domain.windows import words as window_words
from gateway.identity import ui_sessions
from gateway.identity.authn import InvalidToken
from gateway.identity.dependency import note_seen
from gateway.identity.principal import Principal
from gateway.jobs import checkpoints, preemption
from gateway.jobs import reads as job_reads
from gateway.jobs import repository as jobs_repo
from gateway.jobs import service as jobs
from gateway.kit.db import reading, transaction
from gateway.kit.errors import Forbidden, GatewayError, Invalid
from gateway.kit.streams import HeldStreamingResponse
from gateway.kit.timeutil import as_utc, utcnow
from gateway.ledger import reading as ledger_reading
from gateway.ledger import repository as ledger_repo
from gateway.models.jobs import Job
from gateway.models.specs import checkpoint_dir_of, spec_of
from gateway.pools import reservations as advance
from gateway.pools import service as pools
from gateway.pools import windows as pool_windows
from gateway.ui import plots
from gateway.ui.headers import UiHeadersMiddleware
from gateway.ui.session import UiSessionMiddleware

HERE = Path(__file__).resolve().parent
log = logging.getLogger("isthmus.ui")
# The login-failure page's only text: never the provider's error_description (#27, finding 10).
LOGIN_FAILED = "The login did not complete. Try again; if it keeps failing, ask your administrator."
templates = Jinja2Templates(directory=HERE / "templates")
templates.env.filters["tojson_pretty"] = lambda v: json.dumps(v, indent=2, sort_keys=True, default=str)
router = APIRouter(prefix="/ui", include_in_schema=False)
WAITING = ("pending", "dispatching", "queued", "requeued")
PENDING = JobState.PENDING.value


def job_pool(job: Job) -> str:
    """The pool a job runs on (or asked for): one place for the pools rework to re-point."""
    return job.pool or job.requested_pool


def estimate_of(job: Job) -> dict[str, Any] | None:
    """A pending job's estimated start (docs/dispatch.md, "Estimates"), as the page shows it.

    Only while pending, as in the API: once dispatched the estimate no longer applies. With
    no start, ``reason`` says why there is none; a job no dispatch round has looked at yet
    has neither.
    """
    if job.state != PENDING:
        return None
    return _estimate(as_utc(job.estimated_start), job.estimated_pool, job.estimate_reason)


def _estimate(start, pool: str | None, reason: str | None, in_words: str | None = None) -> dict[str, Any]:
    """``estimate_of``'s words for a pending job; ``in_words``: ``_from_now(start)`` already said."""
    if start is None:
        return {"at": None, "reason": reason or "not estimated yet: no dispatch round has seen it"}
    return {"at": start.strftime("%Y-%m-%d %H:%M:%S UTC"), "iso": start.isoformat(timespec="seconds"),
            "in": _from_now(start) if in_words is None else in_words, "pool": pool or "", "reason": reason or ""}


def _from_now(at) -> str:
    seconds = int((at - utcnow()).total_seconds())
    if seconds <= 0:
        return "due now"
    if seconds < 90:
        return f"in {seconds} s"
    if seconds < 90 * 60:
        return f"in {round(seconds / 60)} min"
    if seconds < 48 * 3600:
        return f"in {seconds / 3600:.1f} h"
    return f"in {seconds / 86400:.1f} days"


class LoginRequired(Exception):
    pass


# ------------------------------------------------------------------ session, login, CSRF


def csrf_token(request: Request) -> str:
    """The logged-in session's CSRF token (kept in its server-side row); set by principal_of."""
    return getattr(request.state, "ui_csrf", "")


async def posted_form(request: Request) -> dict[str, str]:
    """A urlencoded form's fields (the first value of each), parsed here: no multipart dependency."""
    body = (await request.body()).decode("utf-8", errors="replace")
    return {k: v[0] for k, v in parse_qs(body, keep_blank_values=True).items()}


async def posted_csrf(request: Request) -> str:
    """The `csrf` field of a urlencoded form (parsed here: no multipart dependency)."""
    body = (await request.body()).decode("utf-8", errors="replace")
    return parse_qs(body).get("csrf", [""])[0]


def check_csrf(request: Request, token: str) -> None:
    expected = csrf_token(request)
    origin = request.headers.get("origin")
    if origin and origin != "null" and urlsplit(origin).netloc != request.url.netloc:
        raise Forbidden("cross-site form refused")
    if not expected or not hmac.compare_digest(expected, token or ""):
        raise Forbidden("the form's CSRF token is missing or stale: reload the page")


def principal_of(request: Request) -> Principal:
    """The caller of a /ui request: its session's row (not revoked, not expired) and that row's
    token, checked like a bearer token. Blocking (a query, maybe a key fetch): sync routes only."""
    sid = request.session.get("sid")
    if not sid:
        raise LoginRequired
    principal = None
    with reading(request.app.state) as session:  # a read on every page: no BEGIN / COMMIT (issue #46)
        row = ui_sessions.live(session, sid=sid)
    if row is not None:
        try:
            principal = request.app.state.authenticator.authenticate(row.access_token)
            request.state.ui_csrf = row.csrf
        except InvalidToken:  # its token expired or was revoked: so is the session
            with transaction(request.app.state.sessionmaker) as session:
                ui_sessions.revoke(session, sid=sid)
    if principal is None:  # logged out, expired, or never ours
        request.session.clear()
        raise LoginRequired
    note_seen(request, principal)  # a /ui visit keeps the caller's webhooks alive, as an API call does
    return principal


def oauth_client(request: Request):
    return getattr(request.app.state, "ui_oauth", None)


@router.get("/login", name="ui_login")
async def login(request: Request, next: str = "/ui/"):
    client = oauth_client(request)
    if client is None:
        return render(request, "unconfigured.html", {}, status=503)
    request.session["next"] = next if next.startswith("/ui/") and not next.startswith("//") else "/ui/"
    return await client.authorize_redirect(request, str(request.url_for("ui_callback")))


@router.get("/auth/callback", name="ui_callback")
async def callback(request: Request):
    from authlib.integrations.base_client import OAuthError

    client = oauth_client(request)
    if client is None:
        return render(request, "unconfigured.html", {}, status=503)
    try:
        token = await client.authorize_access_token(request)
        principal = request.app.state.authenticator.authenticate(token["access_token"])
    except (OAuthError, InvalidToken) as exc:
        # The provider's text is whatever the query string said (anyone can craft the link):
        # it goes to the log, and the page says only what happened (docs/ui.md).
        log.warning("ui login failed: %s", str(exc)[:500])
        return error_page(request, status=401, title="Login failed", detail=LOGIN_FAILED)
    expires = token.get("expires_at")
    nxt = request.session.pop("next", "/ui/")

    def store() -> str:
        with transaction(request.app.state.sessionmaker) as session:
            return ui_sessions.create(session, access_token=token["access_token"], subject=principal.subject,
                                      token_expires_at=datetime.fromtimestamp(expires, UTC) if expires else None)

    sid = await anyio.to_thread.run_sync(store)
    request.session.clear()  # the login's OAuth state goes; the cookie now holds only the session id
    request.session["sid"] = sid
    return RedirectResponse(nxt, status_code=303)


@router.post("/logout", name="ui_logout")
def logout(request: Request, csrf: str = Depends(posted_csrf)):
    sid = request.session.get("sid")
    with transaction(request.app.state.sessionmaker) as session:
        row = ui_sessions.get(session, sid=sid) if sid else None
        if row is not None:  # a session that is already gone has nothing to end
            request.state.ui_csrf = row.csrf
            check_csrf(request, csrf)
            ui_sessions.revoke(session, sid=sid)  # the old cookie, replayed, finds nothing
    request.session.clear()
    # Not straight back to /ui/login: the provider's own session would log the person in again.
    return RedirectResponse("/ui/logged-out", status_code=303)


@router.get("/logged-out", name="ui_logged_out")
def logged_out(request: Request):
    return render(request, "logged_out.html", {})


def render(request: Request, template: str, context: dict[str, Any], *, principal: Principal | None = None,
           status: int = 200) -> HTMLResponse:
    ctx = {"principal": principal, "csrf": csrf_token(request) if principal else "",
           "nav": request.url.path, **context}
    return templates.TemplateResponse(request, template, ctx, status_code=status,
                                      headers={"Cache-Control": "no-store"})


# ------------------------------------------------------------------ pages


@router.get("/", name="ui_jobs")
def jobs_page(request: Request, state: str = "", account: str = "", pool: str = ""):
    principal = principal_of(request)
    with reading(request.app.state) as session:
        rows = job_reads.list_readable(session, principal, states=[state] if state else (), account=account or None,
                                       pool=pool or None, limit=200, columns="table", as_tuples=True)
        names = accounts.visible_accounts(session, accounts=principal.accounts, username=principal.username,
                                          is_admin=principal.is_admin)
    pool_names = sorted(getattr(request.app.state, "backends", {}) or {})
    return render(request, "jobs.html", {"table": table_rows(rows), "states": [s.value for s in JobState],
                                         "accounts": names, "pools": pool_names,
                                         "filters": {"state": state, "account": account, "pool": pool}},
                  principal=principal)


_ESTIMATE = ("at", "iso", "in", "pool", "reason")
_STATE, _START = (next(i for i, c in enumerate(jobs_repo.IN_TABLE) if c.key == k) for k in ("state", "estimated_start"))


def table_rows(rows: list[tuple]) -> Markup:
    """The jobs table's rows (``jobs/repository.py`` ``IN_TABLE``, as tuples) as HTML: each row
    as ``job_row`` rendered it for the same values, and for a pending job with an estimated
    start, the same "in 5 min" (the one value that follows the clock)."""
    return Markup("".join([job_row(r, _from_now(as_utc(r[_START])) if r[_STATE] == PENDING and r[_START] is not None
                                   else None) for r in rows]))


@functools.lru_cache(maxsize=4096)
def job_row(row: tuple, in_words: str | None) -> str:
    """One row of the jobs table (templates/job_row.html), rendered once for each distinct row
    read and kept: the page's 200 rows were most of its time, and between two polls of the
    page (every 5 s) few of them change (issue #46). A pending job's "in 5 min" is part of the
    key (``in_words``), so a row whose words change is rendered anew."""
    job_id, name, account, user, state, why, pool, requested, created_at, start, est_pool, est_reason = row
    estimate = None
    if state == PENDING:
        words = _estimate(as_utc(start), est_pool, est_reason, in_words)
        estimate = SimpleNamespace(**{k: words.get(k) for k in _ESTIMATE})
    # Attributes, not dict keys: Jinja tries an attribute first, and a dict's missing one is an exception.
    j = SimpleNamespace(id=job_id, name=name, account=account, user=user, state=state, why=why or "",
                        pool=pool or requested or "", created_at=created_at, estimate=estimate)
    return templates.get_template("job_row.html").render(j=j)


@router.get("/jobs/{job_id}", name="ui_job")
def job_page(request: Request, job_id: str, partial: str = ""):
    principal = principal_of(request)
    with reading(request.app.state) as session:
        job = jobs.get_or_raise(session, principal=principal, job_id=job_id)
        events = jobs_repo.list_events(session, job.id)
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
    body = events.sse(events.get_hub(request.app), principal, after_id=after,
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
def accounts_page(request: Request):
    principal = principal_of(request)
    half_life = request.app.state.settings.fairshare_half_life_s
    with reading(request.app.state) as session:
        names = accounts.visible_accounts(session, accounts=principal.accounts, username=principal.username,
                                          is_admin=principal.is_admin)
        fs = ledger_reading.fairshare(session, half_life_s=half_life)
        ranked = sorted(fs.values(), key=lambda f: -f.factor)
        position = {f.account: i + 1 for i, f in enumerate(ranked)}
        today = utcnow().date()
        since = today.replace(day=1)
        items = []
        for name in names:
            u = ledger_reading.account_usage(session, account=name, half_life_s=half_life)
            eff, bal = u["effective"], u["balance"]
            budget = eff["budget_gpu_seconds"].value
            days = ledger_repo.usage_report(session, since=since, until=today + timedelta(days=1), period="day",
                                            accounts_in=[name])
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
def admin_page(request: Request, days: int = 30):
    principal = principal_of(request)
    if not principal.is_admin:
        raise Forbidden("the admin page needs the admin role")
    days = max(1, min(days, 366))
    today = utcnow().date()
    since = today - timedelta(days=days - 1)
    health = pools.current(getattr(request.app.state, "dispatcher", None))  # before the transaction (SQLite)
    with reading(request.app.state) as session:
        windows = _windows(session, health)
        pool_names = [p.name for p in pools.all_pools(session) if p.configured]
        views = {name: h.view for name, h in health.items()}
        held = [{"id": h.id, "words": hold_words(h), "shortfall": shortfall(h, views.get(h.pool)), "by": h.by,
                 "native_note": h.native_note}
                for h in advance.planned(session, now=utcnow())]
        rows = ledger_repo.usage_report(session, since=since, until=today + timedelta(days=1), period="month")
        effective = accounts.effective_quotas(session, accounts.load_tree(session))
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
        "pool_names": pool_names}, principal=principal)


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
                            by=principal.subject, now=utcnow())
    return RedirectResponse(str(request.url_for("ui_admin")) + "#windows", status_code=303)


@router.post("/admin/windows/{pool}/{window_id}/delete", name="ui_delete_window")
def delete_window(request: Request, pool: str, window_id: str, form: dict[str, str] = Depends(posted_form)):
    _admin_only(request, form)
    with transaction(request.app.state.sessionmaker) as session:
        pool_windows.remove(session, pool, window_id)
    return RedirectResponse(str(request.url_for("ui_admin")) + "#windows", status_code=303)


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
    app.state.ui_oauth = None
    if settings.ui_oidc_issuer:
        with warnings.catch_warnings():  # authlib's httpx integration warns about httpx2 on import
            warnings.simplefilter("ignore")
            from authlib.integrations.starlette_client import OAuth
        oauth = OAuth()
        kwargs = {"scope": "openid", "code_challenge_method": "S256"}
        if not settings.ui_client_secret:
            kwargs["token_endpoint_auth_method"] = "none"
        oauth.register("isthmus", client_id=settings.ui_client_id,
                       client_secret=settings.ui_client_secret or None,
                       server_metadata_url=settings.ui_oidc_issuer.rstrip("/") + "/.well-known/openid-configuration",
                       client_kwargs=kwargs)
        app.state.ui_oauth = oauth.isthmus
    app.add_middleware(UiSessionMiddleware, secret=secret)
    app.add_middleware(UiHeadersMiddleware)  # CSP, framing, referrer, nosniff on every /ui answer
    app.mount("/ui/static", StaticFiles(directory=HERE / "static"), name="ui-static")
    app.include_router(router)
    _html_error_pages(app)

    @app.exception_handler(LoginRequired)
    async def _login_required(request: Request, exc: LoginRequired) -> Response:
        nxt = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        if request.method != "GET":
            nxt = "/ui/"
        return RedirectResponse(str(request.url_for("ui_login").include_query_params(next=nxt)), status_code=303)


def under_ui(path: str) -> bool:
    return path == "/ui" or path.startswith("/ui/")


def _html_error_pages(app: FastAPI) -> None:
    """Errors under /ui as HTML pages in the dashboard's style; everywhere else problem+json.

    Each API handler (gateway/kit/errors.py) still decides the status, title, detail and
    headers (and logs a 500): under /ui its problem is rendered as a page instead of sent as
    JSON, so the two can never disagree. Needs the API's handlers installed first.
    """
    for exc_class in (GatewayError, RequestValidationError, StarletteHTTPException, Exception):
        api_handler = app.exception_handlers.get(exc_class)
        if api_handler is None:
            raise RuntimeError(f"install the API's error handlers before the dashboard's ({exc_class.__name__})")
        app.add_exception_handler(exc_class, _page_or_problem(api_handler))


def _page_or_problem(api_handler):
    async def handler(request: Request, exc: Exception) -> Response:
        problem = await api_handler(request, exc)
        if not under_ui(request.url.path):
            return problem
        body = json.loads(problem.body)
        headers = {k: v for k, v in problem.headers.items()
                   if k.lower() not in ("content-type", "content-length")}
        return error_page(request, status=problem.status_code, title=body.get("title") or "Error",
                          detail=body.get("detail") or "", errors=body.get("errors") or [], headers=headers)
    return handler


def error_page(request: Request, *, status: int, title: str, detail: str, errors: list[dict] | None = None,
               headers: dict[str, str] | None = None) -> HTMLResponse:
    """The dashboard's page for a failed request: the problem the API would send, as HTML."""
    principal = None
    if "session" in request.scope:  # a 500 is rendered outside the session middleware
        try:
            principal = principal_of(request)
        except Exception:  # noqa: BLE001 - the error page must render whoever asks
            principal = None
    ctx = {"principal": principal, "csrf": csrf_token(request) if principal else "", "nav": "",
           "status": status, "title": title, "detail": "" if detail == title else detail, "errors": errors or []}
    return templates.TemplateResponse(request, "error.html", ctx, status_code=status,
                                      headers={**(headers or {}), "Cache-Control": "no-store"})
