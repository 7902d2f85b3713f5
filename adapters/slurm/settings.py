"""Plain settings for the Slurm backend (no gateway imports): ``SlurmSettings``, the checks
that need no cluster (``problems``) and the local cluster's env file (``from_env_file``)."""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Literal

from adapters.envfile import read_env_file

AccountMap = Mapping[str, str] | Callable[[str], str | None] | Literal["same"] | None
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
_URL = re.compile(r"https?://[A-Za-z0-9.\-\[\]:]+(:\d{1,5})?/?")
SLURM_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")  # a partition or reservation name


def _readable_file(field: str, path: str) -> list[tuple[str, str]]:
    p = Path(path)
    if not p.is_file():
        return [(field, f"no such file: {path}")]
    if not os.access(p, os.R_OK):
        return [(field, f"not readable by this user: {path}")]
    return []


@dataclasses.dataclass(frozen=True)
class SlurmSettings:
    """Plain settings; the gateway builds these from its own configuration.

    Attributes:
        transport: "rest" (slurmrestd, preferred), "cli" (sbatch/squeue/scancel) or
            "pyslurm" (libslurm in a child process; Slurm 25.11 only, docs/slurm.md).
        rest_url: slurmrestd base URL, e.g. ``http://127.0.0.1:16820``.
        jwt_key_path: the cluster's HS256 key; the adapter signs short-lived tokens
            for ``jwt_user`` with it. Alternatively pass ``token``.
        token: a token string or a callable returning one (e.g. ``scontrol token``
            output refreshed elsewhere), used instead of ``jwt_key_path``.
        jwt_user: identity the token is for; must be SlurmUser (or root) so that
            ``X-SLURM-USER-NAME`` may name the job's user.
        api_version: force one of v0.0.38/40/41/42 instead of negotiating.
        partition: the partition jobs go to.
        account_map: gateway account -> Slurm account. None: submit without an account;
            "same": use the gateway account; a dict or callable for anything else
            (a dict without the key, or a callable returning None, rejects the job).
        work_dir: job working directory, writable by every mapped user; the batch
            script's output goes to ``<work_dir>/slurm-<jobid>.out`` and each worker's to
            ``<work_dir>/isthmus-<gateway id>-worker-<N>.out`` (docs/logs.md).
        output_dir: where the gateway host mounts ``work_dir`` (None: the same path), to
            read the workers' output files.
        slurm_conf: SLURM_CONF for the CLI and pyslurm transports.
        cli_prefix: argv (or shell-style string) put before every command, e.g.
            ``chroot /var/cache/isthmus/slurm-24.11/root``.
        cli_admin_user: user for CLI queries and scancel (None: the gateway's user).
        slurm_bin_dir: where this cluster's Slurm commands are when they are not on the
            default PATH (a Slurm built into a prefix): the CLI runs them from there and
            jobs get it first on their PATH, so ``srun`` in the job is the same version.
        job_environment: base environment of every job (REST ``environment``; CLI:
            the environment sbatch exports). The request's env is added in the script.
        timeout_s / connect_timeout_s: per call.
        drain_suspect_nodes: the gateway drains a node its node-health rule finds suspect
            (``scontrol update state=drain reason="isthmus: ..."``, as ``cli_admin_user``, who
            must be root, SlurmUser or a Slurm operator) and resumes it when an admin clears
            it (docs/recovery.md, "Node health"). Off: the gateway only keeps its own gangs
            off the node (``--exclude``).
    """

    transport: Literal["rest", "cli", "pyslurm"] = "rest"
    rest_url: str = ""
    jwt_key_path: str | None = None
    token: str | Callable[[], str] | None = None
    jwt_user: str = "slurm"
    api_version: str | None = None
    partition: str = "gpu"
    account_map: AccountMap = None
    work_dir: str = "/tmp"
    output_dir: str | None = None
    slurm_conf: str | None = None
    cli_prefix: tuple[str, ...] | str = ()
    cli_admin_user: str | None = None
    slurm_bin_dir: str | None = None
    job_environment: Mapping[str, str] = dataclasses.field(
        default_factory=lambda: {"PATH": DEFAULT_PATH})
    timeout_s: float = 10.0
    connect_timeout_s: float = 3.0
    drain_suspect_nodes: bool = False

    def problems(self) -> list[tuple[str, str]]:
        """(field, why) for settings that cannot work, checked without contacting the cluster."""
        out: list[tuple[str, str]] = []
        if self.transport == "rest":
            if not _URL.fullmatch(self.rest_url or ""):
                out.append(("rest_url", f"needs an http(s)://host:port URL of slurmrestd, got {self.rest_url!r}"))
            if self.token is None and not self.jwt_key_path:
                out.append(("jwt_key_path", "the REST transport needs the cluster's JWT key file (or a token)"))
        if self.jwt_key_path and self.token is None and self.transport == "rest":
            out += _readable_file("jwt_key_path", self.jwt_key_path)
        if self.slurm_conf and self.transport == "cli" and not self.cli_prefix:
            out += _readable_file("slurm_conf", self.slurm_conf)
        if not SLURM_NAME.fullmatch(self.partition or ""):
            out.append(("partition", f"not a Slurm partition name: {self.partition!r}"))
        if not (self.work_dir or "").startswith("/"):
            out.append(("work_dir", f"must be an absolute path on the nodes, got {self.work_dir!r}"))
        if self.output_dir is not None and not self.output_dir.startswith("/"):
            out.append(("output_dir", f"must be an absolute path on the gateway host, got {self.output_dir!r}"))
        for name in ("timeout_s", "connect_timeout_s"):
            if getattr(self, name) <= 0:
                out.append((name, "must be > 0"))
        return out

    @classmethod
    def from_env_file(cls, path: str | Path, **overrides) -> SlurmSettings:
        """Settings for a local cluster from the env file stack/slurm/up.sh writes."""
        env = read_env_file(path)
        bin_dir = env.get("SLURM_BIN_DIR") or None
        job_path = f"{bin_dir}:{DEFAULT_PATH}" if bin_dir else DEFAULT_PATH
        base: dict = {
            "rest_url": env["SLURMRESTD_URL"],
            "jwt_key_path": env["SLURM_JWT_KEY"],
            "jwt_user": env.get("SLURM_JWT_USER", "slurm"),
            "partition": env.get("SLURM_PARTITION", "gpu"),
            "work_dir": env["SLURM_WORK_DIR"],
            "slurm_conf": env["SLURM_CONF"],
            "cli_prefix": tuple(shlex.split(env.get("SLURM_CLI_PREFIX", ""))),
            # srun inside the job must find this cluster's (non-default) slurm.conf.
            "job_environment": {"PATH": job_path, "SLURM_CONF": env["SLURM_CONF"]},
            "slurm_bin_dir": bin_dir,
        }
        base.update(overrides)
        return cls(**base)
