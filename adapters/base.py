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
import functools
import importlib
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from types import MappingProxyType
from typing import ClassVar, Protocol, runtime_checkable

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
    # Nodes the gang must not land on (docs/recovery.md, "Node health"): those whose failure
    # ended an earlier attempt of this job, and those the gateway has quarantined. Slurm
    # ``--exclude``; Kubernetes a required node affinity ``NotIn``.
    exclude_nodes: tuple[str, ...] = ()

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
    # The pool's nodes by name (those its backend lists now); () where unknown.
    nodes: tuple[str, ...] = ()


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
    """Optional capabilities, asked one way: :func:`features_of`.

    The first group is what a submission may ask for; a backend that cannot do one says why
    in :meth:`Backend.unsupported`. Each of the second group is an optional interface below
    (``With...``): a backend has the feature when it has the interface's methods.
    """

    CONTAINER_IMAGE = "container_image"
    GPU_TYPE = "gpu_type"
    PRIORITY = "priority"
    # Show a storage at a path of the job's choosing (a mount namespace: Kubernetes volumes).
    MOUNT_PATHS = "mount_paths"

    WATCH = "watch"
    OUTPUT_FILES = "output_files"
    OUTPUT_STREAM = "output_stream"
    LISTING = "listing"
    RESERVATIONS = "reservations"
    PREEMPT_SIGNAL = "preempt_signal"
    NODE_HEALTH = "node_health"
    NODE_DRAIN = "node_drain"


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
    """One pool behind the gateway: the required interface.

    Subclasses set ``name`` (``"slurm"`` or ``"kubernetes"``) and implement the abstract
    methods; optional features are the ``With...`` interfaces below, found by
    :func:`features_of`. Blocking calls are fine: the gateway calls adapters from worker
    threads.
    """

    name: ClassVar[str] = ""
    # The adapter's settings dataclass: a pool's ``settings`` (pools file) are its fields.
    settings_class: ClassVar[type | None] = None
    # Settings fields that only make sense from Python (callables), never from a pools file.
    code_only_settings: ClassVar[frozenset[str]] = frozenset()
    # Whether each worker is given whole nodes, every GPU on them, whatever it asked for (Slurm
    # ``--exclusive``); else GPUs are placed one by one (Kubernetes). Read through features_of:
    # routing, the planner and the ledger count such a pool in nodes.
    node_exclusive: ClassVar[bool] = False
    # How a pool of this adapter may provide a storage in the pools file (docs/storage.md):
    # "shared" (the nodes' own file system, at the storage's path), pvc, nfs, host_path.
    storage_providers: ClassVar[tuple[str, ...]] = ()

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
        """Stop a running job for a reclaim (docs/recovery.md), giving it ``grace_s`` seconds if the
        backend can; returns what was done, in words for the job's history. The job is stopped
        by this call: a backend that only warns the job first is a :class:`WithPreemptSignal`.

        The default stops it at once: :meth:`cancel`. Kubernetes deletes its pods, whose
        ``terminationGracePeriodSeconds`` is the grace period (``SIGTERM``, then ``SIGKILL``).
        """
        self.cancel(backend_job_id)
        return "cancelled at once (this backend has no signal before a stop)"

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

    def unsupported(self) -> Mapping[Feature, str]:
        """Feature -> why this backend (with its settings and transport) cannot do it, in words
        that reach the user (SkyPilot's ``_CLOUD_UNSUPPORTED_FEATURES``). A backend lists here
        what a submission may ask for and it cannot do, and any optional interface it has but
        cannot use as configured; one it does not have needs no entry (a reason given here
        replaces the default one). Nobody else calls this: ask :func:`features_of`."""
        return {}

    def check_supported(self, request: SubmitRequest) -> None:
        """Raise Unsupported when the request needs a feature this backend lacks."""
        features = features_of(self)
        if request.image:
            features.require(Feature.CONTAINER_IMAGE)
        if request.gpu_type:
            features.require(Feature.GPU_TYPE)

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


# ------------------------------------------------------------- optional interfaces
#
# One Protocol per optional feature (Kueue's ``JobWithCustomStop``, ``JobWithPriorityClass``):
# a backend has the feature when it has the methods, whether or not it names the Protocol
# among its bases (adapters do, for the reader; register() then refuses one that lacks a
# method). Callers never test for a method or catch a default's Unsupported: they ask
# ``features_of(backend).has(Feature.X)``.


