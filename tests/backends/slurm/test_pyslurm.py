"""What only the pyslurm transport does, against the real Slurm 25.11 cluster.

The contract suite and the shared Slurm tests run through pyslurm too (conftest's
version x transport matrix); these cover the child process that bounds libslurm, the
refusal of other Slurm versions, and 25.11's metrics endpoint.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from adapters.base import (
    BackendState,
    BackendUnavailable,
    SubmissionRejected,
    Unsupported,
)
from adapters.envfile import read_env_file
from adapters.slurm import SlurmBackend, SlurmSettings
from adapters.slurm.pyslurm_transport import PyslurmTransport

from .conftest import PYSLURM_VERSION, env_path, gid, missing, wait_for
from .test_slurm_cluster import LONG, request

pytestmark = pytest.mark.slurm("25.11")


@pytest.fixture(scope="module")
def env25() -> dict[str, str]:
    path = env_path(PYSLURM_VERSION)
    if not path.exists():
        missing(f"Slurm {PYSLURM_VERSION} cluster is not up ({path} missing; run "
                f"`bash stack/slurm/up.sh {PYSLURM_VERSION}`)")
    if importlib.util.find_spec("pyslurm") is None:
        missing("pyslurm is not installed; run `bash stack/slurm/build-25.11.sh --pyslurm .venv`")
    return read_env_file(path)


def _pyslurm_backend(version: str = PYSLURM_VERSION, **overrides) -> SlurmBackend:
    return SlurmBackend(SlurmSettings.from_env_file(env_path(version), transport="pyslurm",
                                                    **overrides))


def test_hung_slurmctld_times_out_without_freezing_the_gateway(env25):
    """libslurm holds the GIL: only a child process keeps the caller's threads alive."""
    b = SlurmBackend(SlurmSettings.from_env_file(env_path(PYSLURM_VERSION), transport="pyslurm"),
                     transport=PyslurmTransport(slurm_conf=env25["SLURM_CONF"], timeout_s=3.0))
    assert b.capacity().pools[0].total_gpus == 32
    ctld = int(Path(env25["SLURM_STACK_DIR"], "run", "slurmctld.pid").read_text())
    ticks: list[float] = []
    stop = threading.Event()

    def heartbeat():  # what the event loop would be doing meanwhile
        while not stop.is_set():
            ticks.append(time.monotonic())
            time.sleep(0.05)

    hb = threading.Thread(target=heartbeat, daemon=True)
    os.kill(ctld, signal.SIGSTOP)
    try:
        hb.start()
        t0 = time.monotonic()
        with pytest.raises(BackendUnavailable) as exc:
            b.capacity()
        elapsed = time.monotonic() - t0
    finally:
        os.kill(ctld, signal.SIGCONT)
        stop.set()
        hb.join()
    assert elapsed < 6, f"the 3 s bound took {elapsed:.1f}s"
    assert "did not answer within 3s" in exc.value.message
    gaps = [b2 - a for a, b2 in itertools.pairwise(ticks)]
    assert gaps and max(gaps) < 1.0, f"caller's threads froze for {max(gaps):.1f}s"
    # The killed child is replaced on the next call; the cluster answers again.
    deadline = time.monotonic() + 30
    while True:
        try:
            assert b.capacity().pools[0].total_nodes == 4
            break
        except BackendUnavailable:
            assert time.monotonic() < deadline
            time.sleep(1)
    b.close()


def test_jobs_run_as_the_mapped_user_with_a_clean_environment(env25):
    """The job's uid is the token's user, and the gateway's own environment stays out."""
    b = _pyslurm_backend()
    work = Path(env25["SLURM_WORK_DIR"])
    g = gid("pyenv")
    out = work / f"{g}.out"
    os.environ["ISTHMUS_GATEWAY_SECRET_FOR_TEST"] = "must-not-leak"
    try:
        job = b.submit(request(g, ["sh", "-c", f"{{ id -un; env; }} > {out}"], gpus=1,
                               user="bob")).backend_job_id
    finally:
        del os.environ["ISTHMUS_GATEWAY_SECRET_FOR_TEST"]
    st = wait_for(b, job, lambda s: s.state.final)
    assert st.state is BackendState.SUCCEEDED, st
    lines = out.read_text().splitlines()
    assert lines[0] == "bob"
    assert not any("ISTHMUS_GATEWAY_SECRET_FOR_TEST" in ln for ln in lines)
    # srun in the job finds the cluster (slurmd may point it at its own copy of the conf).
    assert any(ln.startswith(f"SLURM_CONF={Path(env25['SLURM_CONF']).parent}/") for ln in lines)
    b.close()


def test_unknown_user_is_rejected_and_nothing_submitted(env25):
    b = _pyslurm_backend()
    g = gid("nouser")
    with pytest.raises(SubmissionRejected) as exc:
        b.submit(request(g, ["true"], gpus=1, user="no-such-user-x"))
    assert "no-such-user-x" in exc.value.message
    assert b.find_by_gateway_id(g) is None
    b.close()


def test_cancel_twice_reports_cancelled(env25):
    b = _pyslurm_backend()
    g = gid("pycancel")
    job = b.submit(request(g, LONG, gpus=1)).backend_job_id
    b.cancel(job)
    b.cancel(job)  # twice: a finished job is silently ignored
    st = wait_for(b, job, lambda s: s.state.final)
    assert st.state is BackendState.CANCELLED, st
    b.close()


@pytest.mark.parametrize("version", ["22.05", "24.11"])
def test_older_slurm_versions_are_refused_with_the_reason(env25, version):
    if not env_path(version).exists():
        pytest.skip(f"Slurm {version} is not up")
    b = _pyslurm_backend(version)
    try:
        with pytest.raises(Unsupported) as exc:
            b.capacity()
        assert PYSLURM_VERSION in exc.value.message and "'rest' or 'cli'" in exc.value.message
    finally:
        b.close()


def test_newer_slurmctld_answers_an_older_libslurm(env25):
    """Slurm serves clients up to two releases older: 25.11's libslurm reads 26.05."""
    if not env_path("26.05").exists():
        pytest.skip("Slurm 26.05 is not up")
    b = _pyslurm_backend("26.05")
    try:
        assert b.transport.controller_version().startswith("26.05")
        assert sum(p.total_gpus for p in b.capacity().pools) == 32
    finally:
        b.close()


def test_without_pyslurm_the_transport_says_why(env25):
    """An interpreter without pyslurm (the system's) is refused with the reason, at once."""
    with pytest.raises(Unsupported) as exc:
        PyslurmTransport(slurm_conf=env25["SLURM_CONF"], python="/usr/bin/python3")
    assert "pyslurm" in exc.value.message and "'rest' or 'cli'" in exc.value.message
    assert "No module named 'pyslurm'" in (exc.value.detail or "")


def test_slurmctld_serves_openmetrics(env25):
    url = env25["SLURM_METRICS_URL"]
    text = httpx.get(f"{url}/nodes", timeout=10, follow_redirects=True).text
    gauges = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    assert gauges, text[:500]
    assert any(ln.split()[-1].replace(".", "", 1).isdigit() for ln in gauges)
