"""Job sets on the wire: an array or a sweep is a JobSpec plus how to expand it."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from gateway.domain.states import JobState
from gateway.jobs.schemas import EXAMPLE_SPEC, JobSpec

# Hard ceilings of the schema; the site limits (settings max_array_tasks, max_sweep_points)
# are checked at submit and are at most these.
HARD_MAX_TASKS = 100_000
MAX_SWEEP_PARAMS = 16
PARAM_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
# One value of a sweep parameter. Integers stay integers (32, not 32.0) when substituted; the
# published schema says string | number | boolean (generated clients cannot use an
# integer | number union: docs/clients.md).
SweepValue = Annotated[str | int | float | bool, WithJsonSchema(
    {"anyOf": [{"type": "string"}, {"type": "number", "format": "double"}, {"type": "boolean"}]})]


class ArraySpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    count: Annotated[int | None, Field(default=None, ge=1, le=HARD_MAX_TASKS,
                                       description="Number of tasks. Omit with a sweep (the sweep sets it).")]
    max_running: Annotated[int | None, Field(default=None, ge=1, le=HARD_MAX_TASKS,
                                             description="At most this many tasks past `pending` at once; the "
                                                         "others wait in `blocked`.")]


class JobSetSpec(JobSpec):
    """A JobSpec run as many tasks: ``array`` (N copies) and/or ``sweep`` (the cartesian product)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{
        **{k: v for k, v in EXAMPLE_SPEC.items() if k not in ("workers", "gpus_per_worker", "image")},
        "name": "lr-sweep", "gpus_per_worker": 1,
        "command": ["python", "train.py", "--lr", "{{ learning_rate }}", "--batch", "{{ batch }}"],
        "sweep": {"learning_rate": [0.001, 0.0003], "batch": [32, 64]}, "array": {"max_running": 2}}]})

    array: ArraySpec | None = None
    sweep: Annotated[dict[str, list[SweepValue]] | None, Field(
        default=None, max_length=MAX_SWEEP_PARAMS,
        description="Parameter name -> values; one task per combination. Substituted as `{{ name }}` into "
                    "`command` items and `env` values (docs/jobs.md).")]

    @field_validator("resume_from")
    @classmethod
    def _no_resume(cls, v: str | None) -> str | None:
        if v is not None:
            raise ValueError("a job set's tasks each keep their own checkpoints; resume_from is for single jobs")
        return v

    @field_validator("sweep")
    @classmethod
    def _sweep(cls, v: dict[str, list[SweepValue]] | None) -> dict[str, list[SweepValue]] | None:
        if v is None:
            return v
        if not v:
            raise ValueError("a sweep needs at least one parameter")
        for name, values in v.items():
            if not PARAM_RE.fullmatch(name) or name == "index":
                raise ValueError(f"parameter name {name[:64]!r} must match [A-Za-z_][A-Za-z0-9_]* and not be 'index'")
            if not values:
                raise ValueError(f"parameter {name!r} has no values")
            for value in values:
                if isinstance(value, str) and (len(value) > 1024 or "\x00" in value):
                    raise ValueError(f"a value of {name!r} is longer than 1024 characters or contains a NUL byte")
        return v

    @model_validator(mode="after")
    def _shape(self) -> JobSetSpec:
        if self.sweep is None and (self.array is None or self.array.count is None):
            raise ValueError("a job set needs array.count or a sweep")
        if self.sweep is not None and self.array is not None and self.array.count is not None:
            raise ValueError("array.count and sweep exclude each other: the sweep sets the number of tasks")
        return self

    def job_spec(self) -> JobSpec:
        return JobSpec.model_validate(self.model_dump(exclude={"array", "sweep"}))


class JobSetOut(BaseModel):
    id: str
    name: str
    account: str
    submitted_by: str
    kind: str = Field(description="`array` or `sweep`.")
    task_count: int
    max_running: int | None
    sweep: dict[str, list[SweepValue]] | None
    counts: dict[JobState, int] = Field(description="Tasks by state.")
    created_at: datetime


