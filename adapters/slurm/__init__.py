"""Slurm backend: ``SlurmBackend`` over slurmrestd (REST) or the Slurm CLIs."""

from adapters.slurm.backend import SlurmBackend, SlurmSettings, read_env_file

__all__ = ["SlurmBackend", "SlurmSettings", "read_env_file"]
