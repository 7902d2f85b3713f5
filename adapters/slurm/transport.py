"""The internal interface both transports (REST, CLI) implement."""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import Any

from adapters.base import Unsupported
from adapters.slurm.script import JobSpec, ReservationSpec

Record = Mapping[str, Any]


class Transport(abc.ABC):
    """Talks to one Slurm cluster. Raises only :mod:`adapters.base` errors."""

    name: str = ""

    @abc.abstractmethod
    def submit(self, spec: JobSpec, environment: Mapping[str, str]) -> str:
        """Submit as ``spec.user``; return the Slurm job id.

        Raises AmbiguousSubmit when the request left but the answer did not arrive.
        """

    @abc.abstractmethod
    def jobs(self) -> list[Record]:
        """Every job slurmctld still holds in memory (finished ones for MinJobAge)."""

    def job(self, job_id: str) -> Record | None:
        for rec in self.jobs():
            if str(rec.get("job_id")) == str(job_id):
                return rec
        return None

    def comments(self, known: Mapping[str, str]) -> dict[str, str]:
        """``job id -> comment`` of every job slurmctld holds: the idempotency look-up.

        ``known`` is what an earlier call returned; comments never change, so a
        transport may fetch only the jobs it has not seen (much cheaper than listing
        every full job record on each submit).
        """
        return {str(r.get("job_id")): str(r.get("comment") or "") for r in self.jobs()}

    @abc.abstractmethod
    def cancel(self, job_id: str) -> None:
        """Cancel; a finished or unknown job is silently ignored (``errors.stop``)."""

    @abc.abstractmethod
    def signal(self, job_id: str, signal: str) -> None:
        """Send ``signal`` (e.g. ``USR1``) to the job's batch shell and its children (``scancel
        --batch``): srun, which the batch script execs, forwards it to every task of the gang.
        A finished or unknown job is silently ignored (``errors.stop``). Every transport can:
        SlurmBackend offers ``Feature.PREEMPT_SIGNAL`` whichever one it uses."""

    @abc.abstractmethod
    def nodes(self) -> list[Record]:
        """Every node record (state, gres, partitions)."""

    @abc.abstractmethod
    def reservations(self) -> list[Record]:
        """Every reservation slurmctld holds, ended ones included; ``[]`` when there are none.

        Returns:
            Records in the shape of Slurm's JSON reservation record, which
            :func:`adapters.slurm.parse.windows` reads: ``name``, ``node_list`` (a hostlist),
            ``start_time`` / ``end_time`` (epoch seconds, plain or as a ``{"set", "infinite",
            "number"}`` struct; None or infinite: no end), ``flags`` (Slurm's names, e.g.
            ``MAINT``), ``users`` / ``accounts`` / ``groups`` (lists or comma-separated).

        Raises:
            BackendUnavailable, BackendForbidden: as for :meth:`nodes`.
        """

    def writes_reservations(self) -> bool:
        """Whether :meth:`create_reservation` can work here (without trying it)."""
        return False

    def create_reservation(self, spec: ReservationSpec) -> str:
        """Create the gateway's reservation ``spec.name`` (the backend asks only when it has none
        of that name).

        Raises:
            Unsupported: this transport cannot (the backend then uses scontrol).
            BackendUnavailable, BackendForbidden, SubmissionRejected: Slurm's refusal.
        """
        raise Unsupported(f"the {self.name} transport cannot create reservations", backend="slurm")

    def delete_reservation(self, name: str) -> None:
        """Delete reservation ``name``; an unknown one is silently ignored."""
        raise Unsupported(f"the {self.name} transport cannot delete reservations", backend="slurm")

    def update_node(self, node: str, state: str, reason: str = "") -> None:
        """``scontrol update nodename=<node> state=<state> [reason=<reason>]`` (drain, resume):
        the CLI transport; the backend goes through scontrol for the others."""
        raise Unsupported(f"the {self.name} transport cannot update nodes", backend="slurm")

    def topology(self) -> str:
        """``scontrol show topology``'s text (no API has it): the CLI transport only."""
        raise Unsupported(f"the {self.name} transport cannot read the topology", backend="slurm")

    def describe(self) -> str:
        return self.name

    def close(self) -> None:
        pass
