"""The contract every Isthmus backend implements.

The gateway talks to a pool (a Slurm cluster, a Kueue-enabled Kubernetes cluster) only
through :class:`Backend`. Adapters import nothing from the HTTP layer (``gateway``); the
gateway hands them a :class:`SubmitRequest` and gets back plain dataclasses.

Rules every adapter follows:

* ``submit`` is idempotent by ``SubmitRequest.gateway_job_id``: the gateway id is stored
  on the backend job (Slurm comment/name, Kubernetes label) and ``submit`` first looks
  it up with ``find_by_gateway_id``; a job that already exists is returned, never
  created twice. (The look-up may be skipped when ``first_attempt`` is set.)
* Library exceptions (httpx, kubernetes, subprocess) never escape: they become one of
  the typed errors below, raised ``from`` the original.
* A gang is all-or-nothing: ``BackendState.RUNNING`` is reported only when every worker
  of the gang holds its allocation.
"""

from __future__ import annotations

import abc
import dataclasses
import enum
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import ClassVar

# --------------------------------------------------------------------------- errors


class BackendError(Exception):
    """Base of every error an adapter raises. ``message`` is safe to show to users."""

    retryable: ClassVar[bool] = False

    def __init__(self, message: str, *, backend: str = "", detail: str | None = None):
        super().__init__(message)
        self.message = message
        self.backend = backend
        self.detail = detail

    def __str__(self) -> str:  # pragma: no cover - trivial
        return f"{self.backend + ': ' if self.backend else ''}{self.message}"


class BackendUnavailable(BackendError):
    """The backend cannot be reached or did not answer in time. Try again later."""

    retryable = True


class SubmissionRejected(BackendError):
    """The backend refused the job as it is (bad partition, too many nodes, 422...).

    Retrying the same submission will fail the same way.
    """


class BackendForbidden(BackendError):
    """The backend refused the gateway's credentials or the mapped user (403)."""


class JobNotFound(BackendError):
    """The backend does not know this job (it may have been purged)."""


class Unsupported(BackendError):
    """The backend cannot do this at all; ``message`` says why (reaches the user)."""


# ---------------------------------------------------------------------- data types


class BackendState(str, enum.Enum):
    """A backend job's state, already mapped to the gateway's vocabulary."""

    QUEUED = "queued"  # accepted, waiting; holds no GPU
    STARTING = "starting"  # whole gang admitted/allocated, workers not all running yet
    RUNNING = "running"  # every worker of the gang is running
    REQUEUED = "requeued"  # preempted / evicted / requeued by the backend
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def final(self) -> bool:
        return self in (BackendState.SUCCEEDED, BackendState.FAILED, BackendState.CANCELLED)


@dataclasses.dataclass(frozen=True)
class VolumeMount:
    """A directory of a storage the job sees (docs/storage.md). The gateway has checked that
    the pool provides the storage the way ``provider`` says."""

    storage: str  # the storage's name
    path: str  # where the job sees it (absolute)
    root: str  # the storage's own path (where a pool's shared file system has it)
    sub_path: str = ""  # the directory inside the storage ("" = its root), relative
    read_only: bool = True
    provider: str = "shared"  # shared (the nodes' own file system) | pvc | nfs | host_path
    claim: str = ""  # pvc: the claim, in the job's namespace
    server: str = ""  # nfs
    source_path: str = ""  # nfs: the export; host_path: the directory on the node
    # Create the directory when missing, for the job's user only (a per-account directory,
    # a checkpoint directory); otherwise it must exist.
    create: bool = False

    @property
    def directory(self) -> str:
        """Where the directory is on a file system that has the storage at its own path."""
        return f"{self.root}/{self.sub_path}" if self.sub_path else self.root


