"""docker-compose.yml brought up for real with podman + podman-compose (issue #19, item 3).

Images come from stack/images.sh (Debian base by debootstrap, local Postgres stand-in, the
multi-stage Dockerfile); it is idempotent and takes seconds when warm. The compose project
gets tests/deploy/compose.host.yml on top: host networking on loopback with free ports, so
the containerised gateway and workers reach the test stack's Slurm 22.05 (slurmrestd on
127.0.0.1) like a gateway on the host. A job is submitted through the compose gateway, one
worker is restarted while the job runs, the job must still succeed exactly once, and the
project (containers, pod, volume) is removed at the end.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from tests.conftest import REPO, missing_system, read_env_file, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.uses("podman")]
CACHE = Path(os.environ.get("ISTHMUS_CACHE", "/var/cache/isthmus"))
PODMAN_COMPOSE = CACHE / "podman-compose" / "bin" / "podman-compose"
CONTAINER_UID = 10001  # the Dockerfile's non-root user
FINAL = ("succeeded", "failed", "cancelled")


def pool_name() -> str:
    """The pool the test submits to (today's name; the pools work re-points this)."""
    return "slurm"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(*argv, env=None, timeout=300, check=True) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(a) for a in argv], env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode:
        raise AssertionError(f"{argv} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


class Compose:
    def __init__(self, project: str, env: dict[str, str]):
        self.project, self.env = project, env

    def __call__(self, *args, **kw) -> subprocess.CompletedProcess:
        return run(PODMAN_COMPOSE, "--in-pod=false", "-p", self.project, "-f", REPO / "docker-compose.yml",
                   "-f", REPO / "tests/deploy/compose.host.yml", *args, env=self.env, **kw)

    def container(self, service: str) -> str:
        out = run("podman", "ps", "-a", "--filter", f"label=com.docker.compose.project={self.project}",
                  "--filter", f"label=com.docker.compose.service={service}", "--format", "{{.Names}}").stdout.split()
        assert len(out) == 1, (service, out)
        return out[0]

    def logs(self) -> str:
        out = []
        for name in run("podman", "ps", "-a", "--filter", f"label=com.docker.compose.project={self.project}",
                        "--format", "{{.Names}}", check=False).stdout.split():
            out.append(f"--- {name}\n" + run("podman", "logs", "--tail", "40", name, check=False).stdout[-4000:])
        return "\n".join(out)


@pytest.fixture(scope="module")
def images():
    if shutil.which("podman") is None and not os.environ.get("ISTHMUS_REQUIRE_STACK"):
        pytest.skip("podman not installed (bash stack/images.sh installs it and builds the images)")
    run("bash", REPO / "stack/images.sh", timeout=3600)
    return os.environ.get("ISTHMUS_IMAGE", "localhost/isthmus:dev")


@pytest.fixture(scope="module")
def slurm():
    path = REPO / ".stack" / "slurm-22.05" / "env"
    if not path.exists():
        missing_system("Slurm 22.05 cluster not running (run stack/slurm/up.sh 22.05)")
    return read_env_file(path)


@pytest.fixture
def compose(images, slurm, tmp_path):
    from gateway.identity.setup import build_dev_issuer
    from gateway.kit.settings import Settings

    secrets_dir = tmp_path / "secrets"
    secrets_dir.mkdir()
    shutil.copyfile(slurm["SLURM_JWT_KEY"], secrets_dir / "slurm-jwt.key")
    issuer = build_dev_issuer(Settings(dev_mode=True, dev_key_path=secrets_dir / "dev-issuer.pem",
                                       database_url="sqlite://"))
    for path in [secrets_dir, *secrets_dir.iterdir()]:
        os.chown(path, CONTAINER_UID, CONTAINER_UID)
        path.chmod(0o700 if path.is_dir() else 0o600)
    tmp_path.chmod(0o755)

    db_port, http_port = free_port(), free_port()
    password = secrets.token_hex(12)
    backends = {pool_name(): {"transport": "rest", "rest_url": slurm["SLURMRESTD_URL"],
                              "jwt_key_path": "/run/isthmus/slurm-jwt.key", "partition": slurm["SLURM_PARTITION"],
                              "work_dir": slurm["SLURM_WORK_DIR"]}}
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"),
           "ISTHMUS_IMAGE": images, "ISTHMUS_POSTGRES_IMAGE": "localhost/isthmus-postgres:15",
           "ISTHMUS_DB_PASSWORD": password, "ISTHMUS_DB_HOST": "127.0.0.1", "ISTHMUS_DB_PORT": str(db_port),
           "ISTHMUS_HTTP_PORT": str(http_port), "ISTHMUS_PUBLISH": f"127.0.0.1:{http_port}",
           "ISTHMUS_BACKENDS": json.dumps(backends), "ISTHMUS_DEV_MODE": "true", "ISTHMUS_DEV_ACCOUNTS": "team-a",
           "ISTHMUS_TEST_SECRETS": str(secrets_dir)}
    c = Compose(f"isthmus-deploy-{secrets.token_hex(3)}", env)
    c.url = f"http://127.0.0.1:{http_port}"
    c.db_url = f"postgresql+psycopg://isthmus:{password}@127.0.0.1:{db_port}/isthmus"
    c.token = issuer.mint(user="alice", groups=["team-a"], admin=False)
    try:
        yield c
    finally:
        c("down", "-v", "-t", "5", check=False, timeout=120)
        leftovers = run("podman", "ps", "-a", "-q", "--filter", f"label=com.docker.compose.project={c.project}",
                        check=False).stdout.split()
        if leftovers:
            run("podman", "rm", "-f", *leftovers, check=False)
        run("podman", "volume", "rm", "-f", f"{c.project}_pgdata", check=False)


