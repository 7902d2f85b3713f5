"""HTTP only: /v1/jobs. Routes validate, call the service, shape the answer."""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import re
from types import SimpleNamespace
from typing import Annotated, Any

from fastapi import (
    APIRouter,
    BackgroundTasks,
    Body,
    Header,
    Path,
    Query,
    Request,
    Response,
)
from fastapi.responses import StreamingResponse
from pydantic import Field
from pydantic_core import PydanticSerializationError, to_json, to_jsonable_python
from sqlalchemy.orm import Session

from gateway.domain.shapes import format_duration
from gateway.domain.states import JobState
from gateway.identity.dependency import CurrentPrincipal, PrincipalOrJob
from gateway.jobs import (
    admission,
    checkpoints,
    intake,
    preemption,
    reads,
    repository,
    service,
)
from gateway.jobs.responses import (
    AttemptOut,
    CheckpointOut,
    JobEventOut,
    JobEventPage,
    JobOut,
    JobPage,
    PreemptionOut,
)
from gateway.jobs.schemas import EXAMPLE_SPEC, POOL_CHOICE_RE, CheckpointIn, JobSpec
from gateway.kit.db import DbSession, in_read, in_transaction
from gateway.kit.errors import Invalid, NotFound, problem_responses
from gateway.kit.groupcommit import GroupCommit
from gateway.kit.names import ACCOUNT_NAME_RE
from gateway.kit.query import QueryModel, openapi_parameters, read_query
from gateway.kit.streams import HeldStreamingResponse
from gateway.kit.timeutil import as_utc, utcnow
from gateway.kit.unicode import JSONResponse
from gateway.models.jobs import Job
from gateway.models.specs import checkpoint_dir_of, spec_of

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

IDEMPOTENCY_KEY_RE = re.compile(r"^[\x21-\x7e]{1,255}$")


def job_fields(job: Job, session: Session | None = None) -> dict[str, Any]:
    """The job's fields of JobOut (the rest keep their defaults): the one shaping of a job for
    the API, for ``to_out`` and for the list, which sends them without building models.
    ``job``: an ORM object or a row of ``repository.SHOWN``; ``session``: for a set task's spec."""
    spec = spec_of(job, session)
    return dict(
        id=job.id, name=job.name, account=job.account_name, user=job.username, submitted_by=job.submitted_by,
        pool=job.requested_pool, pool_kind=spec.get("pool_kind"), assigned_pool=job.pool,
        backend=job.requested_pool, assigned_backend=job.pool, state=job.state,
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
        mounts=spec.get("mounts") or None, attempt=job.attempt or 1, borrowed=job.borrowed,
        checkpoint_at=as_utc(job.checkpoint_at), gpu_hours_at_risk=checkpoints.at_risk(job), **_estimate(job),
    )


def to_out(job: Job) -> JobOut:
    return JobOut(**job_fields(job))


# Every field of JobOut in its order, at its default: a listed job is these, updated with its
# fields, so that its JSON has JobOut's keys in JobOut's order (tests/api/test_list_json.py).
_JOB_OUT = {name: None if f.is_required() else f.get_default(call_default_factory=True)
            for name, f in JobOut.model_fields.items()}


def page_response(session: Session, rows: list, next_cursor: str | None) -> Response:
    """Rows of ``repository.SHOWN_AS_TEXT`` as JobPage's JSON, without a model per row (issue #46):
    read from the registry, they were validated when they were written.

    Each job's JSON is written by pydantic's serializer (``_job_json``), the bytes FastAPI's
    serialization of the model wrote (json.dumps of its JSON values), and kept by the values it
    was made from. A float below 1e-4 is the exception (Python writes ``5e-05``, pydantic
    ``0.00005``): a page holding a sweep's parameters, the one place such a float could be, takes
    the longer path, as does a string no UTF-8 encoder takes (a lone surrogate stored before
    bodies were checked, kit/unicode.py)."""
    made = [_job_json(r, session) for r in rows]
    if None not in made:
        return Response(b'{"items":[' + b",".join(made) + b'],"next_cursor":' + to_json(next_cursor) + b"}",
                        media_type="application/json")
    page = {"items": [{**_JOB_OUT, **job_fields(_decoded(r), session)} for r in rows], "next_cursor": next_cursor}
    try:
        return JSONResponse(to_jsonable_python(page))
    except (UnicodeEncodeError, PydanticSerializationError):  # a surrogate in a key: the models' own way
        return JSONResponse({"items": [JobOut(**i).model_dump(mode="json") for i in page["items"]],
                             "next_cursor": next_cursor})