@runtime_checkable
class WithWatch(Protocol):
    """``Feature.WATCH``: a change feed (Kubernetes). Without one the gateway polls :meth:`Backend.status`."""

    @abc.abstractmethod
    def watch_events(self, stop_event: threading.Event, since_resource_version: str | None = None,
                     interested: Callable[[str], bool] | None = None) -> Iterator[JobStatus]:
        """The status of a gateway job each time it changes on the backend.

        The iterator blocks until the next change and ends once ``stop_event`` is set; it
        resumes from ``since_resource_version`` when the backend has such a notion (and
        then exposes ``resource_version``). A feed that first replays existing jobs may
        expose ``caught_up`` (False until the replay is done): the gateway keeps polling
        the backend until then. While replaying, a feed may skip the jobs for which
        ``interested(backend_job_id)`` is False (e.g. long-finished ones the gateway no
        longer follows); changes seen live are always yielded.

        Raises:
            BackendUnavailable: the feed cannot be opened now; retry later.
        """
        ...


@runtime_checkable
class WithOutputFiles(Protocol):
    """``Feature.OUTPUT_FILES``: jobs write their output to a file system the gateway also mounts (Slurm)."""

    @abc.abstractmethod
    def output_file(self, gateway_job_id: str, worker: int) -> str:
        """Path, on the gateway host, of the file that holds one worker's output (stdout +
        stderr); the gateway reads it itself."""
        ...


@runtime_checkable
class WithOutputStream(Protocol):
    """``Feature.OUTPUT_STREAM``: the backend keeps its jobs' output and serves it (Kubernetes: the pod log API)."""

    @abc.abstractmethod
    def stream_output(self, backend_job_id: str, worker: int, *, tail_lines: int | None = None,
                      follow: bool = False) -> Iterator[bytes]:
        """One worker's output (stdout + stderr), in chunks. ``tail_lines`` starts at the last N
        lines; ``follow`` keeps the stream open while the worker runs. The caller closes the
        iterator (``close()``) to stop early.

        Raises:
            JobNotFound: the worker has no output there (not started yet, or its pod is gone).
            BackendUnavailable: the backend cannot be reached now.
        """
        ...


@runtime_checkable
class WithJobListing(Protocol):
    """``Feature.LISTING``: every gateway job in one call (orphan reports, bulk polling)."""

    @abc.abstractmethod
    def list_gateway_jobs(self) -> Iterable[JobStatus]:
        """Every backend job carrying a gateway id. The gateway id on these is the backend's
        label, not a proof of identity: the gateway matches a listed status to a job by its
        recorded ``backend_job_id``."""
        ...


@runtime_checkable
class WithReservations(Protocol):
    """``Feature.RESERVATIONS``: the backend holds whole nodes for an account natively (Slurm
    reservations); without it the gateway holds the capacity in its own planner."""

    @abc.abstractmethod
    def reserve(self, request: ReservationRequest) -> str:
        """Create (or update) a native reservation; returns what the backend says of it in words.

        Raises:
            Unsupported: this request cannot be held natively (e.g. the pool maps no account);
                the gateway then holds it in its own planner.
            BackendUnavailable, BackendForbidden, SubmissionRejected: as for :meth:`Backend.submit`.
        """
        ...

    @abc.abstractmethod
    def unreserve(self, name: str) -> None:
        """Delete the native reservation ``name``; an unknown one is silently ignored."""
        ...

    @abc.abstractmethod
    def gateway_reservations(self) -> list[str]:
        """The names of the native reservations the gateway made here (prefix
        ``GATEWAY_RESERVATION_PREFIX``) that have not ended."""
        ...


@runtime_checkable
class WithPreemptSignal(Protocol):
    """``Feature.PREEMPT_SIGNAL``: the backend can warn a job before the gateway stops it (Slurm:
    ``SIGUSR1``); the gateway cancels the job itself at the deadline. Without it the gateway
    calls :meth:`Backend.preempt`, which stops the job by itself."""

    @abc.abstractmethod
    def signal_preempt(self, backend_job_id: str, grace_s: float) -> str:
        """Tell a running job it will be stopped in ``grace_s`` seconds; returns what was done, in
        words for the job's history. A finished or unknown job is not an error."""
        ...


@runtime_checkable
class WithNodeHealth(Protocol):
    """``Feature.NODE_HEALTH``: the backend says which nodes of the pool it has out of service
    and why (Slurm: DOWN, DRAIN, FAIL with the node's reason; Kubernetes: NotReady, cordoned,
    a failing condition). The gateway's node-health rule counts them (docs/recovery.md)."""

    @abc.abstractmethod
    def node_problems(self) -> dict[str, str]:
        """Node name -> the backend's reason, for every node of the pool out of service now.

        Raises BackendUnavailable when the backend cannot be asked."""
        ...


