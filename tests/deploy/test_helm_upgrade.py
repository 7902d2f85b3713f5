"""`helm upgrade` from the previous release under load (issue #47, item 5, second half).

The previous release is a commit (deploy/helm/PREVIOUS_RELEASE; the project has no tags): its
chart from `git archive`, its image built from its own source by `stack/images.sh gateway-at`
(once per commit). A clone without that commit (a shallow one) fails, naming the fix.

The old chart is installed as test_helm_install does (tests/deploy/helm_support.py): one API pod
on the node's network (the old chart has no api.hostNetwork), two workers. A client submits
short jobs to Slurm and Kueue with an Idempotency-Key each, retrying the same key on connection
errors and 502/503/504, to a ready endpoint of the Service; meanwhile `helm upgrade` moves the
release to this checkout's chart and image with two API pods in the pod network (they reach
Postgres through the test's relay; the old pod keeps serving until a new one is ready).

Then: the migration hook ran once for the install and once for the upgrade (one Job, one pod
each) and the database is at this checkout's Alembic head; the client saw no answer but
success and retriable ones; every accepted key is one job that ended succeeded, reached its
pool once and was charged once; no other job exists; ``ledger.verify()`` is empty.
"""

from __future__ import annotations

import ast
import json
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, wait_for
from tests.deploy.helm_support import (  # noqa: F401 (fixtures)
    CHART,
    KSTATE,
    Release,
    Submitter,
    check_jobs_once_and_balanced,
    helm,
    image,
    kube,
    previous_commit,
    previous_image,
    previous_source,
    release_namespace,
    run,
    slurm,
)

SETTINGS = {"DISPATCH_LEASE_S": 20}
WORKER = {"healthPort": 0}  # two workers on the one node's network: no port each


def migration_runs(release: Release) -> dict[str, int]:
    """The hook Jobs gw-isthmus-migrate that ran: {Job uid: pods it made}. The Jobs are deleted
    on success; the job controller's SuccessfulCreate events stay (an hour)."""
    events = release.kube.get(f"/api/v1/namespaces/{release.ns}/events", params={
        "fieldSelector": "involvedObject.kind=Job,involvedObject.name=gw-isthmus-migrate,reason=SuccessfulCreate"})
    runs: dict[str, int] = {}
    for e in events.json()["items"]:
        runs[e["involvedObject"]["uid"]] = runs.get(e["involvedObject"]["uid"], 0) + (e.get("count") or 1)
    return runs


def alembic_head(source: Path) -> str:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    cfg = Config(str(source / "alembic.ini"))
    cfg.set_main_option("script_location", str(source / "migrations"))
    return ScriptDirectory.from_config(cfg).get_current_head()


# A revision's upgrade() that does one of these can break the previous release's pods, which
# run on the new schema during the roll and after a rollback (docs/deploy.md, expand/contract).
CONTRACTS = {"drop_column", "drop_table", "rename_table", "alter_column"}


def contract_steps(path: Path) -> list[str]:
    """What ``path``'s upgrade() does that old code cannot run beside, unless its docstring
    says ``Contract:`` (a later release's step, once no running release reads it)."""
    tree = ast.parse(path.read_text())
    if "Contract:" in (ast.get_docstring(tree) or ""):
        return []
    upgrade = next(f for f in tree.body if isinstance(f, ast.FunctionDef) and f.name == "upgrade")
    steps = []
    for node in ast.walk(upgrade):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr in CONTRACTS:
            steps.append(node.func.attr)
        for col in node.args if node.func.attr == "add_column" else []:
            kw = {k.arg: k.value for k in getattr(col, "keywords", [])}
            if getattr(kw.get("nullable"), "value", True) is False and "server_default" not in kw:
                steps.append("add_column NOT NULL without server_default")  # old code's inserts fail
    return steps


def test_revisions_since_the_previous_release_only_expand():
    versions = REPO / "migrations" / "versions"
    old = set(run("git", "-C", REPO, "ls-tree", "--name-only", previous_commit(), "migrations/versions/").stdout.split())
    new = sorted(p for p in versions.glob("*.py") if f"migrations/versions/{p.name}" not in old)
    assert {p.name: contract_steps(p) for p in new if contract_steps(p)} == {}
    # The check sees the one-step contracts made before there was a release to roll.
    assert "drop_column" in contract_steps(next(versions.glob("*_0007pools_pools_as_data.py")))
    assert "alter_column" in contract_steps(next(versions.glob("*_0009pool_job_pool_columns.py")))


@pytest.mark.kubernetes
@pytest.mark.slurm
@pytest.mark.uses("podman")
def test_helm_upgrade_from_the_previous_release_under_load(kube, helm, image, previous_image, slurm, tmp_path):
    commit = previous_commit()
    old = previous_source(commit, tmp_path / "previous", "deploy/helm/isthmus", "migrations", "alembic.ini")
    with release_namespace(kube, helm, slurm, tmp_path, forward_db=True) as rel:
        rel.helm_run("install", old / "deploy/helm/isthmus",
                     rel.values(previous_image, worker_replicas=2, settings=SETTINGS, worker=WORKER))
        version = "select version_num from alembic_version"
        assert [v for (v,) in rel.query(version)] == [alembic_head(old)]
        assert list(migration_runs(rel).values()) == [1]
        wait_for(lambda: rel.endpoints(), 60, "the old API pod ready", rel.diag)

        sub = Submitter(rel, ["slurm", "kube-node", "slurm"], interval_s=0.8)
        sub.start()
        try:
            wait_for(lambda: len(sub.accepted) >= 5, 60, "the client's first jobs", rel.diag)
            before, t_up = len(sub.accepted), time.monotonic()
            rel.helm_run("upgrade", CHART, rel.values(image, api_replicas=2, worker_replicas=2, api_pod_network=True,
                                                      settings=SETTINGS, worker=WORKER))
            upgraded_s = time.monotonic() - t_up
            during = len(sub.accepted) - before
            # Every pod now runs this checkout's image; the old API pod is gone from the Service.
            wait_for(lambda: len(rel.endpoints()) == 2 and all(
                p["spec"]["containers"][0]["image"] == image for c in ("api", "worker") for p in rel.pods(c)),
                90, "only new pods, two of them ready API pods", rel.diag)
            after = len(sub.accepted)
            wait_for(lambda: len(sub.accepted) >= after + 5, 60, "jobs after the upgrade", rel.diag)
        finally:
            sub.stop.set()
            sub.join(150)

        assert not sub.is_alive(), "the client did not stop"
        assert sub.not_retriable() == [], sub.not_retriable()
        # The hook ran once per install and upgrade, one pod each; the schema is this checkout's.
        assert list(migration_runs(rel).values()) == [1, 1], migration_runs(rel)
        assert [v for (v,) in rel.query(version)] == [alembic_head(REPO)]
        history = json.loads(run(helm, "history", "gw", "--kubeconfig", KSTATE / "kubeconfig", "--namespace", rel.ns,
                                 "-o", "json").stdout)
        assert [(h["revision"], h["status"]) for h in history] == [(1, "superseded"), (2, "deployed")], history
        pools = check_jobs_once_and_balanced(rel, sub, timeout_s=180)
        assert set(pools.values()) == {"slurm", "kube-node"}, pools
        retried = [a for _, a in sub.answers if a not in ("200", "202")]
        print(f"{len(pools)} jobs ({before} before the upgrade, {during} during its {upgraded_s:.0f} s); "
              f"answers other than 200/202: {retried}")
