"""The internal interface both transports (REST, CLI) implement."""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import Any

from adapters.slurm.script import JobSpec

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

    @abc.abstractmethod
    def cancel(self, job_id: str) -> None:
        """Cancel; a finished or unknown job is silently ignored."""

    @abc.abstractmethod
    def nodes(self) -> list[Record]:
        """Every node record (state, gres, partitions)."""

    def describe(self) -> str:
        return self.name

    def close(self) -> None:
        pass
