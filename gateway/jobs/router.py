"""HTTP only: /v1/jobs. Routes validate, call the service, shape the answer."""

from __future__ import annotations

import base64
import binascii
import functools
import re
from typing import Annotated

from fastapi import APIRouter, BackgroundTasks, Body, Header, Path, Query, Request, Response
from fastapi.responses import StreamingResponse

from gateway.identity import system_users
from gateway.identity.dependency import CurrentPrincipal
from gateway.jobs import repository, service
from gateway.jobs.models import Job
from gateway.jobs.schemas import (
    EXAMPLE_SPEC, POOL_CHOICE_RE, JobEventOut, JobEventPage, JobOut, JobPage, JobSpec, format_duration,
)
from gateway.jobs.states import JobState
from gateway.kit.db import DbSession
from gateway.kit.errors import Forbidden, Invalid, problem_responses
from gateway.kit.names import ACCOUNT_NAME_RE
from gateway.kit.timeutil import as_utc

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

IDEMPOTENCY_KEY_RE = re.compile(r"^[\x21-\x7e]{1,255}$")


def to_out(job: Job) -> JobOut:
    spec = job.spec
    return JobOut(
        id=job.id, name=job.name, account=job.account_name, user=job.username, submitted_by=job.submitted_by,
        pool=job.requested_backend, pool_kind=(job.spec or {}).get("pool_kind"), assigned_pool=job.backend,
        backend=job.requested_backend, assigned_backend=job.backend, state=JobState(job.state),
        state_reason=job.state_reason or "", routing_reason=job.routing_reason or "",
        command=spec["command"], image=spec.get("image"), workers=job.workers,
        gpus_per_worker=job.gpus_per_worker, total_gpus=job.total_gpus, held_gpus=job.held_gpus,
        cpus_per_worker=spec["cpus_per_worker"], memory_per_worker=spec["memory_per_worker"],
        gpu_type=spec.get("gpu_type"), time_limit=format_duration(job.time_limit_s), time_limit_s=job.time_limit_s,
        env=spec.get("env") or {}, labels=spec.get("labels") or {}, priority=job.priority,
        backend_job_id=job.backend_job_id, exit_code=job.exit_code, nodes=job.nodes,
        created_at=as_utc(job.created_at), updated_at=as_utc(job.updated_at), started_at=as_utc(job.started_at),
        ended_at=as_utc(job.ended_at), cancel_requested_at=as_utc(job.cancel_requested_at),
        job_set_id=job.job_set_id, array_index=job.array_index, parameters=spec.get("parameters"),
        **_estimate(job),
    )


def _estimate(job: Job) -> dict:
    if job.state != JobState.PENDING.value:
        return {}
    return {"estimated_start": as_utc(job.estimated_start), "estimated_pool": job.estimated_pool,
            "estimate_reason": job.estimate_reason}


def _encode_cursor(job_id: str) -> str:
    return base64.urlsafe_b64encode(job_id.encode()).decode().rstrip("=")


def _decode_cursor(cursor: str) -> str:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode("ascii")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise Invalid("query.cursor", "not a cursor returned by this API") from None
    if not re.fullmatch(r"[0-9a-f-]{36}", raw):
        raise Invalid("query.cursor", "not a cursor returned by this API")
    return raw


def _wake_dispatcher(request: Request, background: BackgroundTasks) -> None:
    # Background tasks run after the response, hence after the commit: the round sees the job.
    dispatcher = getattr(request.app.state, "dispatcher", None)
    if dispatcher is not None:
        background.add_task(dispatcher.wake)


def _caps(settings) -> service.SubmitCaps:
    return service.SubmitCaps(pending_per_user=settings.max_pending_jobs_per_user,
                              pending_per_account=settings.max_pending_jobs_per_account,
                              keys_per_user=settings.max_idempotency_keys_per_user,
                              key_window_s=settings.idempotency_key_window_s)


@functools.lru_cache(maxsize=8)
def _denied_users(value: str) -> frozenset[str]:
    return system_users.parse_user_list(value)