@runtime_checkable
class WithNodeDrain(Protocol):
    """``Feature.NODE_DRAIN``: the gateway may take a suspect node out of service in its backend
    (Slurm: ``state=drain reason=...``; Kubernetes: a cordon with the reason in an annotation),
    and put back one it took out. A pool's settings allow it (``drain_suspect_nodes``)."""

    @abc.abstractmethod
    def drain_node(self, node: str, reason: str) -> None:
        """Stop new work landing on ``node``; running work is left alone. Raises BackendError."""
        ...

    @abc.abstractmethod
    def resume_node(self, node: str) -> None:
        """Undo :meth:`drain_node` (only when the gateway drained it). Raises BackendError."""
        ...


# Each optional interface and why a backend without it cannot (words for the user; a backend's
# own ``unsupported()`` may say it better).
INTERFACES: Mapping[Feature, type] = MappingProxyType({
    Feature.WATCH: WithWatch,
    Feature.OUTPUT_FILES: WithOutputFiles,
    Feature.OUTPUT_STREAM: WithOutputStream,
    Feature.LISTING: WithJobListing,
    Feature.RESERVATIONS: WithReservations,
    Feature.PREEMPT_SIGNAL: WithPreemptSignal,
    Feature.NODE_HEALTH: WithNodeHealth,
    Feature.NODE_DRAIN: WithNodeDrain,
})
_WHY_NOT = {
    Feature.WATCH: "this backend has no change feed",
    Feature.OUTPUT_FILES: "this pool's job output is not readable by the gateway",
    Feature.OUTPUT_STREAM: "this pool serves no job output",
    Feature.LISTING: "listing jobs is not supported",
    Feature.RESERVATIONS: "{name} has no advance reservations of its own",
    Feature.PREEMPT_SIGNAL: "this backend has no signal before a stop",
    Feature.NODE_HEALTH: "{name} does not say which of its nodes are out of service",
    Feature.NODE_DRAIN: "the gateway cannot take {name}'s nodes out of service",
}


@dataclasses.dataclass(frozen=True)
class Features:
    """What one backend can do, as :func:`features_of` found it."""

    backend: str  # its name (kind)
    node_exclusive: bool  # Backend.node_exclusive
    missing: Mapping[Feature, str]  # every feature it lacks -> why, in words for the user

    def has(self, feature: Feature) -> bool:
        return feature not in self.missing

    def why_not(self, feature: Feature) -> str:
        """Why the backend lacks ``feature``; "" when it has it."""
        return self.missing.get(feature, "")

    def require(self, feature: Feature) -> None:
        """Raise Unsupported, with the reason, unless the backend has ``feature``."""
        if feature in self.missing:
            raise Unsupported(self.missing[feature], backend=self.backend)


def features_of(backend: Backend | type[Backend] | str | None) -> Features:
    """The one way to ask what a backend can do: of a built backend (its settings and transport
    count), of an adapter class, or of a pool kind (the adapter registered for it; an unknown
    kind or None has no optional feature). A class or a kind knows only what every pool of the
    adapter has: use the backend when there is one."""
    if backend is None or isinstance(backend, (str, type)):
        return _class_features(_adapter_or_none(backend) if isinstance(backend, str) else backend)
    declared = dict(backend.unsupported())
    name = backend.name
    missing = {f: declared.pop(f, "") or _WHY_NOT[f].format(name=name)
               for f, interface in INTERFACES.items() if not isinstance(backend, interface)}
    missing.update(declared)
    return Features(name, bool(backend.node_exclusive), MappingProxyType(missing))


@functools.lru_cache(maxsize=64)
def _class_features(cls: type | None) -> Features:
    name = getattr(cls, "name", "") or ""
    missing = {f: _WHY_NOT[f].format(name=name) for f, interface in INTERFACES.items()
               if cls is None or not issubclass(cls, interface)}
    return Features(name, bool(getattr(cls, "node_exclusive", False)), MappingProxyType(missing))


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


# Where each pool KIND's adapter lives (never a pool name). Importing it registers the adapter
# class here (register()). Imported lazily: a site without Kubernetes pools never loads the
# Kubernetes adapter, and the adapters load their SDKs lazily in turn.
ADAPTER_MODULES: Mapping[str, str] = MappingProxyType({"slurm": "adapters.slurm", "kubernetes": "adapters.kubernetes"})


def adapter_class(kind: str) -> type[Backend]:
    """The adapter registered for pools of ``kind``. Raises KeyError for a kind there is none of."""
    if kind not in _REGISTRY:
        importlib.import_module(ADAPTER_MODULES[kind])
    return _REGISTRY[kind]


def _adapter_or_none(kind: str) -> type[Backend] | None:
    return adapter_class(kind) if kind in _REGISTRY or kind in ADAPTER_MODULES else None
