"""Pools as data (#13, 1): the pools file, ISTHMUS_BACKENDS back-compat, reconcile at start-up."""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path

import pytest
from sqlalchemy import create_engine, select
from sqlalchemy.orm import sessionmaker

from gateway.kit.settings import Settings
from gateway.models.pools import Pool
from gateway.pools import config
from gateway.pools.adapters import BackendConfigError
from gateway.pools.service import reconcile
from tests.e2e.conftest import ISTHMUS

KEY = __file__  # any readable file stands in for a key/kubeconfig where only its presence is checked
SLURM = {"rest_url": "http://127.0.0.1:16820", "jwt_key_path": KEY}
KUBECONFIG = str(Path(__file__).with_name("kubeconfig.yaml"))  # loadable; nothing listens
KUBE = {"kubeconfig": KUBECONFIG, "cluster_queue": "gpu-a100"}


def _file(tmp_path, text: str):
    path = tmp_path / "pools.yaml"
    path.write_text(textwrap.dedent(text).replace("KUBECONFIG", KUBECONFIG).replace("KEY", KEY))
    return path


FIVE = """
pools:
  - name: slurm-22
    kind: slurm
    gpu_types: [A100]
    settings: {rest_url: "http://127.0.0.1:16820", jwt_key_path: KEY}
  - name: slurm-24
    kind: slurm
    weight: 2
    settings: {rest_url: "http://127.0.0.1:16824", jwt_key_path: KEY}
  - name: slurm-26
    kind: slurm
    cost: 2.5
    settings: {rest_url: "http://127.0.0.1:16826", jwt_key_path: KEY}
  - name: kube-a100
    kind: kubernetes
    settings: {kubeconfig: KUBECONFIG, cluster_queue: gpu-a100}
  - name: kube-h100
    kind: kubernetes
    state: draining
    settings: {kubeconfig: KUBECONFIG, cluster_queue: gpu-h100}
"""


def test_a_pools_file_with_five_pools_of_two_kinds(tmp_path):
    pools = config.load(Settings(pools_file=str(_file(tmp_path, FIVE)), backends="{}"))
    assert [(p.name, p.kind) for p in pools] == [("slurm-22", "slurm"), ("slurm-24", "slurm"), ("slurm-26", "slurm"),
                                                 ("kube-a100", "kubernetes"), ("kube-h100", "kubernetes")]
    by = {p.name: p for p in pools}
    assert by["slurm-22"].gpu_types == ("a100",) and by["slurm-24"].weight == 2.0 and by["slurm-26"].cost == 2.5
    assert by["kube-h100"].state == "draining" and by["kube-a100"].settings.cluster_queue == "gpu-a100"
    # What may be stored or shown never carries adapter settings (paths to keys, URLs).
    assert "settings" not in by["slurm-22"].public() and KEY not in json.dumps(by["slurm-22"].public())
    backends = config.build(pools)
    try:
        assert {n: b.name for n, b in backends.items()} == {p.name: p.kind for p in pools}
    finally:
        for b in backends.values():
            b.close()


@pytest.mark.parametrize("text, message", [
    ("pools:\n  - name: Slurm_A\n    kind: slurm\n",
     "pool 'Slurm_A', field 'name': not a pool name (a DNS label"),
    ("pools:\n  - name: a\n    kind: lsf\n", "pool 'a', field 'kind': unknown kind 'lsf'; one of kubernetes, slurm"),
    ("pools:\n  - name: a\n    settings: {}\n", "pool 'a', field 'kind': missing; one of kubernetes, slurm"),
    ("pools:\n  - name: a\n    kind: slurm\n    wieght: 2\n", "pool 'a', field 'wieght': unknown key"),
    ("pools:\n  - name: a\n    kind: slurm\n    weight: 0\n    settings: {rest_url: 'http://h:1', jwt_key_path: KEY}\n",
     "pool 'a', field 'weight': must be a number > 0 (got 0)"),
    ("pools:\n  - name: a\n    kind: slurm\n    cost: 5000\n    settings: {rest_url: 'http://h:1', jwt_key_path: KEY}\n",
     "pool 'a', field 'cost': must be at most 1000"),
    ("pools:\n  - name: a\n    kind: slurm\n    state: paused\n", "pool 'a', field 'state': one of active, draining"),
    ("pools:\n  - name: a\n    kind: slurm\n    settings: {rest_ulr: 'http://h:1'}\n",
     "pool 'a', field 'rest_ulr': unknown setting (did you mean 'rest_url'?)"),
    (("pools:\n  - {name: a, kind: kubernetes, settings: {kubeconfig: KEY}}\n"
     "  - {name: a, kind: kubernetes, settings: {kubeconfig: KEY}}\n"), "pool 'a', field 'name': defined twice"),
    ("pools: [1]\n", "pools[0] must be a mapping"),
    ("pool:\n  - name: a\n", "must be a mapping with the keys pools (a list of pools)"),
    ("pools: [\n", "not valid YAML at line"),
])
def test_a_bad_pools_file_is_one_line_naming_the_pool_and_field(tmp_path, text, message):
    path = _file(tmp_path, text)
    with pytest.raises(BackendConfigError) as err:
        config.from_file(path)
    assert str(err.value).startswith(f"ISTHMUS_POOLS_FILE {path}: ") and message in str(err.value), str(err.value)
    assert "\n" not in str(err.value)


