"""Slurm backend: ``SlurmBackend`` over slurmrestd (REST) or the Slurm CLIs."""

from adapters.slurm.backend import SlurmBackend
from adapters.slurm.settings import SlurmSettings

__all__ = ["SlurmBackend", "SlurmSettings"]
