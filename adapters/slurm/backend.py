"""SlurmBackend: the contract in adapters/base.py over a REST or CLI transport.

Its settings (``SlurmSettings``) are in settings.py; this module builds the transport they
name (``make_transport``) and speaks the contract over it."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Generic, TypeVar

from adapters.base import (
    GATEWAY_RESERVATION_PREFIX,
    Backend,
    BackendError,
    BackendUnavailable,
    Capacity,
    Feature,
    JobNotFound,
    JobStatus,
    ReservationRequest,
    SubmissionRejected,
    SubmitRequest,
    SubmitResult,
    Unsupported,
    WithJobListing,
    WithNodeDrain,
    WithNodeHealth,
    WithOutputFiles,
    WithPreemptSignal,
    WithReservations,
    register,
    site_gpu_type,
)
from adapters.slurm import job_record, parse, script
from adapters.slurm.errors import AmbiguousSubmit
from adapters.slurm.script import ReservationSpec, build_spec, worker_output_path
from adapters.slurm.settings import SLURM_NAME, SlurmSettings
from adapters.slurm.token import KeyTokenSource, TokenSource
from adapters.slurm.transport import Transport

log = logging.getLogger(__name__)


def make_scontrol(settings: SlurmSettings) -> Transport:
    """The CLI transport for what only ``scontrol`` does on this cluster (writing reservations
    before slurmrestd v0.0.43), whatever transport jobs go through."""
    from adapters.slurm.cli import CliTransport

    extra = {"path": f"{settings.slurm_bin_dir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:"
                     f"/usr/bin:/sbin:/bin"} if settings.slurm_bin_dir else {}
    return CliTransport(slurm_conf=settings.slurm_conf, prefix=settings.cli_prefix,
                        timeout_s=max(settings.timeout_s, 30.0),
                        admin_user=settings.cli_admin_user, **extra)


def make_transport(settings: SlurmSettings) -> Transport:
    if settings.transport == "rest":
        from adapters.slurm.rest import RestTransport  # httpx only when used

        if settings.token is not None:
            tok = settings.token
            source: TokenSource = tok if callable(tok) else (lambda: tok)  # type: ignore[assignment]
        elif settings.jwt_key_path:
            source = KeyTokenSource(settings.jwt_key_path, username=settings.jwt_user)
        else:
            raise ValueError("REST transport needs jwt_key_path or token")
        return RestTransport(settings.rest_url, source, token_user=settings.jwt_user,
                             timeout_s=settings.timeout_s,
                             connect_timeout_s=settings.connect_timeout_s,
                             api_version=settings.api_version)
    if settings.transport == "cli":
        return make_scontrol(settings)
    if settings.transport == "pyslurm":
        from adapters.slurm.pyslurm_transport import PyslurmTransport

        return PyslurmTransport(slurm_conf=settings.slurm_conf,
                                timeout_s=max(settings.timeout_s, 30.0))
    raise ValueError(f"unknown Slurm transport {settings.transport!r}")


T = TypeVar("T")


class TimedRead(Generic[T]):
    """A backend read served from memory for ``ttl_s``: a failed read keeps the last good value
    (``empty`` before the first), says why, and is tried again after the same time."""

    def __init__(self, what: str, ttl_s: float, read: Callable[[], T], empty: T):
        self.what, self.ttl_s, self._read = what, ttl_s, read
        self._value, self._error, self._at = empty, "", None
        self._lock = threading.Lock()

    def get(self, partition: str) -> tuple[T, str]:
        with self._lock:
            if self._at is None or time.monotonic() - self._at >= self.ttl_s:
                try:
                    self._value, self._error = self._read(), ""
                except BackendError as exc:
                    log.warning("Slurm %s: reading %s failed: %s", partition, self.what, exc.message)
                    self._error = exc.message
                self._at = time.monotonic()
            return self._value, self._error

    def expire(self) -> None:
        """Read again on the next get() (e.g. right after a change the gateway made)."""
        with self._lock:
            self._at = None


@register
class SlurmBackend(Backend, WithOutputFiles, WithJobListing, WithReservations, WithPreemptSignal, WithNodeHealth,
                   WithNodeDrain):
    """A Slurm cluster (one partition) behind the gateway."""

    name = "slurm"
    settings_class = SlurmSettings
    code_only_settings = frozenset({"token"})  # a token source object, for tests and embedding
    # Every transport submits with --exclusive (cli.py, rest.py, pyslurm_worker.py).
    node_exclusive = True
    storage_providers = ("shared",)
    UNSUPPORTED = MappingProxyType({
        Feature.CONTAINER_IMAGE: "this Slurm pool runs commands on the nodes' own OS; "
                                 "container images are not configured (no pyxis/enroot)",
        Feature.PRIORITY: "Slurm orders jobs by the site's priority policy; the gateway "
                          "does not override it",
        Feature.WATCH: "Slurm has no change feed; the gateway polls status()",
        Feature.MOUNT_PATHS: "a Slurm job sees storage where the nodes' shared file system has it, "
                             "not at a path of its choosing",
    })

    def unsupported(self) -> Mapping[Feature, str]:
        # The same on every transport: what one cannot do itself (write reservations, read the
        # topology, drain a node) goes through scontrol (_cli), and each one signals a job.
        if not self.settings.drain_suspect_nodes:
            return {**self.UNSUPPORTED, Feature.NODE_DRAIN: "this pool's settings do not let the gateway drain "
                                                            "nodes (drain_suspect_nodes: false)"}
        return self.UNSUPPORTED

    # ------------------------------------------------------------------ node health

    # Node states that take a node out of service (docs/recovery.md, "Node health").
    OUT_OF_SERVICE = frozenset({"DOWN", "DRAIN", "DRAINED", "DRAINING", "FAIL", "FAILING", "NOT_RESPONDING"})

    def node_problems(self) -> dict[str, str]:
        """The partition's nodes that Slurm has down, drained or failing, with the node's reason."""
        nodes = self._transport.nodes()
        mine = set(parse.partition_nodes(nodes, self.settings.partition))
        out = {}
        for node in nodes:
            name = str(node.get("name") or "")
            states = parse.node_states(node)
            if name in mine and states & self.OUT_OF_SERVICE:
                why = str(node.get("reason") or "").strip()
                out[name] = "+".join(sorted(states)) + (f" ({why})" if why else "")
        return out

    def drain_node(self, node: str, reason: str) -> None:
        (name,) = script.node_names([node])
        # One line, no quotes to confuse scontrol's own parsing (argv, never a shell).
        self._cli().update_node(name, "DRAIN", reason=" ".join(reason.replace('"', "'").split())[:200])

    def resume_node(self, node: str) -> None:
        (name,) = script.node_names([node])
        self._cli().update_node(name, "RESUME")

    def __init__(self, settings: SlurmSettings | None = None, *, transport: Transport | None = None,
                 **kwargs):
        self.settings = settings or SlurmSettings(**kwargs)
        self._transport = transport or make_transport(self.settings)
        # How long submit() looks for a job whose submission answer was lost.
        self.reconcile_delays_s: tuple[float, ...] = (0.5, 1.0, 2.0)
        # job id -> comment of jobs seen in slurmctld (comments never change).
        self._comments: dict[str, str] = {}
        self._comments_lock = threading.Lock()
        # GPU types as the nodes' gres spell them (learned from capacity()).
        self._gpu_types: tuple[str, ...] | None = None
        # capacity() runs every dispatch round, and reservations change only when an admin runs
        # scontrol: one read per RESERVATIONS_TTL_S per backend keeps their cost to a few cheap
        # requests a minute, and a new maintenance reaches the planner within that time. The cache
        # holds the raw records, so which have ended, and which nodes are the partition's, is
        # decided afresh on every call. The topology changes only when the site edits
        # topology.conf and reconfigures.
        self._reservations = TimedRead("reservations", self.RESERVATIONS_TTL_S,
                                       lambda: list(self._transport.reservations()), [])
        self._domains = TimedRead("the network topology", self.TOPOLOGY_TTL_S,
                                  lambda: parse.topology_text(self._cli().topology()), [])
        self._scontrol: Transport | None = None  # reservations before slurmrestd v0.0.43, the topology

    @property
    def transport(self) -> Transport:
        return self._transport

    # ------------------------------------------------------------------ helpers

    def _slurm_account(self, account: str) -> str | None:
        amap = self.settings.account_map
        if amap is None:
            return None
        if amap == "same":
            return account
        mapped = amap(account) if callable(amap) else amap.get(account)  # type: ignore[union-attr]
        if not mapped:
            raise SubmissionRejected(f"no Slurm account is mapped for account {account!r}",
                                     backend=self.name)
        return mapped

    # --------------------------------------------------------------- contract

    def submit(self, request: SubmitRequest) -> SubmitResult:
        self.check_supported(request)
        # Listing jobs to find a duplicate is most of a submit's cost on Slurm (no server-side
        # filter by comment); on a first attempt the gateway guarantees there is none.
        if not request.first_attempt:
            existing = self.find_by_gateway_id(request.gateway_job_id, request=request)
            if existing is not None:
                return SubmitResult(existing.backend_job_id, adopted=True)
        if request.gpu_type:
            if self._gpu_types is None:
                self.capacity()
            request = dataclasses.replace(request, gpu_type=site_gpu_type(request.gpu_type, self._gpu_types or ()))
        spec = build_spec(request, partition=self.settings.partition,
                          account=self._slurm_account(request.account),
                          work_dir=self.settings.work_dir)
        try:
            job_id = self._transport.submit(spec, self.settings.job_environment)
            with self._comments_lock:
                self._comments[job_id] = spec.comment
            return SubmitResult(job_id)
        except AmbiguousSubmit as exc:
            # The request left; the job may exist. Look before anyone retries, so a
            # lost answer never turns into a second job.
            for delay in self.reconcile_delays_s:
                time.sleep(delay)
                try:
                    found = self.find_by_gateway_id(request.gateway_job_id, request=request)
                except BackendUnavailable:
                    continue
                if found is not None:
                    return SubmitResult(found.backend_job_id, adopted=False)
            raise BackendUnavailable(
                f"submission outcome unknown ({exc.message}); retrying submit() adopts the "
                f"job if it was created", backend=self.name) from exc

    def output_file(self, gateway_job_id: str, worker: int) -> str:
        return worker_output_path(self.settings.output_dir or self.settings.work_dir, gateway_job_id, int(worker))

    def status(self, backend_job_id: str) -> JobStatus:
        if not str(backend_job_id).isdigit():
            raise JobNotFound(f"{backend_job_id!r} is not a Slurm job id", backend=self.name)
        record = self._transport.job(str(backend_job_id))
        if record is None:
            raise JobNotFound(
                f"Slurm job {backend_job_id} is unknown to slurmctld (finished jobs are "
                f"kept only for MinJobAge)", backend=self.name)
        return job_record.job_status(record)

    def cancel(self, backend_job_id: str) -> None:
        if not str(backend_job_id).isdigit():
            return
        self._transport.cancel(str(backend_job_id))

    def signal_preempt(self, backend_job_id: str, grace_s: float) -> str:
        """``SIGUSR1`` to the batch shell and its children: srun, which the batch script execs,
        forwards it to every task of the gang (what Lightning's Slurm auto-requeue handler
        listens for). The gateway cancels the job itself at the deadline (docs/recovery.md;
        Slurm's own cancel then sends SIGTERM to every step and SIGKILL after KillWait)."""
        if str(backend_job_id).isdigit():
            self._transport.signal(str(backend_job_id), "USR1")
        return (f"SIGUSR1 sent to Slurm job {backend_job_id} (its batch shell and every task); it is cancelled in "
                f"{grace_s:.0f} s (SIGTERM to its steps, SIGKILL after the cluster's KillWait)")

    def capacity(self) -> Capacity:
        """The configured partition only: jobs go nowhere else. A partition the cluster does
        not have is an error, never an empty (or another partition's) "idle" pool.

        Its ``windows`` are the Slurm reservations that have not ended and take nodes of the
        partition (read at most every RESERVATIONS_TTL_S); a node of one that has started is
        not idle."""
        nodes = self._transport.nodes()
        records, error = self._reservation_records()
        now = datetime.now(UTC)
        # The gateway's own reservations are not windows: the gateway plans them as holds, and
        # their nodes are free to the planner, which keeps them for the holds' accounts.
        ours = [str(r.get("name") or "").startswith(GATEWAY_RESERVATION_PREFIX) for r in records]
        mine_nodes = parse.partition_nodes(nodes, self.settings.partition)
        windows = parse.windows([r for r, o in zip(records, ours, strict=True) if not o], mine_nodes, now=now)
        own = {n for w in parse.windows([r for r, o in zip(records, ours, strict=True) if o], mine_nodes, now=now)
               if w.start <= now for n in w.nodes}
        # slurmctld flags the nodes of a reservation that has started (MAINTENANCE, RESERVED)
        # only in its background cycle, up to ~5 s later (seen on 22.05 .. 26.05): until then
        # they look idle, so count them taken here, as the contract's snapshot promises.
        taken = {n for w in windows if w.start <= now for n in w.nodes}
        pools = parse.pool_capacity(nodes, reserved=taken, held=own - taken)
        domains, topo_error = self._topology()
        idle = {str(n.get("name")) for n in nodes if parse.node_idle(n, reserved=taken, held=own - taken)}
        topology = parse.topology(domains, mine_nodes, idle)
        mine = tuple(p for p in pools if p.pool == self.settings.partition)
        if not mine:
            have = ", ".join(p.pool for p in pools) or "none"
            raise BackendUnavailable(f"partition {self.settings.partition!r} does not exist on this cluster "
                                     f"(partitions: {have})", backend=self.name)
        self._gpu_types = tuple(sorted({t for p in mine for t in p.gpu_types}))
        note = f"; Slurm reservations could not be read ({error})" if error else ""
        note += f"; the network topology could not be read ({topo_error})" if topo_error else ""
        mine = tuple(dataclasses.replace(p, windows=windows, topology=topology, detail=p.detail + note) for p in mine)
        return Capacity(backend=self.name, pools=mine)

    RESERVATIONS_TTL_S = 15.0
    TOPOLOGY_TTL_S = 300.0

    def _reservation_records(self) -> tuple[list[Mapping], str]:
        """The reservation records (at most RESERVATIONS_TTL_S old) and why the last read failed.

        A failed read never fails capacity(): the nodes' own states already show what an
        active reservation takes, so the pool stays usable with the last records read (none
        at first), and the failure is retried after the same TTL.
        """
        return self._reservations.get(self.settings.partition)

    # ------------------------------------------------- the gateway's own reservations

    def _cli(self) -> Transport:
        """The transport for what only ``scontrol`` does: the CLI one, or one made for that."""
        if self._transport.name == "cli":
            return self._transport
        if self._scontrol is None:
            self._scontrol = make_scontrol(self.settings)
        return self._scontrol

    def _reservation_writer(self) -> Transport:
        """slurmrestd where it writes reservations (v0.0.43+: Slurm 25.11 and later), else scontrol."""
        return self._transport if self._transport.writes_reservations() else self._cli()

    def _topology(self) -> tuple[list[tuple[str, str, tuple[str, ...]]], str]:
        """The cluster's blocks or leaf switches (at most TOPOLOGY_TTL_S old), and why the last
        read failed (the last good read is kept; none yet: no domains)."""
        return self._domains.get(self.settings.partition)

    def reserve(self, request: ReservationRequest) -> str:
        """A Slurm reservation of ``request.nodes`` whole nodes of the partition for the job's
        Slurm account (``Accounts=``): jobs of that account name it (``--reservation``); Slurm
        runs nobody else's jobs on its nodes while it lasts."""
        if not request.name.startswith(GATEWAY_RESERVATION_PREFIX) or not SLURM_NAME.fullmatch(request.name):
            raise SubmissionRejected(f"not a gateway reservation name: {request.name!r}", backend=self.name)
        account = self._slurm_account(request.account)
        if account is None:
            raise Unsupported("this pool submits jobs without a Slurm account (account_map is null), so a Slurm "
                              "reservation could not tell the account's jobs from others': the gateway holds the "
                              "capacity in its own planner", backend=self.name)
        writer = self._reservation_writer()
        self.forget_reservations()
        records, error = self._reservation_records()
        if not error and any(str(r.get("name") or "") == request.name for r in records):
            # Made before (a sync that crashed before noting it): the gateway never changes one,
            # and Slurm refuses to move the start of one under way.
            return f"Slurm reservation {request.name} (already there)"
        how = writer.create_reservation(ReservationSpec(
            name=request.name, partition=self.settings.partition, accounts=(account,), node_count=request.nodes,
            start=request.start, end=request.end))
        self.forget_reservations()
        return (f"Slurm reservation {request.name} ({request.nodes} nodes of {self.settings.partition} for Slurm "
                f"account {account}, made with {how})")

    def unreserve(self, name: str) -> None:
        if not name.startswith(GATEWAY_RESERVATION_PREFIX) or not SLURM_NAME.fullmatch(name):
            return  # never anybody else's
        self._reservation_writer().delete_reservation(name)
        self.forget_reservations()

    def gateway_reservations(self) -> list[str]:
        records, error = self._reservation_records()
        if error:
            raise BackendUnavailable(f"Slurm reservations could not be read ({error})", backend=self.name)
        now = datetime.now(UTC)
        out = []
        for r in records:
            name = str(r.get("name") or "")
            end = parse.number(r.get("end_time"))
            if name.startswith(GATEWAY_RESERVATION_PREFIX) and not (end and 0 < end <= now.timestamp()):
                out.append(name)
        return sorted(out)

    def forget_reservations(self) -> None:
        """Read the reservations again on the next capacity() (e.g. right after creating one)."""
        self._reservations.expire()

    # Clock difference tolerated between the gateway and slurmctld in the submit-window check.
    SUBMIT_WINDOW_SLACK_S = 60.0

    def _submitted_by_gateway(self, record: Mapping, request: SubmitRequest | None) -> bool:
        """Whether a job carrying a gateway id's comment is the gateway's submission.

        Any Slurm user can submit with ``--comment=isthmus:<id>``; only the gateway submits
        to its partition as the mapped user after the gateway job existed.
        """
        if str(record.get("partition") or "") != self.settings.partition:
            return False
        if request is None:
            return True
        if job_record.submitted_by(record) != request.user:
            return False
        account = self._slurm_account(request.account)
        if account is not None and str(record.get("account") or "") != account:
            return False
        if request.submitted_after is not None:
            # A requeue resets Slurm's submit time to the requeue: still inside the window.
            submitted = parse.timestamp(record.get("submit_time"))
            earliest = request.submitted_after.timestamp() - self.SUBMIT_WINDOW_SLACK_S
            if submitted is None or submitted.timestamp() < earliest:
                return False
        return True

    def find_by_gateway_id(self, gateway_job_id: str, *, request: SubmitRequest | None = None) -> JobStatus | None:
        comment = job_record.gateway_comment(gateway_job_id, request.attempt if request is not None else 1)
        with self._comments_lock:
            known = dict(self._comments)
        current = self._transport.comments(known)
        with self._comments_lock:
            self._comments = dict(current)  # forget jobs slurmctld no longer holds
        matches = [job_id for job_id, c in current.items() if c == comment]
        for job_id in sorted(matches, key=lambda j: int(j) if j.isdigit() else 0, reverse=True):
            record = self._transport.job(job_id)
            # The owner may edit a comment after we cached it: check the record's own.
            if (record is not None and job_record.gateway_id_of(record) == gateway_job_id
                    and self._submitted_by_gateway(record, request)):
                return job_record.job_status(record)
        return None

    def list_gateway_jobs(self) -> Iterable[JobStatus]:
        return [job_record.job_status(r) for r in self._transport.jobs() if job_record.gateway_id_of(r)]

    def close(self) -> None:
        self._transport.close()
