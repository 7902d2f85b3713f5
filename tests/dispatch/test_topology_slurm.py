"""Topology-aware gangs on real Slurm (issue #31, part 3; docs/planning.md, "Topology").

The stack's clusters have two domains of two nodes: blocks b1 = gpu[1-2], b2 = gpu[3-4]
(topology/block, Slurm 25.11) and leaf switches s1, s2 over the same nodes (topology/tree,
Slurm 22.05). One node of each domain is taken by a job submitted to Slurm directly (the
gateway only sees the nodes busy): two nodes are idle, but no domain has two. A 2-node gang
that requires one domain waits in the gateway, with the reason and an estimate, and is not
sent to Slurm; when one domain frees, it starts there (read back from Slurm: its nodes, and
the request rendered as --segment / --switches). A level the pool does not have is refused
at submission.
"""

from __future__ import annotations

import pytest

from tests.backends.slurm.test_reservations import scontrol, slurm_command
from tests.dispatch.conftest import (
    drive_until,
    job_state,
    slurm_backend_options,
    slurm_env,
    wired_gateway,
)
from tests.dispatch.test_reservations import FINAL, USERS, get, submit

pytestmark = pytest.mark.slurm

LEVELS = {"22.05": ("switch", {"s1": {"gpu1", "gpu2"}, "s2": {"gpu3", "gpu4"}}),
          "25.11": ("block", {"b1": {"gpu1", "gpu2"}, "b2": {"gpu3", "gpu4"}})}


@pytest.fixture(scope="module")
def database_url(postgres_database_url):
    return postgres_database_url


def hold_node(env: dict, node: str) -> str:
    """A job on ``node`` submitted to Slurm directly, as a site's other users would."""
    done = slurm_command(env, "sbatch", "--parsable", f"--partition={env['SLURM_PARTITION']}", f"--nodelist={node}",
                         "--exclusive", "--time=10", f"--chdir={env['SLURM_WORK_DIR']}", "--output=/dev/null",
                         "--wrap=sleep 600")
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().split(";")[0]


@pytest.mark.parametrize("version", sorted(LEVELS))
def test_a_gang_that_requires_one_domain_waits_for_one_and_lands_in_it(database_url, dev_key_path, version):
    env = slurm_env(version)
    level, domains = LEVELS[version]
    with wired_gateway(database_url, dev_key_path, {"slurm": slurm_backend_options(env)},
                       scheduling_policy="reservation") as gw:
        def idle():
            v = gw.app.state.dispatcher.views(fresh=True)["slurm"]
            return v if v.idle_nodes == v.total_nodes == 4 else None

        view = drive_until(gw, idle, timeout_s=180, interval_s=1)
        assert {name: view.domains[level][name] for name in domains} == dict.fromkeys(domains, 2), view.domains
        assert view.topology_sizes[level] == 2
        (pool,) = gw.client.get("/v1/pools", headers=gw.headers(USERS["team-a"], ("team-a",))).json()["items"]
        assert {(d["level"], d["name"]): set(d["nodes"]) for d in pool["topology"]} == {
            (level, name): nodes for name, nodes in domains.items()}, pool

        # A level the pool has not: refused at once, naming the levels it has.
        r = gw.client.post("/v1/jobs", headers=gw.headers(USERS["team-a"], ("team-a",)), json={
            "name": "topo", "account": "team-a", "pool": "slurm", "workers": 2, "gpus_per_worker": 8,
            "command": ["true"], "topology": {"required": "rack"}})
        assert r.status_code == 422 and f"levels: {level}" in r.text, r.text

        others = [hold_node(env, "gpu1"), hold_node(env, "gpu3")]
        try:
            drive_until(gw, lambda: gw.app.state.dispatcher.views(fresh=True)["slurm"].idle_nodes == 2, timeout_s=60)
            gang = submit(gw, "team-a", workers=2, run_s=2, time_limit="5m", topology={"required": level})
            for _ in range(3):
                gw.app.state.dispatcher.run_once()
            waiting = get(gw, gang)
            assert waiting["state"] == "pending" and waiting["backend_job_id"] is None, waiting
            assert f"no {level} of slurm has 2 idle nodes" in waiting["state_reason"], waiting["state_reason"]
            assert waiting["estimated_start"] is not None or waiting["estimate_reason"], waiting
            # One domain frees: the gang starts there.
            slurm_command(env, "scancel", others[0])
            done = drive_until(gw, lambda: job_state(gw, gang, *FINAL), timeout_s=120)
            assert done["state"] == "succeeded", done
            assert set(done["nodes"]) == domains[min(domains)], done["nodes"]
            if level == "block":  # 22.05's REST API has no switch request (docs/planning.md)
                record = scontrol(env, "--oneliner", "show", "job", done["backend_job_id"]).stdout
                assert " SegmentSize=2 " in record, record
        finally:
            for job_id in others:
                slurm_command(env, "scancel", job_id)
