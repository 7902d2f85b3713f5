"""HTTP only: /v1/job-sets (arrays and sweeps)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, BackgroundTasks, Body, Path, Query, Request, Response

from gateway.api.jobs import _wake_dispatcher, to_out
from gateway.domain.states import JobState
from gateway.flows import service
from gateway.flows.schemas import JobSetOut, JobSetSpec
from gateway.identity.dependency import CurrentPrincipal
from gateway.jobs.responses import JobPage
from gateway.kit.db import DbSession
from gateway.kit.errors import problem_responses
from gateway.kit.timeutil import as_utc
from gateway.models.flows import JobSet

router = APIRouter(prefix="/v1/job-sets", tags=["job sets"])

SetId = Annotated[str, Path(pattern=r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$",
                            description="Job set id as returned by submitJobSet.")]

EXAMPLES = {
    "array": {"summary": "100 tasks, at most 4 at once",
              "value": {"name": "shards", "account": "team-a", "command": ["python", "shard.py", "{{ index }}"],
                        "gpus_per_worker": 1, "array": {"count": 100, "max_running": 4}}},
    "sweep": {"summary": "2 x 2 grid", "value": JobSetSpec.model_config["json_schema_extra"]["examples"][0]},
}


def to_set_out(session, job_set: JobSet) -> JobSetOut:
    return JobSetOut(id=job_set.id, name=job_set.name, account=job_set.account_name,
                     submitted_by=job_set.submitted_by, kind=job_set.kind, task_count=job_set.task_count,
                     max_running=job_set.max_running, sweep=job_set.sweep,
                     counts={JobState(s): n for s, n in service.counts(session, job_set.id).items()},
                     created_at=as_utc(job_set.created_at))


@router.post(
    "", status_code=202, response_model=JobSetOut, operation_id="submitJobSet", summary="Submit an array or a sweep",
    description="Record every task of an array (`array.count` copies) or a sweep (one task per combination of "
                "`sweep` values, substituted as `{{ name }}` into `command` items and `env` values) in one "
                "transaction. Each task is a job with its own id. With `array.max_running`, tasks beyond it wait "
                "in `blocked`. Limits: ISTHMUS_MAX_ARRAY_TASKS, ISTHMUS_MAX_SWEEP_POINTS (422 naming the field); "
                "each task counts against the caps on waiting jobs (429).",
    responses=problem_responses(401, 403, 413, 422, 429),
)
def submit_job_set(principal: CurrentPrincipal, session: DbSession, request: Request, response: Response,
                   background: BackgroundTasks,
                   spec: Annotated[JobSetSpec, Body(openapi_examples=EXAMPLES)]) -> JobSetOut:
    job_set = service.record_set(session, request.app.state.admission, principal, spec)
    response.headers["Location"] = f"/v1/job-sets/{job_set.id}"
    _wake_dispatcher(request, background)
    return to_set_out(session, job_set)


@router.get("/{set_id}", response_model=JobSetOut, operation_id="getJobSet", summary="A job set and its counts",
            responses=problem_responses(401, 404, 422))
def get_job_set(principal: CurrentPrincipal, session: DbSession, set_id: SetId) -> JobSetOut:
    return to_set_out(session, service.get_set_or_raise(session, principal=principal, set_id=set_id))


@router.get("/{set_id}/tasks", response_model=JobPage, operation_id="listJobSetTasks",
            summary="A job set's tasks", description="In index order; follow `next_cursor` (an index) for more.",
            responses=problem_responses(401, 404, 422))
def list_job_set_tasks(principal: CurrentPrincipal, session: DbSession, set_id: SetId,
                       state: Annotated[list[JobState] | None, Query(description="Only these states.")] = None,
                       cursor: Annotated[str | None, Query(pattern=r"^[0-9]{1,6}$")] = None,
                       limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> JobPage:
    job_set = service.get_set_or_raise(session, principal=principal, set_id=set_id)
    tasks = service.list_tasks(session, job_set.id, after_index=int(cursor) if cursor else -1, limit=limit + 1,
                               states=[s.value for s in state or []])
    more = len(tasks) > limit
    tasks = tasks[:limit]
    return JobPage(items=[to_out(t) for t in tasks], next_cursor=str(tasks[-1].array_index) if more else None)


@router.post("/{set_id}/cancel", status_code=202, response_model=JobSetOut, operation_id="cancelJobSet",
             summary="Cancel a job set",
             description="Every task not yet ended: waiting (`blocked`, `pending`) tasks are cancelled at once, "
                         "submitted ones go to `cancelling` until their backend confirms.",
             responses=problem_responses(401, 404, 422))
def cancel_job_set(principal: CurrentPrincipal, session: DbSession, set_id: SetId, request: Request,
                   background: BackgroundTasks) -> JobSetOut:
    job_set = service.cancel_set(session, principal=principal, set_id=set_id)
    _wake_dispatcher(request, background)
    return to_set_out(session, job_set)