def _refuse_system_user(principal, settings) -> None:
    """403 before anything is recorded when the caller's POSIX user is a system account."""
    if not principal.username:
        return  # refused by service.create with its own reason
    reason = system_users.refusal(principal.username, min_uid=settings.min_job_uid,
                                  denied=_denied_users(settings.denied_job_users))
    if reason:
        raise Forbidden(reason)


def _refuse_unknown_pool(session, spec: JobSpec) -> None:
    """A job naming a pool the gateway does not know (or no longer has) is refused, naming the field."""
    if spec.pool == "auto":
        return
    from gateway.pools.models import Pool

    if session.get(Pool, spec.pool) is None:  # one known but not configured now waits, as with no pool at all
        from sqlalchemy import select

        known = ", ".join(session.scalars(select(Pool.name).where(Pool.configured.is_(True)).order_by(Pool.name)))
        field = "body.pool" if "pool" in spec.model_fields_set else "body.backend"
        raise Invalid(field, f"unknown pool {spec.pool!r}; this gateway has: {known or 'no pool yet'} "
                             "(GET /v1/pools), or use auto")


def _refuse_if_never_fits(request: Request, spec: JobSpec) -> None:
    """A job pinned to a pool that can never fit it is refused now, not left pending forever.

    Uses the dispatcher's latest capacity snapshot; with none yet, the job is accepted and
    the dispatcher fails it with the same reason once it knows.
    """
    dispatcher = getattr(request.app.state, "dispatcher", None)
    views = dispatcher.latest_views() if dispatcher is not None else {}
    if not views:
        return
    from gateway.routing.service import JobShape, check_pinned

    shape = JobShape.of_spec(workers=spec.workers, gpus_per_worker=spec.gpus_per_worker,
                             total_gpus=spec.total_gpus, spec=spec.model_dump(mode="json"))
    reason = check_pinned(shape, spec.pool, views)
    if reason:
        field = "body" if spec.pool == "auto" else ("body.pool" if "pool" in spec.model_fields_set else "body.backend")
        raise Invalid(field, f"this job can never run: {reason}")


def _refuse_if_never_admissible(session, spec: JobSpec) -> None:
    """A job larger than its account's concurrent-GPU limit on every pool it may use is refused now.

    The limit on a pool is the smallest ``max_gpus`` or per-pool ``max_gpus_per_pool`` set on
    the account or an ancestor: each level caps its subtree, so such a job could never be
    admitted and would wait forever (docs/dispatch.md, "Reservations and backfill"). The
    GPUs asked are a lower bound of what the gang holds, so nothing admissible is refused.
    The pools it may use: the one it names, else every routable pool (of its ``pool_kind``).
    """
    from sqlalchemy import select

    from gateway.accounts import service as accounts
    from gateway.accounts.models import AccountPoolQuota, AccountQuota
    from gateway.kit.errors import NotFound
    from gateway.ledger.service import routable_pools
    from gateway.pools.models import Pool

    try:
        names = [a.name for a in accounts.chain(session, spec.account)]
    except NotFound:
        return  # an unknown account: create() names the field
    overall = [(q.max_gpus, "max_gpus", q.account_name) for q in
               session.scalars(select(AccountQuota).where(AccountQuota.account_name.in_(names)))
               if q.max_gpus is not None]
    per_pool = list(session.scalars(select(AccountPoolQuota).where(AccountPoolQuota.account_name.in_(names),
                                                                   AccountPoolQuota.max_gpus.is_not(None))))
    if not overall and not per_pool:
        return  # the common case: no limit set anywhere on the chain
    if overall and spec.total_gpus > min(overall)[0]:  # max_gpus counts every pool together
        value, field, where = min(overall)
        raise Invalid("body.workers", f"this job can never run: it asks {spec.total_gpus} GPUs at once, more than "
                                      f"the concurrent-GPU limit of account {spec.account} on every pool "
                                      f"({field} = {value}, set on account {where})")
    if spec.pool != "auto":
        pools = [spec.pool]
    else:
        pools = routable_pools(session)
        if spec.pool_kind is not None:
            kinds = dict(session.execute(select(Pool.name, Pool.kind).where(Pool.name.in_(pools))).all())
            pools = [p for p in pools if kinds.get(p) == spec.pool_kind]
    if not pools:
        return  # no pool to judge against: the job waits with the dispatcher's reason
    limits: list[str] = []
    for pool in pools:
        candidates = overall + [(q.max_gpus, f"max_gpus_per_pool[{pool}]", q.account_name)
                                for q in per_pool if q.pool == pool]
        tightest = min(candidates, default=None)
        if tightest is None or spec.total_gpus <= tightest[0]:
            return
        limits.append(f"{pool}: {tightest[1]} = {tightest[0]} (set on account {tightest[2]})")
    raise Invalid("body.workers", f"this job can never run: it asks {spec.total_gpus} GPUs at once, more than the "
                                  f"concurrent-GPU limit of account {spec.account} on every pool it may use "
                                  f"({'; '.join(limits)})")


