"""Storage as data: named storages a job mounts at the same path on every pool (docs/storage.md).

Pure: the pools file's ``storage:`` entries, once validated (gateway/pools/config.py), are a
:class:`Catalog`; this module answers what a job may mount, where its data and its
checkpoints are, which pools can run it, and what each pool's adapter must mount. No
database, no adapter calls.

Paths. A storage has one canonical ``path``. With ``tenancy: account`` (the default for a
read-write storage) each account has its own directory under it, ``<path>/<account>``, and
a job of that account sees only that one: on Kubernetes the volume's ``subPath`` is the
account's directory, mounted at ``<path>/<account>``; on Slurm the directory sits on the
cluster's shared file system at the same path, created by the job (mode 0700, its POSIX
user) when missing. With ``tenancy: shared`` (the default for a read-only storage) every
job sees ``<path>`` whole. A checkpoint directory is
``<path>/<account>/checkpoints/<lineage>``: one per job lineage (the job itself, or the
first job of a ``resume_from`` chain), the same for every retry, requeue or move.
"""

from __future__ import annotations

import dataclasses
import posixpath
import re
from collections.abc import Iterable, Mapping, Sequence

MODES = ("read-only", "read-write")
TENANCIES = ("account", "shared")
# How a pool provides a storage: "shared" (the cluster's own file system has it at the
# canonical path: the only way a Slurm pool can), or a volume the Kubernetes adapter mounts.
PROVIDERS = ("shared", "pvc", "nfs", "host_path")
STORAGE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,30}[a-z0-9])?")
# An absolute, normalised path of plain segments: no "..", no "//", no trailing "/", no
# spaces or shell metacharacters (it reaches a batch script and a pod spec).
ABS_PATH = re.compile(r"(/[A-Za-z0-9._+-]+)+")
MAX_PATH = 255


def clean_path(path: str) -> str | None:
    """``path`` if it is an absolute, normalised path of plain segments, else None."""
    if not isinstance(path, str) or len(path) > MAX_PATH or not ABS_PATH.fullmatch(path):
        return None
    if posixpath.normpath(path) != path or any(seg in (".", "..") for seg in path.split("/")):
        return None
    return path


@dataclasses.dataclass(frozen=True)
class Provision:
    """How one pool provides one storage."""

    provider: str  # one of PROVIDERS
    claim: str = ""  # pvc: the PersistentVolumeClaim's name (in each account's namespace)
    server: str = ""  # nfs: the server
    source_path: str = ""  # nfs: the export; host_path: the directory on the nodes

    def public(self) -> dict:
        out: dict = {"provider": self.provider}
        if self.claim:
            out["claim"] = self.claim
        if self.server:
            out["server"] = self.server
        if self.source_path:
            out["source_path"] = self.source_path
        return out


@dataclasses.dataclass(frozen=True)
class Storage:
    name: str
    path: str
    mode: str  # read-only | read-write
    tenancy: str  # account | shared
    pools: Mapping[str, Provision]
    accounts: frozenset[str] | None = None  # None: every account

    @property
    def writable(self) -> bool:
        return self.mode == "read-write"

    def allows(self, account: str, chain: Iterable[str] = ()) -> bool:
        """Whether jobs of ``account`` may mount it: listed itself or through an ancestor."""
        if self.accounts is None:
            return True
        return account in self.accounts or any(a in self.accounts for a in chain)

    def account_dir(self, account: str) -> str:
        """The directory a job of ``account`` sees: its own, or the whole storage when shared."""
        return f"{self.path}/{account}" if self.tenancy == "account" else self.path

    def public(self) -> dict:
        return {"name": self.name, "path": self.path, "mode": self.mode, "tenancy": self.tenancy,
                "pools": sorted(self.pools)}


@dataclasses.dataclass(frozen=True)
class Catalog:
    storages: Mapping[str, Storage] = dataclasses.field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.storages)

    def get(self, name: str) -> Storage | None:
        return self.storages.get(name)

    def provided_by(self, pool: str) -> frozenset[str]:
        """The storages a pool provides (routing's ``PoolView.storages``)."""
        return frozenset(n for n, s in self.storages.items() if pool in s.pools)

    def visible_to(self, accounts: Iterable[str] | None) -> list[Storage]:
        """The storages any of ``accounts`` may mount (None: every storage, for an admin)."""
        if accounts is None:
            return [self.storages[n] for n in sorted(self.storages)]
        accounts = set(accounts)
        return [s for n, s in sorted(self.storages.items()) if s.accounts is None or s.accounts & accounts]


NO_STORAGE = Catalog()


@dataclasses.dataclass(frozen=True)
class MountError(Exception):
    field: str  # e.g. "body.mounts[1]", "body.checkpoint.storage"
    message: str


def checkpoint_dir(storage: Storage, account: str, lineage: str) -> str:
    """Where a job lineage keeps its checkpoints: per account whatever the storage's tenancy."""
    return f"{storage.path}/{account}/checkpoints/{lineage}"


@dataclasses.dataclass(frozen=True)
class Mount:
    """One directory a job sees, resolved from its spec (the same on every pool)."""

    storage: str
    path: str  # where the job sees it
    sub_path: str  # the directory inside the storage ("" = its root)
    read_only: bool
    checkpoint: bool = False  # the lineage's checkpoint directory (created when missing)
    # True: seen at a path the job chose, not where the directory is on a shared file
    # system; only a pool that mounts volumes (Kubernetes) can do that.
    remounted: bool = False