@dataclasses.dataclass(frozen=True)
class SubmitRequest:
    """What the gateway asks a backend to run. Units are explicit in the names."""

    gateway_job_id: str
    name: str
    account: str  # gateway account; the adapter maps it (Slurm account, namespace)
    user: str  # POSIX user the job runs as (Slurm) / recorded on the Job (Kubernetes)
    command: Sequence[str]  # argv, never a shell string
    workers: int
    gpus_per_worker: int
    cpus_per_worker: int
    memory_mib_per_worker: int
    time_limit_s: int
    image: str | None = None
    gpu_type: str | None = None
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    priority: int = 0  # orders the user's jobs within the account (the gateway's queue)
    # Backend priority class the gateway's administrators set for the account (Kueue
    # WorkloadPriorityClass); never derived from ``priority``. None: the backend's default.
    priority_class: str | None = None
    # True only when the gateway knows no earlier submission of this gateway id can exist
    # (the job's first dispatch claim, not a retry or a crash recovery). An adapter whose
    # duplicate look-up is expensive (Slurm cannot filter jobs by comment) may skip it.
    first_attempt: bool = False
    # Seconds a job gets between the gateway's preemption signal and its stop (docs/recovery.md);
    # Kubernetes renders it as the pods' terminationGracePeriodSeconds. 0: the backend's default.
    preempt_grace_s: int = 0
    # No submission of this job can have reached the backend before this time (the gateway
    # job's creation). Adoption refuses a backend job submitted earlier: anyone can copy a
    # gateway id into a Slurm comment, not back-date a submission.
    submitted_after: datetime | None = None
    # Storages the job sees, at the same paths on every pool (docs/storage.md).
    mounts: Sequence[VolumeMount] = ()
    # The gateway's attempt at this job (1, then 2, ... after a retry): each attempt is its
    # own backend job, so the backend's idempotency key includes it (docs/recovery.md).
    attempt: int = 1
    # A reservation the backend holds for the job's account (:meth:`Backend.reserve`), which the
    # gang runs in; None: the pool's open capacity.
    reservation: str | None = None
    # One network domain for the whole gang (a level of the pool's topology); None: the
    # backend's default packing.
    topology: TopologyRequest | None = None

    @property
    def total_gpus(self) -> int:
        return self.workers * self.gpus_per_worker


@dataclasses.dataclass(frozen=True)
class SubmitResult:
    backend_job_id: str
    adopted: bool = False  # True when the job already existed (idempotent re-submit)


@dataclasses.dataclass(frozen=True)
class JobStatus:
    """A backend job as the backend sees it now."""

    backend_job_id: str
    gateway_job_id: str | None
    state: BackendState
    reason: str = ""  # backend's words: Slurm pending reason, Kueue condition message
    exit_code: int | None = None
    started_at: datetime | None = None  # when the whole gang started (UTC)
    ended_at: datetime | None = None
    nodes: tuple[str, ...] = ()
    allocated_gpus: int = 0  # GPUs held now (0 unless the whole gang holds them)
    raw_state: str = ""  # the backend's own state name(s), e.g. "PENDING" or "Admitted"
    # When the backend last took the gang down and queued it again (Slurm: the requeue
    # time; Kueue: the eviction), or None if it never did or does not say. A requeue
    # newer than the run the gateway recorded means the gang was requeued in between,
    # even if it is running again by now.
    requeued_at: datetime | None = None
    # The backend's own code when it holds the job for something only an administrator can
    # fix, so that it will not start as submitted (Slurm: BeginTime after a failed launch,
    # InvalidAccount, InvalidQOS: usually a user the cluster does not know); "" otherwise.
    # The gateway fails such a job after ``ISTHMUS_HELD_JOB_FAIL_AFTER_S`` (docs/dispatch.md).
    held: str = ""
    # Why a FAILED job failed, when the backend says more than an exit code: ``NODE_FAILURE``
    # (a node failed, booted wrong, was lost or drained under the gang: not the job's doing),
    # ``TIME_LIMIT`` (it ran out of time), or "" (its own exit, anything else). The gateway's
    # retry policy reads it (docs/recovery.md).
    failure: str = ""


NODE_FAILURE = "node_failure"
TIME_LIMIT = "time_limit"


@dataclasses.dataclass(frozen=True)
class Window:
    """Capacity the backend itself takes away for a time: a maintenance or another reservation
    (a Slurm reservation). The planner never starts a gang whose time limit would cross it on
    the capacity it takes (docs/planning.md)."""

    name: str  # the backend's own name for it (the Slurm reservation's name)
    start: datetime  # timezone-aware
    end: datetime
    nodes: tuple[str, ...]  # the pool's nodes it takes (only those of this pool)
    maintenance: bool  # a maintenance (Slurm's MAINT flag), else a reservation for someone
    detail: str = ""  # in words, e.g. "Slurm reservation maint1 (MAINT), for users root"


