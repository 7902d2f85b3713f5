"""pyslurm transport: a stub that says why it cannot work here.

pyslurm links against libslurm and each pyslurm release builds only against the Slurm
major.minor it was made for (its setup refuses any other). The package index carries
pyslurm 25.11.x (and ancient 17.x/18.x); Debian carries Slurm 22.05, 24.11 and 26.05.
No pair matches, so this transport imports pyslurm lazily and refuses with that reason.
"""

from __future__ import annotations

from collections.abc import Mapping

from adapters.base import Unsupported
from adapters.slurm.script import JobSpec
from adapters.slurm.transport import Record, Transport

REASON = ("pyslurm is unavailable: each pyslurm release builds only against its own Slurm "
          "major.minor (PyPI has 25.11.x; this site runs Slurm 22.05/24.11/26.05), so no "
          "matching pyslurm/Slurm pair exists; use transport 'rest' or 'cli'")


class PyslurmTransport(Transport):
    name = "pyslurm"

    def __init__(self) -> None:
        try:
            import pyslurm  # noqa: F401  (lazy: heavy, libslurm-version-bound)
        except ImportError as exc:
            raise Unsupported(REASON, backend="slurm", detail=str(exc)) from exc
        # A matching pair would land here; the calls below are not written because they
        # could not be tested against a real cluster.
        raise Unsupported("pyslurm imported, but the pyslurm transport is not implemented; "
                          "use 'rest' or 'cli'", backend="slurm")

    def submit(self, spec: JobSpec, environment: Mapping[str, str]) -> str:  # pragma: no cover
        raise Unsupported(REASON, backend="slurm")

    def jobs(self) -> list[Record]:  # pragma: no cover
        raise Unsupported(REASON, backend="slurm")

    def cancel(self, job_id: str) -> None:  # pragma: no cover
        raise Unsupported(REASON, backend="slurm")

    def nodes(self) -> list[Record]:  # pragma: no cover
        raise Unsupported(REASON, backend="slurm")