def needed_storages(spec: Mapping) -> frozenset[str]:
    """The storages a job's spec needs on its pool (mounts and checkpoint)."""
    names = {m.get("storage") for m in spec.get("mounts") or () if isinstance(m, Mapping)}
    checkpoint = spec.get("checkpoint")
    if isinstance(checkpoint, Mapping):
        names.add(checkpoint.get("storage"))
    return frozenset(n for n in names if isinstance(n, str))


def remounts(spec: Mapping) -> bool:
    """Whether a mount asks for a path other than the storage's own (only pools that mount can)."""
    return any(isinstance(m, Mapping) and m.get("path") for m in spec.get("mounts") or ())


def check_spec(spec: Mapping, catalog: Catalog, account: str, chain: Sequence[str] = ()) -> None:
    """Submit-time checks of a job's ``mounts`` and ``checkpoint``: raises :class:`MountError`
    naming the field. ``chain``: the account's ancestors (a storage allowed to an ancestor is
    allowed to its subtree)."""
    seen_paths: dict[str, str] = {}
    seen_storages: set[str] = set()
    for i, m in enumerate(spec.get("mounts") or ()):
        field = f"body.mounts[{i}]"
        storage = catalog.get(m["storage"])
        if storage is None:
            known = ", ".join(sorted(catalog.storages)) or "none is configured"
            raise MountError(f"{field}.storage", f"no storage named {m['storage']!r} (GET /v1/storage; {known})")
        if not storage.allows(account, chain):
            raise MountError(f"{field}.storage", f"account {account!r} may not use storage {storage.name!r}")
        if m.get("read_only") is False and not storage.writable:
            raise MountError(f"{field}.read_only", f"storage {storage.name!r} is read-only")
        if storage.name in seen_storages:
            raise MountError(f"{field}.storage", f"storage {storage.name!r} is mounted twice")
        seen_storages.add(storage.name)
        where = m.get("path") or storage.account_dir(account)
        clash = next((p for p in seen_paths if where == p or where.startswith(p + "/") or p.startswith(where + "/")),
                     None)
        if clash is not None:
            raise MountError(f"{field}.path", f"{where} overlaps the mount of {seen_paths[clash]!r} at {clash}")
        seen_paths[where] = storage.name
    checkpoint = spec.get("checkpoint")
    if checkpoint:
        storage = catalog.get(checkpoint["storage"])
        field = "body.checkpoint.storage"
        if storage is None:
            known = ", ".join(sorted(catalog.storages)) or "none is configured"
            raise MountError(field, f"no storage named {checkpoint['storage']!r} (GET /v1/storage; {known})")
        if not storage.allows(account, chain):
            raise MountError(field, f"account {account!r} may not use storage {storage.name!r}")
        if not storage.writable:
            raise MountError(field, f"storage {storage.name!r} is read-only; checkpoints need a read-write storage")


def pinned_refusal(spec: Mapping, catalog: Catalog, pool: str, remount_unsupported: str = "") -> tuple[str, str] | None:
    """(field, message) when the pool a job names cannot give it its storage, else None."""
    for i, m in enumerate(spec.get("mounts") or ()):
        storage = catalog.get(m["storage"])
        if storage is not None and pool not in storage.pools:
            return f"body.mounts[{i}].storage", f"{pool} has no storage {storage.name!r}"
        if m.get("path") and remount_unsupported:
            return f"body.mounts[{i}].path", f"{pool}: {remount_unsupported}"
    checkpoint = spec.get("checkpoint")
    if checkpoint:
        storage = catalog.get(checkpoint["storage"])
        if storage is not None and pool not in storage.pools:
            return "body.checkpoint.storage", f"{pool} has no storage {storage.name!r}"
    return None


def mounts_of(spec: Mapping, catalog: Catalog, account: str, lineage: str | None) -> list[Mount]:
    """What the job sees, in the spec's order, then its checkpoint directory. Assumes
    :func:`check_spec` passed when the job was submitted (a storage removed since is skipped
    here and caught by routing, which then finds no pool that has it)."""
    out: list[Mount] = []
    for m in spec.get("mounts") or ():
        storage = catalog.get(m["storage"])
        if storage is None:
            continue
        sub = account if storage.tenancy == "account" else ""
        read_only = (not storage.writable) or bool(m.get("read_only"))
        out.append(Mount(storage=storage.name, path=m.get("path") or storage.account_dir(account), sub_path=sub,
                         read_only=read_only, remounted=bool(m.get("path"))))
    checkpoint = spec.get("checkpoint")
    if checkpoint and lineage:
        storage = catalog.get(checkpoint["storage"])
        if storage is not None:
            path = checkpoint_dir(storage, account, lineage)
            out.append(Mount(storage=storage.name, path=path, sub_path=path[len(storage.path) + 1:],
                             read_only=False, checkpoint=True))
    return out


def env_of(mounts: Sequence[Mount]) -> dict[str, str]:
    """The variables a job gets for its mounts: ``ISTHMUS_STORAGE_<NAME>`` per mount and
    ``ISTHMUS_CHECKPOINT_DIR``."""
    env: dict[str, str] = {}
    for m in mounts:
        if m.checkpoint:
            env["ISTHMUS_CHECKPOINT_DIR"] = m.path
        else:
            env["ISTHMUS_STORAGE_" + m.storage.upper().replace("-", "_")] = m.path
    return env