@dataclasses.dataclass(frozen=True)
class TopologyDomain:
    """One network domain of a pool at one topology level (docs/planning.md, "Topology"):
    a Slurm block or leaf switch, a Kubernetes rack. Names are the backend's own."""

    level: str  # the pool's word for the level: "block", "switch", "rack", ...
    name: str
    nodes: tuple[str, ...]  # the pool's nodes in it
    idle_nodes: int  # of those, idle in this snapshot (free for a whole-node gang)
    # GPUs free on each of ``nodes`` (same order) on a pool that places GPUs one by one
    # (Kubernetes); empty on a node-exclusive pool, whose room is its idle nodes.
    free_gpus: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class TopologyRequest:
    """A gang's wish to sit inside one domain of ``level``: ``required`` (it waits for one) or
    preferred (the backend packs it as tightly as it can)."""

    level: str
    required: bool


@dataclasses.dataclass(frozen=True)
class PoolCapacity:
    """Free and total capacity of one partition / ClusterQueue, for routing."""

    pool: str  # partition or ClusterQueue name
    total_nodes: int
    idle_nodes: int
    total_gpus: int
    free_gpus: int
    gpus_per_node: int = 0
    gpu_types: tuple[str, ...] = ()
    detail: str = ""  # human-readable, shown in routing reasons
    # The largest node's memory and CPUs (0: unknown), for "can this worker ever fit".
    memory_mib_per_node: int = 0
    cpus_per_node: int = 0
    # The backend's own windows on this pool that have not ended (a node of an active one is
    # not idle in this snapshot); () where the backend has none (Kueue).
    windows: tuple[Window, ...] = ()
    # The pool's network domains, every level (); () where the backend declares none.
    topology: tuple[TopologyDomain, ...] = ()


def site_gpu_type(requested: str | None, known: Iterable[str]) -> str | None:
    """The site's own spelling of ``requested`` among ``known`` GPU types, matched without case.

    The gateway compares GPU types in one normalised (lower-case) form (docs/security.md,
    finding 8), but Slurm gres names and Kubernetes node labels are matched exactly, e.g.
    ``nvidia-h100-80gb-hbm3`` is ``NVIDIA-H100-80GB-HBM3`` on the nodes. Unknown: as given.
    """
    if not requested:
        return requested
    for name in known:
        if name.lower() == requested.lower():
            return name
    return requested


@dataclasses.dataclass(frozen=True)
class Capacity:
    backend: str
    pools: tuple[PoolCapacity, ...]

    @property
    def free_gpus(self) -> int:
        return sum(p.free_gpus for p in self.pools)

    @property
    def total_gpus(self) -> int:
        return sum(p.total_gpus for p in self.pools)


class Feature(str, enum.Enum):
    """Optional capabilities. A backend lists what it cannot do, with the reason."""

    CONTAINER_IMAGE = "container_image"
    GPU_TYPE = "gpu_type"
    PRIORITY = "priority"
    WATCH = "watch"
    OUTPUT_FILES = "output_files"
    OUTPUT_STREAM = "output_stream"
    # Show a storage at a path of the job's choosing (a mount namespace: Kubernetes volumes).
    MOUNT_PATHS = "mount_paths"


# Every reservation the gateway makes on a backend is named with this prefix and the gateway's
# own reservation id: the adapter tells them from the site's (windows) and finds them again.
GATEWAY_RESERVATION_PREFIX = "isthmus-hold-"


@dataclasses.dataclass(frozen=True)
class ReservationRequest:
    """Whole nodes a backend should hold natively for one account (docs/planning.md).

    ``name`` is ``GATEWAY_RESERVATION_PREFIX`` + the gateway's reservation id; asking again
    with the same name updates it (idempotent)."""

    name: str
    account: str  # gateway account; the adapter maps it as for a submission
    nodes: int
    start: datetime
    end: datetime


# ------------------------------------------------------------------------ interface


