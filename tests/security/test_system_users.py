"""Finding 6: jobs never run as a system account or as the gateway's own user.

In-process against SQLite and Postgres (the 403 at submit), then on the real Slurm
22.05 cluster over the CLI transport: a token for ``root`` is refused and nothing reaches
sbatch, and a job whose user is root that reaches the dispatcher anyway (recorded before
this rule existed) fails with the reason instead of running as the gateway.
"""

from __future__ import annotations

import pytest
from sqlalchemy import update

from gateway.identity.system_users import own_user
from gateway.models.jobs import Job

SPEC = {"name": "sys", "account": "team-a", "command": ["id"], "workers": 1}


def _jobs(gw) -> int:
    with gw.session() as s:
        return s.query(Job).count()


@pytest.mark.parametrize("user,why", [
    ("root", "system account"),          # deny-list (also uid 0)
    ("slurm", "system account"),         # deny-list: SlurmUser may do anything on the cluster
    ("nobody", "system account"),
    ("_apt", "below this gateway's minimum of 1000"),  # uid 42 on Debian: the uid rule
])
def test_system_user_gets_403_with_reason_and_nothing_is_recorded(gw, user, why):
    r = gw.client.post("/v1/jobs", json=SPEC, headers=gw.headers(user=user),
                       params=None)
    assert r.status_code == 403, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert why in r.json()["detail"] and user in r.json()["detail"]
    assert _jobs(gw) == 0


def test_gateway_own_user_gets_403(gw):
    r = gw.client.post("/v1/jobs", json=SPEC, headers=gw.headers(user=own_user()))
    assert r.status_code == 403, r.text
    assert _jobs(gw) == 0


def test_ordinary_user_is_accepted(gw):
    r = gw.client.post("/v1/jobs", json=SPEC, headers=gw.headers(user="alice"))
    assert r.status_code == 202, r.text


def test_system_user_may_still_read(gw):
    # Only running jobs as the account is refused; an admin token named root may list.
    r = gw.client.get("/v1/jobs", headers=gw.headers(user="root", admin=True))
    assert r.status_code == 200, r.text


def test_denied_users_and_min_uid_are_configurable():
    from gateway.identity.system_users import parse_user_list, refusal

    assert refusal("alice", min_uid=1000, denied=parse_user_list("alice, bob")) is not None
    assert refusal("_apt", min_uid=0, denied=frozenset()) is None
    assert refusal("_apt", min_uid=1000, denied=frozenset()) is not None


# ------------------------------------------------------------- real Slurm cluster

@pytest.fixture
def slurm_gw(database_url, databases, dev_key_path):
    from tests.dispatch.conftest import slurm_backend_options, slurm_env, wired_gateway

    env = slurm_env("22.05")
    # A database of its own: this module's database_url is the gw fixture's, in use by its app.
    dialect = "sqlite" if database_url.startswith("sqlite") else "postgres"
    with databases.create(dialect) as url, wired_gateway(url, dev_key_path,
                                                         {"slurm": slurm_backend_options(env, transport="cli")}) as gw:
        yield gw


def _slurm_jobs_of(gw, gateway_id: str):
    return gw.app.state.backends["slurm"].find_by_gateway_id(gateway_id)


def _squeue_users(gw) -> list[str]:
    backend = gw.app.state.backends["slurm"]
    return [str(r.get("user_name")) for r in backend._transport.jobs()]


@pytest.mark.slurm
def test_root_token_on_real_slurm_gets_403_and_nothing_reaches_sbatch(slurm_gw):
    before = _squeue_users(slurm_gw).count("root")
    r = slurm_gw.client.post("/v1/jobs", json={**SPEC, "backend": "slurm"}, headers=slurm_gw.headers(user="root"))
    assert r.status_code == 403, r.text
    assert "root" in r.json()["detail"]
    slurm_gw.app.state.dispatcher.run_once()
    assert _jobs(slurm_gw) == 0
    assert _squeue_users(slurm_gw).count("root") == before


@pytest.mark.slurm
def test_job_recorded_as_root_fails_at_dispatch_and_never_runs_as_the_gateway(slurm_gw):
    from tests.dispatch.conftest import drive_until, job_state

    r = slurm_gw.client.post("/v1/jobs", json={**SPEC, "backend": "slurm", "gpus_per_worker": 1},
                             headers=slurm_gw.headers(user="alice"))
    assert r.status_code == 202, r.text
    job_id = r.json()["id"]
    # A job recorded before the submit rule existed: its user is the gateway's own.
    with slurm_gw.app.state.sessionmaker.begin() as s:
        s.execute(update(Job).where(Job.id == job_id).values(username=own_user()))
    done = drive_until(slurm_gw, lambda: job_state(slurm_gw, job_id, "failed", "succeeded", "queued", "running"),
                       timeout_s=60)
    assert done["state"] == "failed", done
    assert "never run as" in done["state_reason"]
    assert _slurm_jobs_of(slurm_gw, job_id) is None
