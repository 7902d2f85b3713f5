"""Names shared by the dispatcher's modules: actors, the followed states, the submit request."""

from __future__ import annotations

import logging

from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import object_session

from adapters.base import SubmitRequest
from gateway.accounts.models import Account
from gateway.jobs.models import Job
from gateway.jobs.schemas import parse_memory_mib
from gateway.jobs.states import JobState
from gateway.kit.timeutil import as_utc

log = logging.getLogger("isthmus.dispatch")

ACTOR = "system:dispatcher"
RECONCILER = "system:reconciler"

FOLLOWED = (JobState.QUEUED, JobState.STARTING, JobState.RUNNING, JobState.REQUEUED, JobState.CANCELLING)


def _is_deadlock(exc: OperationalError) -> bool:
    return getattr(getattr(exc, "orig", None), "sqlstate", None) == "40P01"


def submit_request(job: Job, *, first_attempt: bool = False) -> SubmitRequest:
    spec = job.spec
    # The backend priority class is the account's (an admin setting), never the user's choice.
    account = object_session(job).get(Account, job.account_name)
    return SubmitRequest(
        gateway_job_id=job.id, name=job.name, account=job.account_name, user=job.username,
        # A gang charged for whole nodes gets every GPU of them (held_gpus, set at the claim):
        # without --gres, Slurm's --exclusive blocks the node's GPUs but gives the job none.
        command=list(spec["command"]), workers=job.workers,
        gpus_per_worker=max(job.gpus_per_worker, (job.held_gpus or 0) // max(job.workers, 1)),
        cpus_per_worker=int(spec.get("cpus_per_worker", 1)),
        memory_mib_per_worker=parse_memory_mib(spec.get("memory_per_worker", "4Gi")),
        time_limit_s=job.time_limit_s, image=spec.get("image"), gpu_type=spec.get("gpu_type"),
        env=dict(spec.get("env") or {}), labels=dict(spec.get("labels") or {}), priority=job.priority,
        priority_class=account.priority_class if account is not None else None,
        first_attempt=first_attempt, submitted_after=as_utc(job.created_at),
    )