# Listed jobs' JSON by the values it was made from: a row's columns, its JSON ones as stored text
# (job_fields is a function of them, and of the set's template for a set's task, which never
# changes). Lists are polled and most of their jobs do not change between two polls: a job seen
# before costs a look-up (issue #46). A running job's GPU-hours at risk grow with the clock: not
# kept. Per process, the oldest dropped beyond _JSON_KEPT (about 1 KB each).
_JSON_OF: dict[tuple, bytes] = {}
_JSON_KEPT = 20_000


def _job_json(row, session: Session) -> bytes | None:
    """The job's JSON in a list; None where the page must take the longer path."""
    key = tuple(row)
    made = _JSON_OF.get(key)
    if made is not None:
        return made
    fields = {**_JOB_OUT, **job_fields(_decoded(row), session)}
    if fields["parameters"]:
        return None
    try:
        made = to_json(fields)
    except PydanticSerializationError:
        return None
    if row.state != JobState.RUNNING.value:
        while len(_JSON_OF) >= _JSON_KEPT:
            try:
                _JSON_OF.pop(next(iter(_JSON_OF)))
            except (StopIteration, KeyError, RuntimeError):  # another thread dropped it first
                break
        _JSON_OF[key] = made
    return made


def _decoded(row) -> SimpleNamespace:
    """A row of ``repository.SHOWN_AS_TEXT`` as ``job_fields`` reads a job: its JSON decoded."""
    return SimpleNamespace(**row._asdict(), spec=json.loads(row.spec_text),
                           nodes=json.loads(row.nodes_text) if row.nodes_text is not None else None)


def with_checkpoint_dir(out: JobOut, job: Job, request: Request) -> JobOut:
    """``out`` with the job's checkpoint directory (getJob, submitJob): docs/storage.md."""
    out.checkpoint_dir = checkpoint_dir_of(job, getattr(request.app.state, "storage", None))
    return out


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


def _submissions(state) -> GroupCommit:
    """This worker's group commit of submissions (one per event loop)."""
    loop = asyncio.get_running_loop()
    held = getattr(state, "submissions", None)
    if held is None or held[0] is not loop:
        async def run(items: list[intake.Submission]) -> list:
            try:
                return await in_transaction(state.db, lambda session: admission.record_jobs(session, state.admission,
                                                                                       items))
            except intake.RefusedWhileWriting as exc:
                if len(items) == 1:
                    return [exc.refusal]  # rolled back: nothing of it is kept
                raise  # the group commit re-runs each member alone

        held = state.submissions = (loop, GroupCommit(run))
    return held[1]


def _wake_dispatcher(request: Request, background: BackgroundTasks) -> None:
    # Background tasks run after the response, hence after the commit: the round sees the job.
    dispatcher = getattr(request.app.state, "dispatcher", None)
    if dispatcher is not None:
        background.add_task(_wake, dispatcher)


async def _wake(dispatcher) -> None:
    dispatcher.wake()  # sets two events: no thread-pool hop for it (issue #32)


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
async def submit_job(
    principal: CurrentPrincipal,
    request: Request,
    response: Response,
    background: BackgroundTasks,
    spec: Annotated[JobSpec, Body(openapi_examples={"four-node gang": {"summary": "4 x 8 GPUs",
                                                                        "value": EXAMPLE_SPEC}})],
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key", max_length=255,
                                                  description="Client-chosen key making the submission safe to retry.")] = None
) -> JobOut | Response:
    if idempotency_key is not None and not IDEMPOTENCY_KEY_RE.fullmatch(idempotency_key):
        raise Invalid("header.Idempotency-Key", "must be 1-255 printable ASCII characters without spaces")
    # The transaction is not DbSession's (issue #32): the submission joins its worker's group
    # commit (kit/groupcommit.py), which records every submission waiting for it in one
    # transaction and commits before any answer is built. On Postgres it runs on the event
    # loop (kit/db.py in_transaction): no thread-pool hop.
    await admission.look_up_user(principal)
    job, created = await _submissions(request.app.state).submit(
        intake.Submission(principal=principal, spec=spec, idempotency_key=idempotency_key))
    status = 202 if created else 200
    _wake_dispatcher(request, background)
    made = one_job_json(job, getattr(request.app.state, "storage", None))
    if made is not None:  # JobOut's JSON without a model and FastAPI's second pass over it (issue #46)
        return Response(made, status_code=status, media_type="application/json",
                        headers={"Location": f"/v1/jobs/{job.id}"}, background=background)
    response.status_code = status
    response.headers["Location"] = f"/v1/jobs/{job.id}"
    return with_checkpoint_dir(to_out(job), job, request)


JOB_SET_RE = r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"