def _budget_hold(session, spec: JobSpec, settings):
    """For create(): refuse a job no concurrent-GPU limit lets run, or one bigger than a whole
    budget period; the reason it is held when this period's budget is short. Works on the
    account chain the cap check read (budgets and whether GPU limits are set ride along), so
    the common case costs no read of its own."""
    from gateway.jobs.schemas import parse_duration_s
    from gateway.ledger import service as ledger

    time_limit_s = parse_duration_s(spec.time_limit) if spec.time_limit else settings.default_time_limit_s

    def hold(chain) -> str | None:
        if any(row.max_gpus is not None or row.has_pool_limits for row in chain):
            _refuse_if_never_admissible(session, spec)  # reads only when a GPU limit is set
        return _held_reason(ledger.budget_verdict_of(session, chain, total_gpus=spec.total_gpus,
                                                     time_limit_s=time_limit_s, gpu_type=spec.gpu_type))

    return hold


def _budget_verdict(session, spec, settings) -> str | None:
    """The same verdict as :func:`_budget_hold`, read on its own (job sets: once per set)."""
    from gateway.jobs.schemas import parse_duration_s
    from gateway.kit.errors import NotFound
    from gateway.ledger import service as ledger

    time_limit_s = parse_duration_s(spec.time_limit) if spec.time_limit else settings.default_time_limit_s
    try:
        verdict = ledger.budget_verdict(session, account=spec.account, total_gpus=spec.total_gpus,
                                        time_limit_s=time_limit_s, gpu_type=spec.gpu_type)
    except NotFound:
        return None  # an unknown account: create() names the field
    return _held_reason(verdict)


def _held_reason(verdict) -> str | None:
    """A budget verdict as create() wants it: None, the reason a job is held, or 422 for never."""
    if verdict is None:
        return None
    if verdict[0] == "never":
        raise Invalid("body.time_limit", f"this job can never run: {verdict[1]}")
    return verdict[1]


def _waiting_reason(request: Request) -> str:
    if not getattr(request.app.state, "backends", None):
        from gateway.pools.router import NO_POOL

        return NO_POOL
    return "waiting for dispatch"


@router.post(
    "", status_code=202, response_model=JobOut, operation_id="submitJob",
    summary="Submit a job",
    description="Record a gang job. It starts in `pending`; the dispatcher routes it to a pool. "
                "With an `Idempotency-Key`, repeating the same request returns the same job (200 on replay), "
                "and reusing the key with a different body is a 409. Caps on waiting jobs per user and per "
                "account, and on new idempotency keys per caller, are checked here: 429 names the limit.",
    responses={200: {"model": JobOut, "description": "Replay of an earlier request with the same Idempotency-Key"},
               **problem_responses(401, 403, 409, 413, 422, 429)},
)
def submit_job(
    principal: CurrentPrincipal,
    session: DbSession,
    request: Request,
    response: Response,
    background: BackgroundTasks,
    spec: Annotated[JobSpec, Body(openapi_examples={"four-node gang": {"summary": "4 x 8 GPUs",
                                                                        "value": EXAMPLE_SPEC}})],
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key", max_length=255,
                                                  description="Client-chosen key making the submission safe to retry.")] = None
) -> JobOut:
    if idempotency_key is not None and not IDEMPOTENCY_KEY_RE.fullmatch(idempotency_key):
        raise Invalid("header.Idempotency-Key", "must be 1-255 printable ASCII characters without spaces")
    settings = request.app.state.settings
    _refuse_system_user(principal, settings)
    _refuse_unknown_pool(session, spec)
    _refuse_if_never_fits(request, spec)
    job, created = service.create(session, principal=principal, spec=spec, idempotency_key=idempotency_key,
                                  default_time_limit_s=settings.default_time_limit_s,
                                  max_time_limit_s=settings.max_time_limit_s, caps=_caps(settings),
                                  waiting_reason=_waiting_reason(request), hold=_budget_hold(session, spec, settings))
    if not created:
        response.status_code = 200
    response.headers["Location"] = f"/v1/jobs/{job.id}"
    _wake_dispatcher(request, background)
    return to_out(job)


