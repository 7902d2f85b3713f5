"""Storage as data (#29), the pure part: what a job may mount, where it sees it, which pools
can run it. The pools file's parsing is tests/pools/test_storage_config.py; the mounts on
real Slurm clusters and a real API server are tests/storage/."""

from __future__ import annotations

import dataclasses

import pytest

from gateway.domain.routing import JobShape, PoolView, check_pinned, ranked, route
from gateway.domain.storage import (
    Catalog,
    MountError,
    Provision,
    Storage,
    check_spec,
    env_of,
    mounts_of,
    pinned_refusal,
)
from tests.unit.test_routing import view

SHARED, PVC = Provision("shared"), Provision("pvc", claim="ckpt")
CATALOG = Catalog({
    "datasets": Storage("datasets", "/shared/datasets", "read-only", "shared", {"slurm-a": SHARED, "kube-a": PVC}),
    "checkpoints": Storage("checkpoints", "/shared/ckpt", "read-write", "account",
                           {"slurm-a": SHARED, "slurm-b": SHARED, "kube-a": PVC}),
    "secret": Storage("secret", "/shared/secret", "read-write", "account", {"slurm-a": SHARED},
                      accounts=frozenset({"team-a"})),
})


def _error(spec, account="team-b", chain=()) -> MountError:
    with pytest.raises(MountError) as err:
        check_spec(spec, CATALOG, account, chain)
    return err.value


def test_each_bad_mount_is_refused_naming_its_field():
    assert _error({"mounts": [{"storage": "nope"}]}).field == "body.mounts[0].storage"
    e = _error({"mounts": [{"storage": "datasets"}, {"storage": "secret"}]})
    assert (e.field, e.message) == ("body.mounts[1].storage", "account 'team-b' may not use storage 'secret'")
    e = _error({"mounts": [{"storage": "datasets", "read_only": False}]})
    assert (e.field, e.message) == ("body.mounts[0].read_only", "storage 'datasets' is read-only")
    assert _error({"mounts": [{"storage": "datasets"}, {"storage": "datasets"}]}).message == \
        "storage 'datasets' is mounted twice"
    e = _error({"mounts": [{"storage": "datasets", "path": "/data"}, {"storage": "checkpoints", "path": "/data/c"}]})
    assert e.field == "body.mounts[1].path" and "overlaps the mount of 'datasets'" in e.message
    e = _error({"checkpoint": {"storage": "datasets"}})
    assert e.field == "body.checkpoint.storage" and "read-only" in e.message
    assert _error({"checkpoint": {"storage": "secret"}}).field == "body.checkpoint.storage"


def test_a_storage_allowed_to_an_account_is_allowed_to_its_subtree():
    check_spec({"mounts": [{"storage": "secret"}]}, CATALOG, "team-a")
    check_spec({"mounts": [{"storage": "secret"}]}, CATALOG, "team-a-vision", chain=["org", "team-a"])
    assert _error({"mounts": [{"storage": "secret"}]}, "team-b", chain=["org"]).field == "body.mounts[0].storage"


def test_a_job_sees_its_accounts_directory_or_the_whole_shared_storage_and_one_checkpoint_dir():
    spec = {"mounts": [{"storage": "datasets"}, {"storage": "checkpoints", "read_only": True}],
            "checkpoint": {"storage": "checkpoints"}}
    mounts = mounts_of(spec, CATALOG, "team-a", "job-1")
    assert [(m.storage, m.path, m.sub_path, m.read_only, m.checkpoint) for m in mounts] == [
        ("datasets", "/shared/datasets", "", True, False),
        ("checkpoints", "/shared/ckpt/team-a", "team-a", True, False),
        ("checkpoints", "/shared/ckpt/team-a/checkpoints/job-1", "team-a/checkpoints/job-1", False, True)]
    assert env_of(mounts) == {"ISTHMUS_STORAGE_DATASETS": "/shared/datasets",
                              "ISTHMUS_STORAGE_CHECKPOINTS": "/shared/ckpt/team-a",
                              "ISTHMUS_CHECKPOINT_DIR": "/shared/ckpt/team-a/checkpoints/job-1"}
    # Another account of the same storage: another directory; the lineage, not the job, names it.
    other = mounts_of({"checkpoint": {"storage": "checkpoints"}}, CATALOG, "team-b", "job-1")
    assert other[0].path == "/shared/ckpt/team-b/checkpoints/job-1"
    moved = mounts_of({"mounts": [{"storage": "datasets", "path": "/data"}]}, CATALOG, "team-a", None)
    assert (moved[0].path, moved[0].remounted) == ("/data", True)


