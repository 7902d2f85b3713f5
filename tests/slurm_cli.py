"""Slurm's own commands on a test cluster, the way its operator or one of its users would run
them: the one builder of their argv for every test (and the lanes' settle step).

A cluster's env file (``.stack/slurm-<version>/env``) says how: ``SLURM_CLI_PREFIX`` (e.g.
``chroot <dir>`` for a version the host does not have), ``SLURM_BIN_DIR`` (a Slurm built into
a prefix, 25.11 and later, has its own commands; the host's are 22.05's) and ``SLURM_CONF``.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Mapping


def argv(env: Mapping[str, str], command: str, *args: str, as_user: str | None = None) -> list[str]:
    """``command args`` on the cluster: as root, or as ``as_user`` (``runuser``, with the
    cluster's commands first on PATH, as that user could from a login node)."""
    prefix = shlex.split(env.get("SLURM_CLI_PREFIX", ""))
    bin_dir = env.get("SLURM_BIN_DIR") or ""
    if as_user is not None:
        return [*prefix, "runuser", "-u", as_user, "--", "env", f"SLURM_CONF={env['SLURM_CONF']}",
                "PATH=" + (f"{bin_dir}:" if bin_dir else "") + "/usr/bin:/bin", command, *args]
    return [*prefix, f"{bin_dir}/{command}" if bin_dir else command, *args]


def run(env: Mapping[str, str], command: str, *args: str, as_user: str | None = None, check: bool = True,
        timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """Run it; with ``check``, a non-zero exit fails the test with Slurm's own words."""
    done = subprocess.run(argv(env, command, *args, as_user=as_user), capture_output=True, text=True,
                          timeout=timeout, check=False,
                          env={**os.environ, "SLURM_CONF": env["SLURM_CONF"], "LANG": "C.UTF-8"})
    if check:
        assert done.returncode == 0, f"{command} {' '.join(args)}: {done.stderr.strip()}"
    return done
