"""Gateways wired to the real local backends, driven round by round."""

from __future__ import annotations

import contextlib
import json
import time

import pytest

from tests.conftest import REPO, Gateway, _clean, missing_system, read_env_file


def slurm_env(version: str = "22.05") -> dict[str, str]:
    path = REPO / ".stack" / f"slurm-{version}" / "env"
    if not path.exists():
        missing_system(f"Slurm {version} cluster not running (run stack/slurm/up.sh {version})")
    return read_env_file(path)


def kube_env() -> dict[str, str]:
    path = REPO / ".stack" / "kube" / "env"
    if not path.exists():
        missing_system("Kubernetes control plane not running (run stack/kube/up.sh)")
    return read_env_file(path)


def slurm_backend_options(env: dict[str, str], transport: str = "rest") -> dict:
    return {"transport": transport, "rest_url": env["SLURMRESTD_URL"], "jwt_key_path": env["SLURM_JWT_KEY"],
            "partition": env["SLURM_PARTITION"], "work_dir": env["SLURM_WORK_DIR"], "slurm_conf": env["SLURM_CONF"],
            "cli_prefix": env.get("SLURM_CLI_PREFIX", "")}


def kube_backend_options(env: dict[str, str]) -> dict:
    return {"kubeconfig": env["KUBECONFIG"], "cluster_queue": env["ISTHMUS_KUBE_CLUSTER_QUEUE"],
            "local_queue": env["ISTHMUS_KUBE_LOCAL_QUEUE"],
            "namespace_template": env.get("ISTHMUS_KUBE_NAMESPACE_TEMPLATE", "isthmus-{account}"),
            "request_timeout_s": 15.0}


@contextlib.contextmanager
def wired_gateway(database_url: str, dev_key_path, backends: dict, **overrides):
    from fastapi.testclient import TestClient

    from gateway.app import create_app
    from gateway.identity.setup import build_dev_issuer
    from gateway.kit.settings import Settings

    settings = Settings(database_url=database_url, dev_mode=True, dev_key_path=dev_key_path,
                        dev_accounts="team-a,team-b", backends=json.dumps(backends), dispatch_in_serve=False,
                        retry_backoff_base_s=0.2, retry_backoff_max_s=1.0, capacity_ttl_s=0,
                        **overrides)
    app = create_app(settings)
    with TestClient(app) as client:
        _clean(app)
        try:
            yield Gateway(client=client, app=app, settings=settings, issuer=build_dev_issuer(settings))
        finally:
            _cancel_leftovers(app)
            _clean(app)


def _cancel_leftovers(app) -> None:
    """A failed test must not leave jobs holding the shared clusters' nodes or quota."""
    from sqlalchemy import select

    from gateway.jobs.models import Job

    with app.state.sessionmaker() as s:
        live = s.execute(select(Job.backend, Job.backend_job_id).where(
            Job.state.notin_(["succeeded", "failed", "cancelled"]), Job.backend_job_id.isnot(None))).all()
    for pool, backend_job_id in live:
        try:
            app.state.backends[pool].cancel(backend_job_id)
        except Exception:  # noqa: BLE001 - best effort clean-up
            pass


def drive_until(gw: Gateway, predicate, timeout_s: float = 120, interval_s: float = 0.5):
    """Run dispatcher rounds until ``predicate()`` is truthy."""
    deadline = time.monotonic() + timeout_s
    while True:
        gw.app.state.dispatcher.run_once()
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for the gateway to get there")
        time.sleep(interval_s)


def job_state(gw: Gateway, job_id: str, *states: str, headers=None):
    job = gw.client.get(f"/v1/jobs/{job_id}", headers=headers or gw.headers(admin=True, user="root", groups=())).json()
    return job if job["state"] in states else None


@pytest.fixture(scope="module")
def slurm22():
    return slurm_env("22.05")


@pytest.fixture(scope="module")
def kube():
    return kube_env()


# kwok runs no containers: these labels pick its stages (stack/kube/kwok-stages.yaml).
KWOK_RUN_FOR = "isthmus.io/fake-run-for"
KWOK_EXIT_CODE = "isthmus.io/fake-exit-code"