class JobListQuery(QueryModel):
    """listJobs' query parameters, validated in one call (kit/query.py; issue #46)."""

    state: list[JobState] | None = Field(None, description="Only these states (repeatable).")
    account: str | None = Field(None, pattern=ACCOUNT_NAME_RE)
    pool: str | None = Field(None, pattern=POOL_CHOICE_RE, max_length=63, description="Pool asked for or routed to.")
    backend: str | None = Field(None, pattern=POOL_CHOICE_RE, max_length=63, description="Deprecated alias of `pool`.",
                                json_schema_extra={"deprecated": True})
    cursor: str | None = Field(None, max_length=128)
    limit: int = Field(50, ge=1, le=500)
    job_set: str | None = Field(None, pattern=JOB_SET_RE, description="Only the tasks of this array or sweep.")


@router.get(
    "", response_model=JobPage, operation_id="listJobs", summary="List jobs",
    description="Jobs of the caller's accounts (all jobs for admins), newest first. "
                "Filters combine; `state` may repeat. Follow `next_cursor` for more.",
    responses=problem_responses(401, 422),
    openapi_extra={"parameters": openapi_parameters(JobListQuery)},
)
async def list_jobs(principal: CurrentPrincipal, request: Request) -> Response:
    q = read_query(request, JobListQuery)
    after = _decode_cursor(q.cursor) if q.cursor else None

    def page(session: Session) -> Response:
        jobs = reads.list_readable(session, principal, states=[s.value for s in q.state or []],
                                   account=q.account, pool=q.pool or q.backend, after_id=after, limit=q.limit + 1,
                                   job_set=q.job_set, columns="shown")
        more = len(jobs) > q.limit
        jobs = jobs[:q.limit]
        return page_response(session, jobs, _encode_cursor(jobs[-1].id) if more else None)

    # Read without a transaction, in one thread-pool hop (kit/db.py in_read), sent as built: the
    # page is JobPage's JSON already (issue #46).
    return await in_read(request.app.state.db, page)


JobId = Annotated[str, Path(pattern=r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$",
                            description="Job id as returned by submitJob.",
                            examples=["0192f0c4-7d3e-7a51-8c3e-5b1f0d9a2c44"])]


@router.get("/{job_id}", response_model=JobOut, operation_id="getJob", summary="Get a job",
            responses=problem_responses(401, 404, 422))
async def get_job(principal: CurrentPrincipal, job_id: JobId, request: Request) -> JobOut:
    # Read without a transaction, in one thread-pool hop (kit/db.py in_read; issue #46).
    return await in_read(request.app.state.db, lambda session: _one_job(session, principal, job_id, request))


def _one_job(session: Session, principal, job_id: str, request: Request) -> JobOut | Response:
    """One job as ``_job_view`` shows it. Most jobs (not a set's task, no dependency either way,
    first attempt, not borrowed) are one statement and JobOut's JSON made as the list makes
    it, with no model (issue #46); the others, and a job whose JSON the list's way would not
    write as the model does, take ``_job_view``."""
    row = reads.one(session, principal, job_id)
    if row is None:
        raise NotFound(f"no job {job_id!r} visible to you")
    if row.job_set_id or row.has_dependencies or row.has_dependents or (row.attempt or 1) > 1 or row.borrowed:
        return _job_view(session, principal, job_id, request)
    job = _decoded(row)
    job.checkpoint_lineage = row.lineage or row.id
    made = one_job_json(job, getattr(request.app.state, "storage", None), session)
    if made is not None:
        return Response(made, media_type="application/json")
    return _job_view(session, principal, job_id, request)


def one_job_json(job, storage, session: Session | None = None) -> bytes | None:
    """JobOut's JSON of one job as getJob and submitJob answer it when it has no workflow
    fields to add, written as the list writes a job (no model); None where the model's way
    must write it: a sweep's parameters (see ``page_response``), a lone surrogate."""
    fields = {**_JOB_OUT, **job_fields(job, session)}
    if fields["parameters"]:
        return None
    fields["checkpoint_dir"] = checkpoint_dir_of(job, storage)
    try:
        return to_json(fields)
    except PydanticSerializationError:
        return None


def _job_view(session: Session, principal, job_id: str, request: Request) -> JobOut:
    from gateway.jobs.graph import dependencies_of, dependents_of

    job = service.get_or_raise(session, principal=principal, job_id=job_id)
    out = with_checkpoint_dir(to_out(job), job, request)
    # null (not []) when there are none: a job outside any workflow reads as it always did.
    out.depends_on = dependencies_of(session, job, principal=principal) or None
    out.dependents = dependents_of(session, job, principal=principal) or None
    out.attempts = attempts_out(service.attempts_of(session, job.id)) if job.attempt > 1 else None
    stopping = preemption.current(session, job) if job.borrowed else None
    if stopping is not None:
        out.preemption = PreemptionOut(
            preemptor_id=stopping.preemptor_id, preemptor_account=stopping.preemptor_account, pool=stopping.pool,
            reason=stopping.reason, gpu_hours_at_risk=round(stopping.gpu_hours_at_risk, 4),
            chosen_at=as_utc(stopping.chosen_at), deadline=as_utc(stopping.deadline),
            signalled_at=as_utc(stopping.signalled_at), stopped_at=as_utc(stopping.stopped_at))
    return out


