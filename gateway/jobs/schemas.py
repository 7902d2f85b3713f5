"""The job spec on the wire (pydantic v2), with limits a user can understand."""

from __future__ import annotations

import enum
import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from gateway.domain.shapes import (
    format_duration,
    format_memory,
    normalise_gpu_type,
    parse_duration_s,
    parse_memory_mib,
)
from gateway.kit.names import ACCOUNT_NAME_RE, GPU_TYPE_RE, JOB_NAME_RE

NAME_RE = JOB_NAME_RE
ACCOUNT_RE = ACCOUNT_NAME_RE
ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
LABEL_KEY_RE = re.compile(r"^([a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
LABEL_VALUE_RE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
IMAGE_RE = r"^[a-z0-9][a-z0-9._/:@-]{0,254}$"
# Variables the backends set themselves; a job may not override them.
RESERVED_ENV_PREFIXES = ("SLURM_", "ISTHMUS_", "KUBERNETES_")
# Label keys a job may not set (docs/kubernetes.md, "Pod hardening"). The Job controller
# selects its pods by job-name / controller-uid; Kueue reads its own keys (queue, priority
# class); kubernetes.io / k8s.io (and their subdomains) belong to Kubernetes; the gateway's
# isthmus.io keys say whose pod it is, and sites select on them (Services, NetworkPolicies).
RESERVED_LABEL_KEYS = frozenset({"job-name", "controller-uid", "isthmus.io/managed-by", "isthmus.io/gateway-job-id",
                                 "isthmus.io/account", "isthmus.io/user"})
RESERVED_LABEL_DOMAINS = ("kubernetes.io", "k8s.io", "x-k8s.io")

MAX_WORKERS = 1024
MAX_GPUS_PER_WORKER = 16
MAX_CPUS_PER_WORKER = 1024
MAX_ARGV_ITEMS, MAX_ARG_LEN, MAX_ARGV_BYTES = 256, 4096, 64 * 1024
MAX_ENV, MAX_ENV_VALUE = 128, 4096
MAX_LABELS = 32
MAX_DEPENDENCIES = 64  # per job; a whole set counts as one
JOB_ID_RE = r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"


POOL_CHOICE_RE = r"^(auto|[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)$"
PoolChoice = Annotated[str, Field(pattern=POOL_CHOICE_RE, max_length=63)]


class PoolKind(str, enum.Enum):
    """What runs a pool's jobs: `slurm` (whole nodes) or `kubernetes` (Kueue; GPUs packed)."""

    SLURM = "slurm"
    KUBERNETES = "kubernetes"


EXAMPLE_SPEC = {
    "name": "llama-finetune",
    "account": "team-a",
    "backend": "auto",
    "command": ["python", "train.py", "--epochs", "3"],
    "image": "ghcr.io/example/trainer:1.4",
    "workers": 4,
    "gpus_per_worker": 8,
    "cpus_per_worker": 32,
    "memory_per_worker": "256Gi",
    "gpu_type": None,
    "time_limit": "12h",
    "env": {"WANDB_PROJECT": "finetune"},
    "labels": {"project": "llama"},
    "priority": 0,
}


def reserved_label_key(key: str) -> bool:
    """Whether a job may not set this label key (case-insensitive, as a DNS prefix is)."""
    k = key.lower()
    if k in RESERVED_LABEL_KEYS:
        return True
    prefix = k.split("/", 1)[0] if "/" in k else ""
    return any(prefix == d or prefix.endswith("." + d) for d in RESERVED_LABEL_DOMAINS)


class DependencyCondition(str, enum.Enum):
    SUCCEEDED = "succeeded"  # the job (every task of the set) succeeded
    FINISHED = "finished"  # ended in any final state
    FAILED = "failed"  # the job (every task of the set) failed
    STARTED = "started"  # started running (or ran and ended)


class Dependency(BaseModel):
    """Wait for one job, or every task of a job set, to reach ``condition`` (docs/jobs.md)."""

    model_config = ConfigDict(extra="forbid")

    job: Annotated[str | None, Field(default=None, pattern=JOB_ID_RE, description="A job id you can see.")]
    job_set: Annotated[str | None, Field(default=None, pattern=JOB_ID_RE,
                                         description="A job set id you can see: every task of it.")]
    condition: DependencyCondition = DependencyCondition.SUCCEEDED

    @model_validator(mode="after")
    def _one_target(self) -> Dependency:
        if (self.job is None) == (self.job_set is None):
            raise ValueError("give exactly one of job and job_set")
        return self


MAX_MOUNTS = 16
# Fields left out of a stored spec while empty: a spec without them hashes as it did before
# they existed (an earlier request replayed with its Idempotency-Key still matches).
OPTIONAL_STORED = ("depends_on", "mounts", "checkpoint", "resume_from", "retry", "topology")
TOPOLOGY_LEVEL_RE = r"^[a-z][a-z0-9-]{0,30}$"
STORAGE_NAME_RE = r"^[a-z0-9]([-a-z0-9]{0,30}[a-z0-9])?$"
MOUNT_PATH_RE = r"^(/[A-Za-z0-9._+-]+)+$"


class Mount(BaseModel):
    """A storage the job sees (docs/storage.md): at the storage's own path unless ``path`` says
    where; read-only when the storage is, or when ``read_only`` asks."""

    model_config = ConfigDict(extra="forbid")

    storage: Annotated[str, Field(pattern=STORAGE_NAME_RE, description="A storage's name (GET /v1/storage).")]
    path: Annotated[str | None, Field(
        default=None, pattern=MOUNT_PATH_RE, max_length=255,
        description="Where the job sees it, when not at the storage's own path (only pools that mount volumes, "
                    "Kubernetes, can; routing keeps the job off the others).")]
    read_only: bool | None = Field(default=None, description="true: read-only even on a read-write storage; false: "
                                                             "must be writable. Default: the storage's mode.")

    @field_validator("path")
    @classmethod
    def _path(cls, v: str | None) -> str | None:
        if v is not None and any(seg in (".", "..") for seg in v.split("/")):
            raise ValueError("must not contain '.' or '..' segments")
        return v


class Checkpoint(BaseModel):
    """Where the job keeps checkpoints: ``ISTHMUS_CHECKPOINT_DIR``, the same directory for every
    retry, requeue or move of the job, and for a later job that names it in ``resume_from``."""

    model_config = ConfigDict(extra="forbid")

    storage: Annotated[str, Field(pattern=STORAGE_NAME_RE, description="A read-write storage's name.")]


MAX_ATTEMPTS = 10


class Retry(BaseModel):
    """When the gateway runs the job again after an attempt failed (docs/recovery.md)."""

    model_config = ConfigDict(extra="forbid")

    max_attempts: Annotated[int, Field(ge=1, le=MAX_ATTEMPTS, description="Attempts in all, the first included; "
                                                                         "1: never retried.")]
    on: Annotated[list[Literal["node_failure", "preempted", "exit_code"]], Field(
        default_factory=lambda: ["node_failure", "preempted"], min_length=1, max_length=3,
        description="`node_failure`: a node failed, booted wrong or was lost under the gang; `preempted`: the "
                    "gateway stopped it to reclaim borrowed GPUs, or its backend preempted or evicted it (not "
                    "counted in `max_attempts`); `exit_code`: the job's own non-zero exit. Default: "
                    "`node_failure` and `preempted`.")]
    exit_codes: Annotated[list[Annotated[int, Field(ge=1, le=255)]] | None, Field(
        default=None, max_length=32, description="With `exit_code`: only these codes (default: any non-zero).")]

    @field_validator("on")
    @classmethod
    def _on(cls, v: list[str]) -> list[str]:
        return sorted(set(v))

    @field_validator("exit_codes")
    @classmethod
    def _codes_need_exit_code(cls, v: list[int] | None, info: ValidationInfo) -> list[int] | None:
        if v is not None and "exit_code" not in (info.data.get("on") or ()):
            raise ValueError("exit_codes needs `exit_code` in `on`")
        return sorted(set(v)) if v is not None else None


class Topology(BaseModel):
    """One network domain for the whole gang (docs/planning.md, "Topology")."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"required": "block"},
                                                                              {"preferred": "switch"}]})

    required: Annotated[str | None, Field(
        default=None, pattern=TOPOLOGY_LEVEL_RE,
        description="The gang waits until one domain of this level (a pool's word: `block`, `switch`, `rack`) "
                    "has room for all of it; pools without the level, or whose largest domain is too small, "
                    "are not used.")]
    preferred: Annotated[str | None, Field(
        default=None, pattern=TOPOLOGY_LEVEL_RE,
        description="The backend packs the gang into one domain of this level when it can, without waiting "
                    "for one. Without `topology`, each pool packs gangs as tightly as it does by default.")]

    @model_validator(mode="after")
    def _one(self) -> Topology:
        if (self.required is None) == (self.preferred is None):
            raise ValueError("give exactly one of required and preferred")
        return self

    @property
    def level(self) -> str:
        return self.required or self.preferred or ""


class JobSpec(BaseModel):
    """What a user asks to run: one gang of ``workers`` identical workers."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [EXAMPLE_SPEC]})

    name: Annotated[str, Field(pattern=NAME_RE, description="1-63 letters, digits, `.`, `_`, `-`.")]
    account: Annotated[str, Field(pattern=ACCOUNT_RE, description="Gateway account charged for the job.")]
    pool: PoolChoice | None = Field(default=None, description="A pool's name (GET /v1/pools), or `auto` (the "
                                                               "default) to let the gateway route.")
    pool_kind: PoolKind | None = Field(default=None, description="With `auto`: only pools of this kind.")
    backend: PoolChoice | None = Field(default=None, deprecated=True,
                                       description="Deprecated alias of `pool`, kept for old clients.")
    command: Annotated[list[str], Field(min_length=1, max_length=MAX_ARGV_ITEMS,
                                        description="argv list, run without a shell.")]
    image: Annotated[str | None, Field(default=None, pattern=IMAGE_RE,
                                       description="Container image (Kubernetes; Slurm sites with containers).")]
    workers: Annotated[int, Field(default=1, ge=1, le=MAX_WORKERS, description="Gang size: nodes / pods.")]
    gpus_per_worker: Annotated[int, Field(default=0, ge=0, le=MAX_GPUS_PER_WORKER)]
    cpus_per_worker: Annotated[int, Field(default=1, ge=1, le=MAX_CPUS_PER_WORKER)]
    # str | int: the spec says what is accepted; the validator always normalises to a string.
    # No `default` in the schema: openapi-generator's Go client writes a string default on a
    # string-or-integer field as bare code (`= 4Gi`), which does not compile.
    memory_per_worker: Annotated[str | int, Field(default="4Gi", description="e.g. `64Gi`, `512Mi`; integer = MiB. "
                                                  "Default: `4Gi`.",
                                                  json_schema_extra=lambda s: s.pop("default", None))]
    gpu_type: Annotated[str | None, Field(default=None, pattern=GPU_TYPE_RE,
                                          description="e.g. `h100`, `a100`; case-insensitive, stored in lower case.")]
    time_limit: Annotated[str | int | None, Field(
        default=None, description="Wall-clock limit: seconds, `90m`, `12h`, `2d`, `HH:MM:SS` or `D-HH:MM:SS`. "
                                  "Default: the gateway's default (1h unless configured).")]
    env: Annotated[dict[str, str], Field(default_factory=dict, max_length=MAX_ENV)]
    labels: Annotated[dict[str, str], Field(default_factory=dict, max_length=MAX_LABELS)]
    priority: Annotated[int, Field(default=0, ge=-1000, le=1000, description="Higher first within the account.")]
    depends_on: Annotated[list[Dependency], Field(
        default_factory=list, max_length=MAX_DEPENDENCIES,
        description="Jobs or job sets this job waits for; it stays `blocked` until they are met (docs/jobs.md).")]
    mounts: Annotated[list[Mount], Field(
        default_factory=list, max_length=MAX_MOUNTS,
        description="Storages the job sees, at the same paths on every pool (docs/storage.md).")]
    checkpoint: Checkpoint | None = Field(default=None, description="A checkpoint directory that follows the job "
                                                                     "(docs/storage.md).")
    resume_from: Annotated[str | None, Field(
        default=None, pattern=JOB_ID_RE,
        description="With `checkpoint`: an earlier job of the same account whose checkpoint directory this job "
                    "continues.")]

    topology: Topology | None = Field(default=None, description="Keep the gang inside one network domain "
                                                                 "(a block, switch or rack; docs/planning.md).")
    retry: Retry | None = Field(default=None, description="Run the job again when an attempt fails "
                                                       "(docs/recovery.md). Default: the gateway's, up to "
                                                       "`ISTHMUS_RETRY_MAX_ATTEMPTS` attempts on `node_failure`, "
                                                       "and every `preempted` attempt.")

    def stored(self) -> dict[str, Any]:
        """The normalised spec kept on the job (and hashed for idempotency)."""
        return self.model_dump(mode="json", exclude={k for k in OPTIONAL_STORED if not getattr(self, k)} or None)

    @field_validator("memory_per_worker", mode="before")
    @classmethod
    def _memory(cls, v: Any) -> str:
        return format_memory(parse_memory_mib(v))

    @field_validator("time_limit", mode="before")
    @classmethod
    def _time_limit(cls, v: Any) -> str | None:
        if v is None:
            return None
        seconds = parse_duration_s(v)
        if not 60 <= seconds <= 366 * 86400:
            raise ValueError("must be between 1 minute and 366 days")
        return format_duration(seconds)

    @field_validator("gpu_type")
    @classmethod
    def _gpu_type(cls, v: str | None) -> str | None:
        # One form everywhere (billing weights, routing, the registry): lower case. The
        # adapters map it back to the site's spelling (adapters.base.site_gpu_type).
        return normalise_gpu_type(v)

    @field_validator("command")
    @classmethod
    def _command(cls, v: list[str]) -> list[str]:
        if not v[0].strip():
            raise ValueError("the program (first element) must not be empty")
        total = 0
        for i, arg in enumerate(v):
            if "\x00" in arg:
                raise ValueError(f"argument {i} contains a NUL byte")
            if len(arg) > MAX_ARG_LEN:
                raise ValueError(f"argument {i} is longer than {MAX_ARG_LEN} characters")
            total += len(arg.encode())
        if total > MAX_ARGV_BYTES:
            raise ValueError(f"the command is larger than {MAX_ARGV_BYTES} bytes")
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        for key, value in v.items():
            if not ENV_KEY_RE.fullmatch(key):
                raise ValueError(f"variable name {key[:64]!r} must match [A-Za-z_][A-Za-z0-9_]*")
            if key.upper().startswith(RESERVED_ENV_PREFIXES):
                raise ValueError(f"variable {key!r} is reserved for the backends")
            if "\x00" in value or len(value) > MAX_ENV_VALUE:
                raise ValueError(f"value of {key!r} is too long or contains a NUL byte")
        return v

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        for key, value in v.items():
            if len(key) > 253 or not LABEL_KEY_RE.fullmatch(key):
                raise ValueError(f"label key {key[:64]!r} is not a valid label name")
            if reserved_label_key(key):
                raise ValueError(f"label key {key!r} is reserved for the gateway and the backends")
            if not LABEL_VALUE_RE.fullmatch(value):
                raise ValueError(f"label {key!r}: value must be up to 63 letters, digits, '-', '_', '.'")
        return v

    @model_validator(mode="after")
    def _resume_needs_checkpoint(self) -> JobSpec:
        if self.resume_from and self.checkpoint is None:
            raise ValueError("resume_from needs checkpoint (the storage whose checkpoint directory to continue)")
        return self

    @model_validator(mode="after")
    def _gpu_type_needs_gpus(self) -> JobSpec:
        if self.gpu_type and self.gpus_per_worker == 0:
            raise ValueError("gpu_type is set but gpus_per_worker is 0")
        return self

    @model_validator(mode="after")
    def _pool_and_alias(self) -> JobSpec:
        # `backend` is `pool` by its old name: one wins only if they agree; both are stored.
        values = self.__dict__  # no DeprecationWarning for reading our own alias
        pool, backend = values.get("pool"), values.get("backend")
        if pool and backend and pool != backend:
            raise ValueError(f"pool {pool!r} and its deprecated alias backend {backend!r} disagree; send only pool")
        values["pool"] = values["backend"] = pool or backend or "auto"
        return self

    @property
    def total_gpus(self) -> int:
        return self.workers * self.gpus_per_worker

    @property
    def memory_mib_per_worker(self) -> int:
        return parse_memory_mib(self.memory_per_worker)


class CheckpointIn(BaseModel):
    """A committed checkpoint, as the job reports it (docs/recovery.md, "Checkpoint reports")."""

    model_config = ConfigDict(extra="forbid")

    step: int | None = Field(default=None, ge=0, le=10**15, description="The training step it holds, if known.")
    note: str = Field(default="", max_length=200, pattern=r"^[^\x00-\x1f\x7f]*$",
                      description="A short note for the job's history (no control characters).")