class Backend(abc.ABC):
    """One pool behind the gateway.

    Subclasses set ``name`` (``"slurm"`` or ``"kubernetes"``) and implement the abstract
    methods. Blocking calls are fine: the gateway calls adapters from worker threads.
    """

    name: ClassVar[str] = ""
    # The adapter's settings dataclass: a pool's ``settings`` (pools file) are its fields.
    settings_class: ClassVar[type | None] = None
    # Settings fields that only make sense from Python (callables), never from a pools file.
    code_only_settings: ClassVar[frozenset[str]] = frozenset()
    # Feature -> why this backend cannot do it (SkyPilot's _CLOUD_UNSUPPORTED_FEATURES).
    unsupported_features: ClassVar[Mapping[Feature, str]] = {}

    @abc.abstractmethod
    def submit(self, request: SubmitRequest) -> SubmitResult:
        """Submit one gang, idempotently.

        Raises:
            SubmissionRejected: the backend refuses the job as specified.
            BackendForbidden: credentials or user mapping refused.
            BackendUnavailable: backend down or timed out; safe to retry.
        """

    @abc.abstractmethod
    def status(self, backend_job_id: str) -> JobStatus:
        """Current state of one job.

        Raises:
            JobNotFound: the backend does not know the job.
            BackendUnavailable: backend down or timed out.
        """

    @abc.abstractmethod
    def cancel(self, backend_job_id: str) -> None:
        """Cancel a job; cancelling a finished or unknown job is not an error."""

    def preempt(self, backend_job_id: str, grace_s: float) -> str:
        """Tell a running job it will be stopped in ``grace_s`` seconds (reclaim, docs/recovery.md);
        returns what was done, in words for the job's history.

        The default stops it at once: :meth:`cancel`. Slurm signals it (``SIGUSR1``) and is
        cancelled by the gateway at the deadline; Kubernetes deletes its pods, whose
        ``terminationGracePeriodSeconds`` is the grace period (``SIGTERM``, then ``SIGKILL``).
        """
        self.cancel(backend_job_id)
        return "cancelled at once (this backend has no signal before a stop)"

    # Whether :meth:`preempt` already stops the job by itself at the end of the grace period
    # (the gateway then does not cancel it at the deadline).
    preempt_stops: ClassVar[bool] = True

    @abc.abstractmethod
    def capacity(self) -> Capacity:
        """Idle/allocated nodes and GPUs per pool."""

    @abc.abstractmethod
    def find_by_gateway_id(self, gateway_job_id: str, *, request: SubmitRequest | None = None) -> JobStatus | None:
        """The backend job the gateway submitted for this gateway id, or None (crash recovery).

        The gateway id on a backend job (a Slurm comment, a label) can be written by anyone
        who can submit there, so it alone never proves the job is the gateway's: an adapter
        returns only a job that is also where and as whom the gateway submits it (Slurm: its
        partition, the mapped user, submitted after ``request.submitted_after``; Kubernetes:
        the deterministic name in the account's namespace). Pass ``request`` whenever the
        result may be adopted.
        """

    def list_gateway_jobs(self) -> Iterable[JobStatus]:
        """Every backend job carrying a gateway id (for orphan reports and bulk polling).

        The gateway id on these is the backend's label, not a proof of identity: the
        gateway matches a listed status to a job by its recorded ``backend_job_id``.
        Optional: the default says it is unsupported.
        """
        raise Unsupported("listing jobs is not supported", backend=self.name)

    def watch_events(self, stop_event: threading.Event, since_resource_version: str | None = None,
                     interested: Callable[[str], bool] | None = None) -> Iterator[JobStatus]:
        """A change feed: the status of a gateway job each time it changes on the backend.

        Optional (``Feature.WATCH``): a backend without one says why in
        ``unsupported_features`` and the gateway polls :meth:`status` instead. The
        iterator blocks until the next change and ends once ``stop_event`` is set; it
        resumes from ``since_resource_version`` when the backend has such a notion (and
        then exposes ``resource_version``). A feed that first replays existing jobs may
        expose ``caught_up`` (False until the replay is done): the gateway keeps polling
        the backend until then. While replaying, a feed may skip the jobs for which
        ``interested(backend_job_id)`` is False (e.g. long-finished ones the gateway no
        longer follows); changes seen live are always yielded.

        Raises:
            Unsupported: the backend has no change feed.
            BackendUnavailable: the feed cannot be opened now; retry later.
        """
        raise Unsupported(self.unsupported_features.get(Feature.WATCH, "this backend has no change feed"),
                          backend=self.name)

    def output_file(self, gateway_job_id: str, worker: int) -> str:
        """Path, on the gateway host, of the file that holds one worker's output (stdout + stderr).

        Optional (``Feature.OUTPUT_FILES``): a backend whose jobs write their output to a
        filesystem the gateway also mounts names the file here; the gateway reads it itself.

        Raises:
            Unsupported: this backend's output is not in files the gateway can read.
        """
        raise Unsupported(self.unsupported_features.get(Feature.OUTPUT_FILES,
                                                        "this pool's job output is not readable by the gateway"),
                          backend=self.name)

    def stream_output(self, backend_job_id: str, worker: int, *, tail_lines: int | None = None,
                      follow: bool = False) -> Iterator[bytes]:
        """One worker's output (stdout + stderr) as the backend serves it, in chunks.

        Optional (``Feature.OUTPUT_STREAM``): a backend that keeps its jobs' output itself
        (Kubernetes: the pod log API) streams it here. ``tail_lines`` starts at the last N
        lines; ``follow`` keeps the stream open while the worker runs. The caller closes the
        iterator (``close()``) to stop early.

        Raises:
            JobNotFound: the worker has no output there (not started yet, or its pod is gone).
            Unsupported: this backend serves no output.
            BackendUnavailable: the backend cannot be reached now.
        """
        raise Unsupported(self.unsupported_features.get(Feature.OUTPUT_STREAM,
                                                        "this pool serves no job output"),
                          backend=self.name)

    def reserve(self, request: ReservationRequest) -> str:
        """Create (or update) a native reservation; returns what the backend says of it in words.

        Raises:
            Unsupported: this backend (or this pool's settings) cannot hold capacity for an
                account; the gateway then holds it in its own planner.
            BackendUnavailable, BackendForbidden, SubmissionRejected: as for :meth:`submit`.
        """
        raise Unsupported(f"{self.name} has no advance reservations: the gateway holds the capacity in its own "
                          "planner", backend=self.name)

    def unreserve(self, name: str) -> None:
        """Delete the native reservation ``name``; an unknown one is silently ignored."""
        raise Unsupported(f"{self.name} has no advance reservations", backend=self.name)

    def gateway_reservations(self) -> list[str] | None:
        """The names of the native reservations the gateway made here (prefix
        ``GATEWAY_RESERVATION_PREFIX``) that have not ended; None: this backend has none."""
        return None

    def supports(self, feature: Feature) -> bool:
        """Whether this backend offers an optional capability (a method it overrides, say)."""
        if feature in self.unsupported_features:
            return False
        if feature is Feature.WATCH:
            return type(self).watch_events is not Backend.watch_events
        if feature is Feature.OUTPUT_FILES:
            return type(self).output_file is not Backend.output_file
        if feature is Feature.OUTPUT_STREAM:
            return type(self).stream_output is not Backend.stream_output
        return True

    def check_supported(self, request: SubmitRequest) -> None:
        """Raise Unsupported when the request needs a feature this backend lacks."""
        if request.image and Feature.CONTAINER_IMAGE in self.unsupported_features:
            raise Unsupported(self.unsupported_features[Feature.CONTAINER_IMAGE], backend=self.name)
        if request.gpu_type and Feature.GPU_TYPE in self.unsupported_features:
            raise Unsupported(self.unsupported_features[Feature.GPU_TYPE], backend=self.name)

    def config_problems(self) -> list[tuple[str, str]]:
        """(field, message) for settings the adapter can check only once built (a kubeconfig's
        content); each stops start-up in one line. Optional: none by default."""
        return []

    def storage_problems(self, mount: VolumeMount, accounts: Iterable[str]) -> list[str]:
        """Why this pool cannot give jobs of ``accounts`` the storage ``mount`` describes (its
        ``path`` is the storage's root, ``read_only`` its mode), checked at start-up: a claim
        that does not exist or is not bound, a read-write storage on a read-only claim. Each
        problem stops start-up in one line. Optional: nothing to check by default (a Slurm
        pool's shared file system is checked by each job, docs/storage.md).

        Raises:
            BackendUnavailable: the pool cannot be asked now (start-up goes on; jobs that
                need the storage fail with the reason when it is missing).
        """
        return []

    def close(self) -> None:
        """Release connections. Optional."""


# ------------------------------------------------------------------------- registry

_REGISTRY: dict[str, type[Backend]] = {}


def register(cls: type[Backend]) -> type[Backend]:
    """Class decorator: register a backend; refuses duplicates and incomplete classes."""
    if not cls.name:
        raise TypeError(f"{cls.__qualname__} has no backend name")
    if cls.settings_class is None:
        raise TypeError(f"backend {cls.name!r} has no settings_class")
    missing = sorted(getattr(cls, "__abstractmethods__", ()))
    if missing:
        raise TypeError(f"backend {cls.name!r} does not implement: {', '.join(missing)}")
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise ValueError(f"a backend named {cls.name!r} is already registered")
    _REGISTRY[cls.name] = cls
    return cls


def registered() -> dict[str, type[Backend]]:
    return dict(_REGISTRY)