def _pools(**idle):
    views = {n: view(n, nodes=4, idle=i) for n, i in idle.items()}
    for name, v in views.items():
        v.storages = CATALOG.provided_by(name)
        if name.startswith("slurm"):
            v.kind, v.remount_unsupported = "slurm", "a Slurm job sees storage where the nodes have it"
        else:
            v.kind = "kubernetes"
    return views


def _shape(spec) -> JobShape:
    return JobShape.of_spec(workers=1, gpus_per_worker=8, total_gpus=8, spec=spec)


def test_routing_sends_a_job_only_to_pools_that_provide_every_storage_it_needs():
    views = _pools(**{"slurm-a": 0, "slurm-b": 4, "kube-a": 0, "kube-b": 4})
    shape = _shape({"mounts": [{"storage": "datasets"}], "checkpoint": {"storage": "checkpoints"}})
    d = route(shape, "auto", views)
    # Only slurm-a and kube-a have both; both are full: it waits, saying why the others cannot.
    assert d.pool is None and not d.rejected
    assert "slurm-b: cannot run this job (no storage 'datasets')" in d.reason
    assert "kube-b: cannot run this job (no storage 'checkpoints', no storage 'datasets')" in d.reason
    assert ranked(shape, "auto", views) == ["kube-a", "slurm-a"]
    views["kube-a"].free_gpus = 8
    assert route(shape, "auto", views).pool == "kube-a"
    # No storage: any pool.
    assert route(_shape({}), "auto", views).pool is not None


def test_a_mount_at_a_path_of_the_jobs_choosing_goes_only_to_pools_that_mount_volumes():
    views = _pools(**{"slurm-a": 4, "kube-a": 0})
    shape = _shape({"mounts": [{"storage": "datasets", "path": "/data"}]})
    d = route(shape, "auto", views)
    assert d.pool is None and "slurm-a: cannot run this job (a Slurm job sees storage" in d.reason
    assert check_pinned(shape, "slurm-a", views).startswith("slurm-a: a Slurm job sees storage")


def test_submit_time_refusals_name_the_field():
    spec = {"mounts": [{"storage": "datasets"}, {"storage": "checkpoints", "path": "/c"}]}
    assert pinned_refusal(spec, CATALOG, "slurm-b") == ("body.mounts[0].storage", "slurm-b has no storage 'datasets'")
    assert pinned_refusal(spec, CATALOG, "slurm-a", "no remounts here") == ("body.mounts[1].path",
                                                                           "slurm-a: no remounts here")
    assert pinned_refusal({"checkpoint": {"storage": "checkpoints"}}, CATALOG, "kube-b") == (
        "body.checkpoint.storage", "kube-b has no storage 'checkpoints'")
    assert pinned_refusal(spec, CATALOG, "kube-a") is None
    # With auto, a job no pool can serve is refused whole (check_pinned over every view).
    views = _pools(**{"slurm-b": 4, "kube-b": 4})
    assert "no storage 'datasets'" in check_pinned(_shape(spec), "auto", views)


def test_stored_limits_keep_the_storage_facts():
    v = _pools(**{"slurm-a": 4})["slurm-a"]
    limits = v.limits()
    back = PoolView.from_limits("slurm-a", limits, {"kind": "slurm", "storages": v.storages})
    assert back.remount_unsupported == v.remount_unsupported and back.storages == v.storages
    assert dataclasses.replace(back).storages == v.storages


def test_the_simulator_places_a_job_only_where_its_storage_is():
    from gateway.domain.sim_inputs import SimPool, TraceJob
    from gateway.domain.simulate import simulate

    pools = [SimPool("slurm-a", "slurm", 4, 8, storages=frozenset({"data"})), SimPool("slurm-b", "slurm", 4, 8)]
    trace = [TraceJob(f"j{i}", float(i), "a", 1, 8, 10.0, 10.0, storages=frozenset({"data"})) for i in range(8)]
    trace += [TraceJob("never", 0.0, "a", 1, 8, 10.0, 10.0, storages=frozenset({"elsewhere"}))]
    res = simulate(trace, pools, {"a": 1}, policy="reservation")
    placed = {o.job.id: o.pool for o in res.outcomes}
    assert {placed[f"j{i}"] for i in range(8)} == {"slurm-a"} and placed["never"] is None