@router.get(
    "", response_model=JobPage, operation_id="listJobs", summary="List jobs",
    description="Jobs of the caller's accounts (all jobs for admins), newest first. "
                "Filters combine; `state` may repeat. Follow `next_cursor` for more.",
    responses=problem_responses(401, 422),
)
def list_jobs(
    principal: CurrentPrincipal,
    session: DbSession,
    state: Annotated[list[JobState] | None, Query(description="Only these states (repeatable).")] = None,
    account: Annotated[str | None, Query(pattern=ACCOUNT_NAME_RE)] = None,
    pool: Annotated[str | None, Query(pattern=POOL_CHOICE_RE, max_length=63,
                                      description="Pool asked for or routed to.")] = None,
    backend: Annotated[str | None, Query(pattern=POOL_CHOICE_RE, max_length=63, deprecated=True,
                                         description="Deprecated alias of `pool`.")] = None,
    cursor: Annotated[str | None, Query(max_length=128)] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    job_set: Annotated[str | None, Query(pattern=r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$",
                                         description="Only the tasks of this array or sweep.")] = None
) -> JobPage:
    after = _decode_cursor(cursor) if cursor else None
    jobs = repository.list_readable(session, principal, states=[s.value for s in state or []],
                                    account=account, backend=pool or backend,
                                    after_id=after, limit=limit + 1, job_set=job_set)
    more = len(jobs) > limit
    jobs = jobs[:limit]
    return JobPage(items=[to_out(j) for j in jobs], next_cursor=_encode_cursor(jobs[-1].id) if more else None)


JobId = Annotated[str, Path(pattern=r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$",
                            description="Job id as returned by submitJob.",
                            examples=["0192f0c4-7d3e-7a51-8c3e-5b1f0d9a2c44"])]


@router.get("/{job_id}", response_model=JobOut, operation_id="getJob", summary="Get a job",
            responses=problem_responses(401, 404, 422))
def get_job(principal: CurrentPrincipal, session: DbSession, job_id: JobId) -> JobOut:
    from gateway.flows.graph import dependencies_of, dependents_of

    job = service.get_or_raise(session, principal=principal, job_id=job_id)
    out = to_out(job)
    # null (not []) when there are none: a job outside any workflow reads as it always did.
    out.depends_on = dependencies_of(session, job) or None
    out.dependents = dependents_of(session, job) or None
    return out


@router.post(
    "/{job_id}/cancel", status_code=202, response_model=JobOut, operation_id="cancelJob", summary="Cancel a job",
    description="A pending job is cancelled at once; a submitted job goes to `cancelling` until its "
                "backend confirms. Cancelling a job that is already cancelling is a no-op. "
                "Jobs waiting for it are cancelled too only with `cascade=true` (otherwise their "
                "dependency decides: `succeeded` can then never be met and cancels them, `finished` is met).",
    responses=problem_responses(401, 404, 409, 422),
)
def cancel_job(principal: CurrentPrincipal, session: DbSession, job_id: JobId, request: Request,
               background: BackgroundTasks,
               cascade: Annotated[bool, Query(description="Also cancel every job waiting for this one.")] = False
               ) -> JobOut:
    job = service.cancel(session, principal=principal, job_id=job_id, cascade=cascade)
    _wake_dispatcher(request, background)
    return to_out(job)


@router.get("/{job_id}/events", response_model=JobEventPage, operation_id="listJobEvents",
            summary="A job's history", description="Every state change and decision, oldest first.",
            responses=problem_responses(401, 404, 422))
