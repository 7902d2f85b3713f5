"""Fixtures for the Slurm adapter tests against the local clusters (stack/slurm/up.sh).

Every version whose ``.stack/slurm-<ver>/env`` exists is tested over the REST and CLI
transports; Slurm 25.11 (built from source) also over pyslurm, which links libslurm 25.11
and is skipped with that reason on the other versions.
A missing cluster is skipped with the reason, or fails under ISTHMUS_REQUIRE_STACK=1.
ISTHMUS_SLURM_VERSIONS (comma separated) narrows the versions, e.g. "22.05,24.11".

Tests run in phases per version so the slow time-limit case overlaps the rest:
phase 0 needs the whole (idle) cluster (gang tests), phase 1 is everything else (the
TIMEOUT job is submitted first and holds one node), phase 2 checks the TIMEOUT job.
"""

from __future__ import annotations

import importlib.util
import os
import time
import uuid
from pathlib import Path

import pytest

from adapters.base import Backend, BackendState, JobStatus
from adapters.envfile import read_env_file
from adapters.slurm import SlurmBackend, SlurmSettings

REPO = Path(__file__).resolve().parents[3]
ALL_VERSIONS = ("22.05", "24.11", "25.11", "26.05")
VERSIONS = tuple(v.strip() for v in os.environ.get("ISTHMUS_SLURM_VERSIONS",
                                                     ",".join(ALL_VERSIONS)).split(",") if v.strip())
TRANSPORTS = ("rest", "cli", "pyslurm")
PYSLURM_VERSION = "25.11"  # the only Slurm the current pyslurm line builds against
REQUIRE_STACK = os.environ.get("ISTHMUS_REQUIRE_STACK") == "1"


def env_path(version: str) -> Path:
    return REPO / ".stack" / f"slurm-{version}" / "env"


def missing(reason: str) -> None:
    if REQUIRE_STACK:
        pytest.fail(f"required test system missing: {reason}")
    pytest.skip(reason)


def pytest_configure(config):
    config.addinivalue_line("markers", "phase(n): ordering phase within one Slurm version")


def _phase(item) -> int:
    m = item.get_closest_marker("phase")
    return m.args[0] if m else 1


def pytest_collection_modifyitems(config, items):
    """Order Slurm tests by (version, phase, transport), keeping the rest in place."""
    here = str(Path(__file__).parent)
    idx = [i for i, it in enumerate(items) if str(it.path).startswith(here)
           and hasattr(it, "callspec") and "slurm_version" in it.callspec.params]
    if not idx:
        return
    chosen = [items[i] for i in idx]

    def key(it):
        p = it.callspec.params
        return (VERSIONS.index(p["slurm_version"]) if p["slurm_version"] in VERSIONS else 99,
                _phase(it), TRANSPORTS.index(p.get("transport", "rest")), chosen.index(it))

    for i, it in zip(idx, sorted(chosen, key=key), strict=True):
        items[i] = it


@pytest.fixture(scope="session", params=VERSIONS)
def slurm_version(request) -> str:
    return request.param


@pytest.fixture(scope="session")
def cluster_env(slurm_version) -> dict[str, str]:
    path = env_path(slurm_version)
    if not path.exists():
        missing(f"Slurm {slurm_version} cluster is not up ({path} missing; run "
                f"`bash stack/slurm/up.sh {slurm_version}`)")
    env = read_env_file(path)
    probe = SlurmBackend(SlurmSettings.from_env_file(path, transport="cli"))
    try:
        probe.capacity()
    except Exception as exc:  # noqa: BLE001 - any failure means "not usable"
        missing(f"Slurm {slurm_version} env file exists but the cluster does not answer: {exc}")
    # Leftovers of an interrupted earlier run of THESE tests would hold nodes the gang
    # tests need; jobs of anyone else (e.g. the dispatcher's tests) are left alone.
    for job in probe.list_gateway_jobs():
        if not job.state.final and (job.gateway_job_id or "").startswith(OWN_PREFIXES):
            probe.cancel(job.backend_job_id)
    return env


@pytest.fixture(scope="session", params=TRANSPORTS)
def transport(request, slurm_version) -> str:
    if request.param == "pyslurm":
        if slurm_version != PYSLURM_VERSION:
            pytest.skip(f"pyslurm links libslurm {PYSLURM_VERSION}: the matrix runs it on Slurm "
                        f"{PYSLURM_VERSION} only (older slurmctld refuse it; test_pyslurm.py "
                        f"checks both); Slurm {slurm_version} is tested over rest and cli")
        # Not imported here: libslurm would read a slurm.conf into the test process.
        if importlib.util.find_spec("pyslurm") is None:
            missing("pyslurm is not installed in this venv; run "
                    "`bash stack/slurm/build-25.11.sh --pyslurm .venv`")
    return request.param


@pytest.fixture(scope="session")
def backend(cluster_env, slurm_version, transport) -> Backend:
    b = SlurmBackend(SlurmSettings.from_env_file(env_path(slurm_version), transport=transport))
    yield b
    b.close()


@pytest.fixture
def work_dir(cluster_env) -> Path:
    return Path(cluster_env["SLURM_WORK_DIR"])


OWN_PREFIXES = ("slurmtest-", "contract-")  # contract- ids come from tests/contract/suite.py


def gid(tag: str = "t") -> str:
    return f"slurmtest-{tag}-{uuid.uuid4().hex[:12]}"


def wait_for(backend: Backend, job_id: str, predicate, timeout_s: float = 60) -> JobStatus:
    deadline = time.monotonic() + timeout_s
    status = backend.status(job_id)
    while not predicate(status):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s; last status: {status}")
        time.sleep(0.3)
        status = backend.status(job_id)
    return status


def wait_state(backend: Backend, job_id: str, state: BackendState, timeout_s: float = 60) -> JobStatus:
    """Wait until the job is in ``state`` (or final, so a failure shows up at once)."""
    return wait_for(backend, job_id, lambda s: s.state is state or s.state.final, timeout_s)


def wait_idle_nodes(backend: Backend, n: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        idle = sum(p.idle_nodes for p in backend.capacity().pools)
        if idle >= n:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"only {idle} idle nodes after {timeout_s}s")
        time.sleep(0.3)


def wait_file(path: Path, timeout_s: float = 30) -> str:
    deadline = time.monotonic() + timeout_s
    while not path.exists() or path.stat().st_size == 0:
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} not written after {timeout_s}s")
        time.sleep(0.2)
    time.sleep(0.1)
    return path.read_text()
