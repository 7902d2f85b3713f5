"""Storage in the pools file (#29, 1): every mistake is one line naming the source, the storage
and the field, as pools' are; a good file gives the catalog routing and the adapters use."""

from __future__ import annotations

import textwrap

import pytest

from gateway.kit.settings import Settings
from gateway.pools import config
from gateway.pools.adapters import BackendConfigError
from tests.pools.test_config import FIVE, _file


def _storage(tmp_path, text: str):
    path = _file(tmp_path, FIVE + textwrap.dedent(text))
    settings = Settings(pools_file=str(path), backends="{}")
    return path, config.load_storage(settings, config.load(settings))


GOOD = """
storage:
  - name: datasets
    path: /shared/datasets
    mode: read-only
    pools:
      slurm-22: {}
      kube-a100: {pvc: datasets-rox}
  - name: checkpoints
    path: /shared/checkpoints
    mode: read-write
    accounts: [team-a]
    pools: {slurm-22: {}, slurm-24: {}, kube-a100: {nfs: {server: nfs.example, path: /export/ckpt}},
            kube-h100: {host_path: /srv/ckpt}}
"""


def test_a_storage_section_becomes_the_catalog_routing_reads(tmp_path):
    _, catalog = _storage(tmp_path, GOOD)
    datasets, ckpt = catalog.get("datasets"), catalog.get("checkpoints")
    # Read-only storages are shared; read-write ones are per account unless the file says otherwise.
    assert (datasets.mode, datasets.tenancy, datasets.accounts) == ("read-only", "shared", None)
    assert (ckpt.mode, ckpt.tenancy, ckpt.accounts) == ("read-write", "account", frozenset({"team-a"}))
    assert datasets.pools["kube-a100"].claim == "datasets-rox" and datasets.pools["slurm-22"].provider == "shared"
    assert ckpt.pools["kube-a100"].public() == {"provider": "nfs", "server": "nfs.example",
                                                "source_path": "/export/ckpt"}
    assert catalog.provided_by("slurm-22") == {"datasets", "checkpoints"}
    assert catalog.provided_by("slurm-26") == frozenset()
    assert [s.name for s in catalog.visible_to(["team-b"])] == ["datasets"]
    assert [s.name for s in catalog.visible_to(None)] == ["checkpoints", "datasets"]


def test_a_pools_file_without_storage_has_none():
    assert not config.load_storage(Settings(pools_file="", backends="{}"), [])


def _entry(**fields) -> str:
    lines = ["storage:", "  - name: " + fields.pop("name", "data")]
    fields.setdefault("path", "/shared/data")
    fields.setdefault("pools", "{slurm-22: {}}")
    lines += [f"    {k}: {v}" for k, v in fields.items()]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("text, message", [
    (_entry(pools="{slurm-99: {}}"), "storage 'data', field 'pools.slurm-99': unknown pool; configured: kube-a100"),
    (_entry(path="shared/data"), "storage 'data', field 'path': must be an absolute, normalised path"),
    (_entry(path="/shared/../etc"), "storage 'data', field 'path': must be an absolute, normalised path"),
    (_entry(path="'/shared/da ta'"), "storage 'data', field 'path': must be an absolute, normalised path"),
    (_entry(name="Data_1"), "storage 'Data_1', field 'name': not a storage name"),
    (_entry(mode="rw"), "storage 'data', field 'mode': one of read-only, read-write (got 'rw')"),
    (_entry(tenancy="user"), "storage 'data', field 'tenancy': one of account, shared"),
    (_entry(accounts="[]"), "storage 'data', field 'accounts': a non-empty list of account names"),
    (_entry(acounts="[a]"), "storage 'data', field 'acounts': unknown key; known: name, path, mode"),
    (_entry(pools="{slurm-22: {pvc: data}}"),
     "storage 'data', field 'pools.slurm-22': a slurm pool has the storage on its shared file system"),
    (_entry(pools="{kube-a100: {}}"),
     ("storage 'data', field 'pools.kube-a100': a kubernetes pool must say how it mounts the storage: pvc, nfs, "
     "host_path")),
    (_entry(pools="{kube-a100: {pvc: Data_Claim}}"), "storage 'data', field 'pools.kube-a100.pvc': not a claim name"),
    (_entry(pools="{kube-a100: {nfs: {server: h}}}"), "field 'pools.kube-a100.nfs': must be {server: HOST, path:"),
    (_entry(pools="{kube-a100: {host_path: relative}}"),
     "field 'pools.kube-a100.host_path': must be an absolute path"),
    (_entry(pools="{kube-a100: {ceph: x}}"), "field 'pools.kube-a100': unknown key 'ceph'; one of pvc, nfs"),
    (_entry(pools="{}"), "storage 'data', field 'pools': a mapping of pool name to how the pool provides it"),
    (_entry() + _entry().split("\n", 1)[1].replace("  - name: data", "  - name: data"),
     "storage 'data', field 'name': defined twice"),
    (_entry() + "  - name: inner\n    path: /shared/data/inner\n    pools: {slurm-22: {}}\n",
     "storage 'inner', field 'path': /shared/data/inner overlaps storage 'data' at /shared/data"),
    ("storage: {name: data}\n", "storage must be a list of storages"),
])
def test_a_bad_storage_entry_is_one_line_naming_the_storage_and_field(tmp_path, text, message):
    path = _file(tmp_path, FIVE + text)
    settings = Settings(pools_file=str(path), backends="{}")
    with pytest.raises(BackendConfigError) as err:
        config.load_storage(settings, config.load(settings))
    assert str(err.value).startswith(f"ISTHMUS_POOLS_FILE {path}: ") and message in str(err.value), str(err.value)
    assert "\n" not in str(err.value)


def test_the_documented_storage_section_is_valid(tmp_path):
    """docs/storage.md carries a storage section; with pools of those names it must load as written."""
    import re

    from tests.conftest import REPO

    text = (REPO / "docs" / "storage.md").read_text()
    m = re.search(r"<!-- storage-example -->\n```yaml\n(.*?)```", text, flags=re.DOTALL)
    assert m, "docs/storage.md has no marked storage example"
    doc = (REPO / "docs" / "pools.md").read_text()
    pools = re.search(r"<!-- pools-example -->\n```yaml\n(.*?)```", doc, flags=re.DOTALL).group(1)
    pools = re.sub(r"/etc/isthmus/[a-z0-9.-]+", config.__file__, pools)
    path = tmp_path / "pools.yaml"
    path.write_text(pools + m.group(1))
    settings = Settings(pools_file=str(path), backends="{}")
    catalog = config.load_storage(settings, config.load(settings))
    assert sorted(catalog.storages) == ["checkpoints", "datasets", "vision-raw"]
    assert catalog.get("checkpoints").tenancy == "account" and catalog.get("vision-raw").accounts == {"team-vision"}