@router.post(
    "/{job_id}/checkpoints", status_code=201, response_model=CheckpointOut, operation_id="reportCheckpoint",
    summary="Report a committed checkpoint",
    description="A running job says it has committed a checkpoint: from then on only the work since it is at "
                "risk when the gateway chooses which borrowed jobs to stop (docs/recovery.md). Called from "
                "inside the job with its job credential (`ISTHMUS_JOB_TOKEN`, good for this call of this job's "
                "current attempt only), or by anyone who may read the job. 409 when the job is not running "
                "or the credential is an earlier attempt's.",
    responses=problem_responses(401, 404, 409, 413, 422),
)
def report_checkpoint(caller: PrincipalOrJob, session: DbSession, job_id: JobId,
                      body: Annotated[CheckpointIn | None, Body()] = None) -> CheckpointOut:
    body = body or CheckpointIn()
    if isinstance(caller, tuple):  # a job credential the middleware checked for this very job
        job = repository.get_for_update(session, job_id)
        if job is None:
            raise NotFound(f"no job {job_id!r}")
        attempt, actor = caller[1], f"job:{job_id}"
    else:
        job = service.get_or_raise(session, principal=caller, job_id=job_id, for_update=True)
        attempt, actor = None, caller.subject
    checkpoints.report(session, job, attempt=attempt, at=utcnow(), actor=actor, step=body.step, note=body.note)
    return CheckpointOut(job_id=job.id, attempt=job.attempt, checkpoint_at=as_utc(job.checkpoint_at), step=body.step)


def attempts_out(attempts) -> list[AttemptOut]:
    return [AttemptOut(number=a.number, pool=a.pool, backend_job_id=a.backend_job_id, nodes=a.nodes,
                       started_at=as_utc(a.started_at), ended_at=as_utc(a.ended_at), outcome=a.outcome,
                       exit_code=a.exit_code, reason=a.reason or "",
                       charged_gpu_hours=round(a.charged_gpu_seconds / 3600, 6)) for a in attempts]


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
                  **problem_responses(401, 404, 409, 422, 429, 501, 503)}


@router.get(
    "/{job_id}/logs", operation_id="getJobLogs", summary="A job's output, per worker",
    description="The output (stdout and stderr) of one worker of the job, streamed as it is read. "
                "`tail` starts at the last N lines; `follow=true` keeps the stream open and sends new "
                "output until the job has ended. 409 while the job has no output yet "
                "(pending, or its worker has not started); 501 when its pool's output cannot be read "
                "by the gateway (docs/logs.md), or the file there is not a plain file of the job's own (a link, a "
                "FIFO: 409 output-refused). Every read, plain or follow, counts as one of the caller's open "
                "streams while it runs: 429 beyond the limit per caller, 503 when the gateway's stream budget "
                "is spent.",
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
            return repository.is_final(s, job_id, logs.FINAL_STATES)

    # Every read is a stream: it counts against the caller's open streams (docs/logs.md).
    body, permit = logs.open_held(request.app.state.streams, principal.subject,
                                  getattr(request.app.state, "backends", None) or {}, job, worker,
                                  keep_dir=request.app.state.settings.output_keep_dir, tail=tail, follow=follow,
                                  job_final=job_final)
    return HeldStreamingResponse(body, permit=permit, media_type="text/plain; charset=utf-8",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})


events_router = APIRouter(prefix="/v1/events", tags=["jobs"])


@events_router.get(
    "/stream", operation_id="streamJobEvents", summary="Live events of all your jobs (server-sent events)",
    description="A `text/event-stream` of every event (state changes and decisions) of the jobs the caller "
                "may read, in order. Each message has `id` (the event id), `event: job` and `data` (the "
                "event as JSON, with the job's account). Reconnect with `Last-Event-ID` (or `after`) to "
                "resume without losing or repeating an event; without either, the stream starts now. "
                "A comment line is sent after a silence (heartbeat); the stream ends after a while and "
                "the client reconnects (docs/logs.md). 429 beyond the caller's limit of open streams (log "
                "follows and /ui/events count too), 503 when the gateway's stream budget is spent.",
    response_class=StreamingResponse,
    responses={200: {"description": "Server-sent events", "content": {"text/event-stream": {"schema": {"type": "string"}}}},
               **problem_responses(401, 422, 429, 503)},
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
    permit = request.app.state.streams.acquire(principal.subject)  # 429 / 503 (docs/logs.md)
    body = events.sse(request.app.state.event_hubs.current(), principal, after_id=after,
                      max_stream_s=settings.events_max_stream_s)
    return HeldStreamingResponse(body, permit=permit, media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})
