"""Names shared by the dispatcher's modules: actors, the followed states, the submit request."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import object_session

from adapters.base import SubmitRequest, TopologyRequest, VolumeMount
from gateway.domain.shapes import parse_memory_mib
from gateway.domain.states import JobState
from gateway.domain.storage import NO_STORAGE, Catalog, env_of, mounts_of
from gateway.kit.timeutil import as_utc
from gateway.models.accounts import Account
from gateway.models.jobs import Job
from gateway.models.specs import spec_of

log = logging.getLogger("isthmus.dispatch")

ACTOR = "system:dispatcher"
RECONCILER = "system:reconciler"

FOLLOWED = (JobState.QUEUED, JobState.STARTING, JobState.RUNNING, JobState.REQUEUED, JobState.CANCELLING)


def _is_deadlock(exc: OperationalError) -> bool:
    return getattr(getattr(exc, "orig", None), "sqlstate", None) == "40P01"


def volume_mounts(job: Job, spec: dict, pool: str | None, storage: Catalog) -> tuple[list[VolumeMount], dict]:
    """(What the job's pool mounts for it, the variables naming its directories): the job's
    mounts and checkpoint as ``pool`` provides each storage (docs/storage.md). Routing sent
    the job only to a pool that provides every storage it needs; a storage the pool lost
    since (a new pools file) is left out here, and the job fails on its missing directory."""
    if not (spec.get("mounts") or spec.get("checkpoint")):
        return [], {}
    mounts = mounts_of(spec, storage, job.account_name, job.checkpoint_lineage)
    out = []
    for m in mounts:
        provision = storage.storages[m.storage].pools.get(pool or "")
        if provision is None:
            continue
        out.append(VolumeMount(storage=m.storage, path=m.path, root=storage.storages[m.storage].path,
                               sub_path=m.sub_path, read_only=m.read_only, provider=provision.provider,
                               claim=provision.claim, server=provision.server, source_path=provision.source_path,
                               create=bool(m.sub_path) and not m.read_only))
    return out, env_of(mounts)


@dataclasses.dataclass(frozen=True)
class Launch:
    """What every job the dispatcher submits gets besides its spec: the pools file's storages,
    the preemption grace period, and the credential and URL of its checkpoint reports."""

    storage: Catalog = NO_STORAGE
    preempt_grace_s: float = 0
    job_api_url: str = ""
    credentials: Any = None  # gateway.jobs.checkpoints.JobCredentials
    nodes: Any = None  # gateway.dispatch.nodes.NodeWatch: the nodes a gang avoids

    def prime(self) -> None:
        """Before a transaction that builds submit requests (the credential key's first read)."""
        if self.credentials is not None:
            self.credentials.prime()

    def env(self, job: Job) -> dict[str, str]:
        out = {}
        if self.preempt_grace_s:
            # How long the job has between a preemption signal and its stop (docs/recovery.md).
            out["ISTHMUS_PREEMPT_GRACE_S"] = str(int(self.preempt_grace_s))
        if self.credentials is not None:
            out["ISTHMUS_JOB_ID"] = job.id
            out["ISTHMUS_JOB_TOKEN"] = self.credentials.token(job.id, job.attempt or 1)
            if self.job_api_url:
                out["ISTHMUS_URL"] = self.job_api_url
        return out


NO_LAUNCH = Launch()


def submit_request(job: Job, *, first_attempt: bool = False, pool: str | None = None,
                   launch: Launch = NO_LAUNCH) -> SubmitRequest:
    """What the job's pool (``pool``, else the job's own) is asked to run."""
    spec = spec_of(job)
    # The backend priority class is the account's (an admin setting), never the user's choice.
    account = object_session(job).get(Account, job.account_name)
    mounts, storage_env = volume_mounts(job, spec, pool or job.pool, launch.storage)
    return SubmitRequest(
        gateway_job_id=job.id, name=job.name, account=job.account_name, user=job.username,
        # A gang charged for whole nodes gets every GPU of them (held_gpus, set at the claim):
        # without --gres, Slurm's --exclusive blocks the node's GPUs but gives the job none.
        command=list(spec["command"]), workers=job.workers,
        gpus_per_worker=max(job.gpus_per_worker, (job.held_gpus or 0) // max(job.workers, 1)),
        cpus_per_worker=int(spec.get("cpus_per_worker", 1)),
        memory_mib_per_worker=parse_memory_mib(spec.get("memory_per_worker", "4Gi")),
        time_limit_s=job.time_limit_s, image=spec.get("image"), gpu_type=spec.get("gpu_type"),
        # ISTHMUS_ATTEMPT: which attempt this is (1, then 2, ... after a retry; docs/recovery.md).
        env={**(spec.get("env") or {}), **storage_env, "ISTHMUS_ATTEMPT": str(job.attempt or 1), **launch.env(job)},
        labels=dict(spec.get("labels") or {}), priority=job.priority,
        priority_class=account.priority_class if account is not None else None,
        first_attempt=first_attempt, submitted_after=as_utc(job.created_at), mounts=tuple(mounts),
        attempt=job.attempt or 1, preempt_grace_s=int(launch.preempt_grace_s),
        # Only on the pool it was claimed for: a reservation is one backend's.
        reservation=job.backend_reservation if (pool or job.pool) == job.pool else None,
        topology=topology_request(spec.get("topology")),
        exclude_nodes=launch.nodes.excluded(object_session(job), job, pool or job.pool or "") if launch.nodes else (),
    )


def topology_request(kept: dict | None) -> TopologyRequest | None:
    """The stored spec's ``topology`` as the adapters take it."""
    if not kept:
        return None
    return TopologyRequest(level=kept.get("required") or kept.get("preferred") or "", required=bool(kept.get("required")))


def first_attempt(job: Job, recovering: bool) -> bool:
    """Whether this submission can be the job's first: the first claim of a job is the only one
    that can have submitted it; a retry or a recovery must let the adapter look for an earlier
    submission."""
    return job.dispatch_attempts == 1 and not recovering and job.state == JobState.DISPATCHING.value