def test_backends_json_is_still_accepted_and_may_carry_a_kind():
    pools = config.from_backends_json(json.dumps({"slurm": SLURM, "gpu-b": {"kind": "kubernetes", **KUBE}}))
    assert [(p.name, p.kind) for p in pools] == [("slurm", "slurm"), ("gpu-b", "kubernetes")]
    with pytest.raises(BackendConfigError, match=r"^ISTHMUS_BACKENDS: pool 'gpu-c': unknown pool; known: "
                                                 r"kubernetes, slurm \(or give the entry a \"kind\"\)$"):
        config.from_backends_json(json.dumps({"gpu-c": KUBE}))


def test_both_sources_at_once_are_refused(tmp_path):
    with pytest.raises(BackendConfigError, match="both ISTHMUS_POOLS_FILE and ISTHMUS_BACKENDS are set"):
        config.load(Settings(pools_file=str(_file(tmp_path, FIVE)), backends=json.dumps({"slurm": SLURM})))


@pytest.fixture
def sessions(database_url):
    engine = create_engine(database_url)
    yield sessionmaker(engine, expire_on_commit=False)
    with engine.begin() as conn:
        conn.exec_driver_sql("DELETE FROM job_event")
        conn.exec_driver_sql("DELETE FROM job")
        conn.exec_driver_sql("DELETE FROM pool WHERE name NOT IN ('slurm', 'kubernetes')")
    engine.dispose()


def _pools(tmp_path, text=FIVE):
    return config.from_file(_file(tmp_path, text))


def test_reconcile_adds_updates_keeps_admin_choices_and_retires_vanished_pools(sessions, tmp_path):
    pools = _pools(tmp_path)
    with sessions.begin() as s:
        reconcile(s, pools)
    with sessions.begin() as s:
        rows = {p.name: p for p in s.scalars(select(Pool))}
        assert rows["kube-h100"].state == "draining" and rows["slurm-24"].weight == 2.0
        assert not rows["slurm"].configured and not rows["kubernetes"].configured  # the old two: history only
        rows["slurm-22"].state, rows["slurm-22"].state_by = "disabled", "admin:carol"
        rows["slurm-24"].weight, rows["slurm-24"].weight_by = 5.0, "admin:carol"
    with sessions.begin() as s:
        notes = reconcile(s, [p for p in pools if p.name != "kube-h100"])
        rows = {p.name: p for p in s.scalars(select(Pool))}
    # The admin's PATCH wins over the file on the next start; a pool gone without jobs is retired, not dropped.
    assert rows["slurm-22"].state == "disabled" and rows["slurm-24"].weight == 5.0
    assert rows["kube-h100"].configured is False
    assert any("kube-h100: no longer configured" in n for n in notes)


def test_a_vanished_pool_with_active_jobs_stops_start_up(sessions, tmp_path, database_url, dev_key_path):
    from gateway.kit.timeutil import new_id, utcnow
    from gateway.models.accounts import Account
    from gateway.models.jobs import Job

    pools = _pools(tmp_path)
    with sessions.begin() as s:
        reconcile(s, pools)
        if s.get(Account, "team-a") is None:
            s.add(Account(name="team-a", shares=1, description=""))
            s.flush()
        s.execute(Job.__table__.insert().values(id=new_id(), name="j", account_name="team-a", submitted_by="dev:alice", username="alice",
                  requested_pool="kube-h100", pool="kube-h100", state="queued", state_reason="", spec={},
                  workers=1, gpus_per_worker=1, total_gpus=1, time_limit_s=60, priority=0, routing_reason="",
                  dispatch_attempts=1, created_at=utcnow(), updated_at=utcnow()))
    with sessions.begin() as s, pytest.raises(BackendConfigError) as err:
        reconcile(s, [p for p in pools if p.name != "kube-h100"])
    assert str(err.value).startswith("pools configuration: pool 'kube-h100' has 1 active job(s) but is no longer "
                                     "configured")
    # `isthmus worker` (and serve) exit 1 with that one line.
    _file(tmp_path, FIVE.split("  - name: kube-h100")[0])
    env = {k: v for k, v in os.environ.items() if not k.startswith("ISTHMUS_")}
    env.update(ISTHMUS_DATABASE_URL=database_url, ISTHMUS_POOLS_FILE=str(tmp_path / "pools.yaml"))
    r = subprocess.run([ISTHMUS, "worker", "--once"], env=env, cwd=tmp_path, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert [line for line in r.stderr.splitlines() if line.startswith("Error:")] == [
        f"Error: {err.value}"], r.stderr


def test_the_documented_pools_file_is_valid(tmp_path):
    """docs/pools.md carries a full commented pools file; it must load as written (key paths aside)."""
    import re

    from tests.conftest import REPO

    text = (REPO / "docs" / "pools.md").read_text()
    m = re.search(r"<!-- pools-example -->\n```yaml\n(.*?)```", text, flags=re.DOTALL)
    assert m, "docs/pools.md has no marked pools-file example"
    example = re.sub(r"/etc/isthmus/[a-z0-9.-]+", KEY, m.group(1))
    pools = config.from_file(_file(tmp_path, example))
    assert [(p.name, p.kind, p.state) for p in pools] == [
        ("slurm-a100", "slurm", "active"), ("slurm-h100", "slurm", "active"),
        ("kube-a100", "kubernetes", "active"), ("kube-h100", "kubernetes", "draining")]
