"""What the job API returns (pydantic v2): a job, its attempts, preemptions and checkpoints,
its events, and their pages. Cut out of ``schemas.py`` (issue #46), which keeps what users
send (the job spec and its parts) and the limits a user can understand."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gateway.domain.states import JobState
from gateway.jobs.schemas import EXAMPLE_SPEC, PoolKind


class AttemptOut(BaseModel):
    """One ended attempt at a job: where it ran and why it ended."""

    number: int
    pool: str | None
    backend_job_id: str | None
    nodes: list[str] | None
    started_at: datetime | None = Field(description="null: it ended before the whole gang started.")
    ended_at: datetime
    outcome: str = Field(description="Why the attempt ended: `node_failure`, `preempted` (the gateway reclaimed "
                                     "its borrowed GPUs, or its backend preempted or evicted it) or `exit_code`.")
    exit_code: int | None
    reason: str = Field(description="The backend's words.")
    charged_gpu_hours: float = Field(description="What the attempt's run was charged (0 for one that never "
                                                 "started); queue time never is.")


class PreemptionOut(BaseModel):
    """The gateway chose to stop the job's current attempt to reclaim borrowed GPUs (docs/recovery.md)."""

    preemptor_id: str | None = Field(description="The job, within its guarantee, that the GPUs go to.")
    preemptor_account: str
    pool: str
    reason: str
    gpu_hours_at_risk: float = Field(description="GPU-hours since its last checkpoint report when it was chosen.")
    chosen_at: datetime
    deadline: datetime = Field(description="When it is stopped: the signal's time plus the grace period.")
    signalled_at: datetime | None
    stopped_at: datetime | None


class CheckpointOut(BaseModel):
    job_id: str
    attempt: int
    checkpoint_at: datetime
    step: int | None


class JobOut(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [{
        "id": "0192f0c4-7d3e-7a51-8c3e-5b1f0d9a2c44", "state": "pending", "state_reason": "waiting for dispatch",
        **{k: EXAMPLE_SPEC[k] for k in ("name", "account", "command", "workers", "gpus_per_worker")},
        "total_gpus": 32,
    }]})

    id: str
    name: str
    account: str
    user: str = Field(description="POSIX user the job runs as.")
    submitted_by: str
    pool: str = Field(description="The pool asked for, or `auto`.")
    pool_kind: PoolKind | None = Field(default=None, description="The pool kind asked for, if any.")
    assigned_pool: str | None = Field(default=None, description="The pool the job was routed to (null until "
                                                                "dispatched).")
    backend: str = Field(deprecated=True, description="Deprecated: `pool`.")
    assigned_backend: str | None = Field(deprecated=True, description="Deprecated: `assigned_pool`.")
    state: JobState
    state_reason: str
    routing_reason: str
    command: list[str]
    image: str | None
    workers: int
    gpus_per_worker: int
    total_gpus: int = Field(description="GPUs asked for: workers x gpus_per_worker.")
    held_gpus: int | None = Field(
        default=None, description="GPUs the gang holds, and is reserved and charged for, on its pool: on a "
                                  "node-exclusive pool (Slurm) whole nodes x GPUs per node, even when it asked for "
                                  "fewer. null until dispatched.")
    cpus_per_worker: int
    memory_per_worker: str
    gpu_type: str | None
    time_limit: str
    time_limit_s: int
    env: dict[str, str]
    labels: dict[str, str]
    priority: int
    backend_job_id: str | None
    exit_code: int | None
    nodes: list[str] | None
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    ended_at: datetime | None
    cancel_requested_at: datetime | None
    job_set_id: str | None = Field(default=None, description="The array or sweep this job is a task of.")
    array_index: int | None = Field(default=None, description="This task's index in its set (0-based).")
    parameters: dict[str, Any] | None = Field(default=None, description="A sweep task's parameter values.")
    depends_on: list[dict[str, Any]] | None = Field(
        default=None, description="getJob only: what this job waits for (`job` or `job_set`, `condition`, the "
                                  "target's `state`, `met`); null when none.")
    dependents: list[str] | None = Field(
        default=None, description="getJob only: ids of jobs waiting for this job (first 100); null when none.")
    estimated_start: datetime | None = Field(
        default=None, description="A pending job's planned start (like `squeue --start`): when, by the running "
                                  "jobs' time limits, the whole gang will have room on `estimated_pool` without "
                                  "delaying a higher job. Never earlier than it can start; null when there is no "
                                  "estimate (see `estimate_reason`) or the job is no longer pending.")
    estimated_pool: str | None = Field(default=None, description="The pool of `estimated_start`.")
    mounts: list[dict[str, Any]] | None = Field(
        default=None, description="The storages the job sees: `storage`, `path` (where the job sees it), "
                                  "`read_only`; null when none.")
    checkpoint_dir: str | None = Field(
        default=None, description="The job's checkpoint directory (`ISTHMUS_CHECKPOINT_DIR`), the same for every "
                                  "retry and `resume_from`; null without `checkpoint`.")
    estimate_reason: str | None = Field(
        default=None, description="Why the estimate is what it is, or why there is none (e.g. held by a quota).")
    attempt: int = Field(default=1, description="The job's current attempt (1, then 2, ... after each retry; "
                                                "docs/recovery.md).")
    attempts: list[AttemptOut] | None = Field(
        default=None, description="getJob only: the attempts that ended and were retried, oldest first; null "
                                  "when none.")
    borrowed: bool | None = Field(
        default=None, description="Whether the current attempt runs on borrowed GPUs, beyond every guarantee of "
                                  "its account chain, so that work within a guarantee may reclaim them "
                                  "(docs/recovery.md); false: within a guarantee; null: not dispatched yet, or no "
                                  "guarantee was set anywhere when it was.")
    checkpoint_at: datetime | None = Field(
        default=None, description="When the job last reported a committed checkpoint (POST "
                                  "/v1/jobs/{id}/checkpoints); null: never.")
    gpu_hours_at_risk: float | None = Field(
        default=None, description="A running job's GPU-hours since its last checkpoint report in this attempt (or "
                                  "since its start): what a stop now would lose.")
    preemption: PreemptionOut | None = Field(
        default=None, description="getJob only: the gateway chose to stop this attempt to reclaim borrowed GPUs; "
                                  "null otherwise.")


class JobPage(BaseModel):
    items: list[JobOut]
    next_cursor: str | None = Field(description="Pass as `cursor` to get the next page; null on the last page.")


class JobEventOut(BaseModel):
    id: int
    job_id: str
    at: datetime
    actor: str
    kind: str
    from_state: JobState | None
    to_state: JobState | None
    reason: str
    data: dict[str, Any] | None


class JobEventPage(BaseModel):
    items: list[JobEventOut]