def test_compose_runs_a_slurm_job_through_its_gateway_and_survives_a_worker_restart(compose):
    engine = sa.create_engine(compose.db_url)
    try:
        # podman-compose ignores depends_on conditions: the three documented steps (docs/deploy.md).
        compose("up", "-d", "db")
        wait_for(lambda: _connects(engine), 90, "the compose Postgres", compose.logs)
        compose("up", "-d", "--no-deps", "migrate")
        code = run("podman", "wait", compose.container("migrate"), timeout=180).stdout.strip()
        assert code == "0", compose.logs()
        with engine.connect() as conn:
            assert conn.execute(sa.text("select version_num from alembic_version")).scalar()

        compose("up", "-d", "--no-deps", "gateway", "worker-1", "worker-2")
        wait_for(lambda: _ready(compose.url), 120, "the compose gateway's /readyz", compose.logs)

        # the image: non-root user, healthcheck declared
        gateway = compose.container("gateway")
        info = json.loads(run("podman", "inspect", gateway).stdout)[0]
        assert info["Config"]["User"].split(":")[0] == str(CONTAINER_UID)
        assert info["Config"].get("Healthcheck", {}).get("Test"), info["Config"].get("Healthcheck")
        assert run("podman", "exec", gateway, "id", "-u").stdout.strip() == str(CONTAINER_UID)
        assert run("podman", "exec", gateway, "sh", "-c", "command -v gcc cc pip apt-get-never || true").stdout \
            .strip() == ""

        headers = {"Authorization": f"Bearer {compose.token}"}
        body = {"name": "compose-e2e", "account": "team-a", "backend": pool_name(), "workers": 1,
                "gpus_per_worker": 8, "time_limit": "5m", "command": ["/bin/sh", "-c", "sleep 12; echo done"]}
        r = httpx.post(f"{compose.url}/v1/jobs", json=body, headers=headers, timeout=30)
        assert r.status_code == 202, r.text
        job = r.json()["id"]

        def state(*wanted):
            j = httpx.get(f"{compose.url}/v1/jobs/{job}", headers=headers, timeout=10).json()
            return j if j["state"] in wanted else None

        wait_for(lambda: state("running", *FINAL), 90, "the job to run on Slurm", compose.logs)
        # Restart worker-1 by re-creating it: `podman restart` refuses, because podman-compose
        # turns depends_on into --requires on the (exited) migrate container.
        worker = compose.container("worker-1")
        run("podman", "stop", "-t", "10", worker, timeout=60)
        run("podman", "rm", worker, timeout=60)
        compose("up", "-d", "--no-deps", "worker-1")
        final = wait_for(lambda: state(*FINAL), 150, "the job to end", compose.logs)
        assert final["state"] == "succeeded", (final, compose.logs())
        assert final["exit_code"] == 0 and final["backend_job_id"]

        events = httpx.get(f"{compose.url}/v1/jobs/{job}/events", headers=headers, timeout=10).json()["items"]
        states = [e["to_state"] for e in events if e["kind"] == "state"]
        assert states.count("queued") == 1 and states.count("succeeded") == 1, states
        with engine.connect() as conn:
            assert conn.execute(sa.text("select count(*) from job")).scalar() == 1
            kinds = [k for (k,) in conn.execute(sa.text("select kind from ledger_entry where job_id = :j"), {"j": job})]
        assert kinds.count("reserve") == 1 and kinds.count("start") == 1 and kinds.count("usage") == 1, kinds
    finally:
        engine.dispose()


def _connects(engine) -> bool:
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("select 1"))
        return True
    except sa.exc.OperationalError:
        return False


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