def list_job_events(principal: CurrentPrincipal, session: DbSession, job_id: JobId, after: Annotated[int, Query(ge=0, le=2**62)] = 0,
                    limit: Annotated[int, Query(ge=1, le=1000)] = 500) -> JobEventPage:
    job = service.get_or_raise(session, principal=principal, job_id=job_id)
    events = repository.list_events(session, job.id, after_id=after, limit=limit)
    return JobEventPage(items=[JobEventOut(
        id=e.id, job_id=e.job_id, at=as_utc(e.at), actor=e.actor, kind=e.kind,
        from_state=JobState(e.from_state) if e.from_state else None,
        to_state=JobState(e.to_state) if e.to_state else None, reason=e.reason or "", data=e.data,
    ) for e in events])


_LOG_RESPONSES = {200: {"description": "The worker's output (stdout and stderr), as the job wrote it.",
                        "content": {"text/plain": {"schema": {"type": "string"}}}},
                  **problem_responses(401, 404, 409, 422, 501, 503)}


@router.get(
    "/{job_id}/logs", operation_id="getJobLogs", summary="A job's output, per worker",
    description="The output (stdout and stderr) of one worker of the job, streamed as it is read. "
                "`tail` starts at the last N lines; `follow=true` keeps the stream open and sends new "
                "output until the job has ended. 409 while the job has no output yet "
                "(pending, or its worker has not started); 501 when its pool's output cannot be read "
                "by the gateway (docs/logs.md).",
    response_class=StreamingResponse, responses=_LOG_RESPONSES,
)
def get_job_logs(
    principal: CurrentPrincipal, session: DbSession, request: Request, job_id: JobId,
    worker: Annotated[int, Query(ge=0, le=100_000, description="Worker index, 0 to workers-1.")] = 0,
    tail: Annotated[int | None, Query(ge=1, le=1_000_000, description="Only the last N lines.")] = None,
    follow: Annotated[bool, Query(description="Keep sending new output until the job ends.")] = False,
) -> StreamingResponse:
    from gateway.jobs import logs

    job = service.get_or_raise(session, principal=principal, job_id=job_id)
    sessions = request.app.state.sessionmaker

    def job_final() -> bool:
        with sessions() as s:
            return s.get(Job, job_id).state in logs.FINAL_STATES

    body = logs.open_output(getattr(request.app.state, "backends", None) or {}, job, worker,
                            keep_dir=request.app.state.settings.output_keep_dir, tail=tail, follow=follow,
                            job_final=job_final)
    return StreamingResponse(body, media_type="text/plain; charset=utf-8",
                             headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})


events_router = APIRouter(prefix="/v1/events", tags=["jobs"])


@events_router.get(
    "/stream", operation_id="streamJobEvents", summary="Live events of all your jobs (server-sent events)",
    description="A `text/event-stream` of every event (state changes and decisions) of the jobs the caller "
                "may read, in order. Each message has `id` (the event id), `event: job` and `data` (the "
                "event as JSON, with the job's account). Reconnect with `Last-Event-ID` (or `after`) to "
                "resume without losing or repeating an event; without either, the stream starts now. "
                "A comment line is sent after a silence (heartbeat); the stream ends after a while and "
                "the client reconnects (docs/logs.md).",
    response_class=StreamingResponse,
    responses={200: {"description": "Server-sent events", "content": {"text/event-stream": {"schema": {"type": "string"}}}},
               **problem_responses(401, 422)},
)
async def stream_job_events(
    principal: CurrentPrincipal, request: Request,
    after: Annotated[int | None, Query(ge=0, le=2**62, description="Resume after this event id.")] = None,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID", max_length=20,
                                                description="Sent by EventSource when it reconnects.")] = None,
) -> StreamingResponse:
    from gateway.jobs import events

    if last_event_id is not None:
        if not re.fullmatch(r"[0-9]{1,19}", last_event_id):
            raise Invalid("header.Last-Event-ID", "must be an event id sent by this stream")
        after = int(last_event_id)
    settings = request.app.state.settings
    body = events.sse(events.get_hub(request.app), principal, after_id=after,
                      max_stream_s=settings.events_max_stream_s)
    return StreamingResponse(body, media_type="text/event-stream",
                             headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})
