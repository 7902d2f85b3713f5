"""Pools as data: where they are configured, validated in one line each.

A pool comes from ``ISTHMUS_POOLS_FILE`` (YAML, see docs/pools.md) or, for older
deployments, from ``ISTHMUS_BACKENDS`` (a JSON object keyed by pool name whose values are
the adapter settings; an entry may carry ``kind``; without one, the key must itself be a
kind, ``slurm`` or ``kubernetes``). Setting both is refused: one source of truth.

Every mistake is one line naming the source, the pool and the field, the style of
gateway/pools/adapters.py. Settings are validated by the adapter's own dataclass; they
may hold credentials' paths, so :meth:`PoolConfig.public` never carries them.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Iterable
from decimal import Decimal
from pathlib import Path
from typing import Any

from gateway.domain.prices import DEFAULT, MAX_PRICE, PriceList, parse_price
from gateway.domain.storage import (
    MODES,
    PROVIDERS,
    STORAGE_NAME,
    TENANCIES,
    Catalog,
    Provision,
    Storage,
    clean_path,
)
from gateway.kit.names import ACCOUNT_NAME, POOL_NAME  # (used with fullmatch)
from gateway.pools.adapters import (
    ADAPTER_MODULES,
    BackendConfigError,
    adapter_class,
    settings_of,
)

POOL_STATES = ("active", "draining", "disabled")
POOL_KINDS = tuple(sorted(ADAPTER_MODULES))
MAX_COST = 1000.0
_FILE_KEYS = ("name", "kind", "gpu_types", "weight", "cost", "state", "prices", "settings")
_TOP_KEYS = ("pools", "storage", "currency")
_CURRENCY = re.compile(r"[A-Z]{3}")  # an ISO 4217 code: plain text in every spreadsheet
_GPU_TYPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,31}")


@dataclasses.dataclass(frozen=True)
class PoolConfig:
    name: str
    kind: str
    settings: Any  # the adapter's settings dataclass, validated
    gpu_types: tuple[str, ...] = ()
    weight: float = 1.0
    cost: float = 1.0
    state: str = "active"
    # Price per GPU-hour by GPU type (lower case) or "default" (docs/pools.md, "Prices").
    prices: tuple[tuple[str, Decimal], ...] = ()
    source: str = ""  # where it was configured (ISTHMUS_POOLS_FILE <path> / ISTHMUS_BACKENDS), for errors

    def public(self) -> dict[str, Any]:
        """What may be stored and shown: never the adapter settings (paths to keys, URLs with tokens)."""
        return {"name": self.name, "kind": self.kind, "gpu_types": list(self.gpu_types), "weight": self.weight,
                "cost": self.cost, "state": self.state}


def _where(source: str, pool: str | None = None, field: str | None = None) -> str:
    return source + (f": pool {pool!r}" if pool is not None else "") + (f", field {field!r}" if field else "")


def _number(source: str, pool: str, field: str, value: Any, *, default: float, high: float | None = None) -> float:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise BackendConfigError(f"{_where(source, pool, field)}: must be a number > 0 (got {value!r})")
    if high is not None and value > high:
        raise BackendConfigError(f"{_where(source, pool, field)}: must be at most {high:g} (got {value!r})")
    return float(value)


def _pool(source: str, name: Any, kind: Any, options: Any, extra: dict[str, Any]) -> PoolConfig:
    if not isinstance(name, str) or not POOL_NAME.fullmatch(name):
        raise BackendConfigError(f"{_where(source, str(name), 'name')}: not a pool name (a DNS label: lower-case "
                                 "letters, digits and '-', at most 63, e.g. slurm-h100)")
    if kind not in ADAPTER_MODULES:
        raise BackendConfigError(f"{_where(source, name, 'kind')}: unknown kind {kind!r}; one of "
                                 f"{', '.join(POOL_KINDS)}")
    if options is None:
        options = {}
    if not isinstance(options, dict):
        raise BackendConfigError(f"{_where(source, name)}: settings must be an object of settings, "
                                 f"not {type(options).__name__}")
    gpu_types = extra.get("gpu_types") or []
    if not isinstance(gpu_types, list) or not all(isinstance(t, str) and _GPU_TYPE.fullmatch(t) for t in gpu_types):
        raise BackendConfigError(f"{_where(source, name, 'gpu_types')}: must be a list of GPU type names, e.g. "
                                 f"[a100, h100] (got {gpu_types!r})")
    from gateway.domain.shapes import normalise_gpu_type

    state = extra.get("state") or "active"
    if state not in POOL_STATES:
        raise BackendConfigError(f"{_where(source, name, 'state')}: one of {', '.join(POOL_STATES)} (got {state!r})")
    return PoolConfig(
        name=name, kind=kind, settings=settings_of(kind, options, where=_where(source, name)),
        gpu_types=tuple(sorted({normalise_gpu_type(t) for t in gpu_types})),
        weight=_number(source, name, "weight", extra.get("weight"), default=1.0),
        cost=_number(source, name, "cost", extra.get("cost"), default=1.0, high=MAX_COST), state=state,
        prices=_prices(source, name, extra.get("prices")), source=source)


def _prices(source: str, pool: str, value: Any) -> tuple[tuple[str, Decimal], ...]:
    """A pool's ``prices:`` mapping (GPU type or ``default`` -> price per GPU-hour), as Decimals."""
    from gateway.domain.shapes import normalise_gpu_type

    if value is None:
        return ()
    if not isinstance(value, dict):
        raise BackendConfigError(f"{_where(source, pool, 'prices')}: must be a mapping of GPU type (or default) to "
                                 f"a price per GPU-hour, e.g. {{h100: 2.50, default: 1.20}} (got {value!r})")
    out: dict[str, Decimal] = {}
    for gpu_type, price in value.items():
        if not isinstance(gpu_type, str) or not (gpu_type == DEFAULT or _GPU_TYPE.fullmatch(gpu_type)):
            raise BackendConfigError(f"{_where(source, pool, 'prices')}: {gpu_type!r} is not a GPU type name "
                                     f"or {DEFAULT}")
        key = DEFAULT if gpu_type == DEFAULT else normalise_gpu_type(gpu_type)
        d = parse_price(price)
        if d is None:
            raise BackendConfigError(f"{_where(source, pool, f'prices.{gpu_type}')}: must be a price per GPU-hour, "
                                     f"a number from 0 to {MAX_PRICE} with at most 6 decimals (got {price!r})")
        if key in out:
            raise BackendConfigError(f"{_where(source, pool, f'prices.{gpu_type}')}: priced twice")
        out[key] = d
    return tuple(sorted(out.items()))


def from_backends_json(config_json: str) -> list[PoolConfig]:
    """Pools from the old ``ISTHMUS_BACKENDS`` JSON (back-compat)."""
    source = "ISTHMUS_BACKENDS"
    try:
        config: Any = json.loads(config_json or "{}")
    except json.JSONDecodeError as exc:
        raise BackendConfigError(f"{source} is not valid JSON: {exc.msg} at position {exc.pos}") from None
    if not isinstance(config, dict):
        raise BackendConfigError(f'{source} must be a JSON object keyed by pool, e.g. {{"slurm": {{...}}}}')
    pools = []
    for name, options in config.items():
        if options is not None and not isinstance(options, dict):
            raise BackendConfigError(f"{_where(source, name)}: must be a JSON object of settings, "
                                     f"not {type(options).__name__}")
        options = dict(options or {})
        kind = options.pop("kind", None)
        if kind is None:
            if name not in ADAPTER_MODULES:
                raise BackendConfigError(f"{_where(source, name)}: unknown pool; known: {', '.join(POOL_KINDS)} "
                                         f"(or give the entry a \"kind\")")
            kind = name
        pools.append(_pool(source, name, kind, options, {}))
    return pools


def _read(path: str | Path) -> tuple[str, dict]:
    """(source, document) of a pools file; BackendConfigError (one line) when unreadable."""
    import yaml

    source = f"ISTHMUS_POOLS_FILE {path}"
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise BackendConfigError(f"{source}: cannot read: {exc.strerror}") from None
    try:
        doc = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise BackendConfigError(f"{source}: not valid YAML{at}") from None
    if not isinstance(doc, dict) or set(doc) - set(_TOP_KEYS) or not isinstance(doc.get("pools", []), list):
        raise BackendConfigError(f"{source}: must be a mapping with the keys pools (a list of pools) and, "
                                 "optionally, storage (a list of storages, docs/storage.md) and currency")
    return source, doc


def from_file(path: str | Path) -> list[PoolConfig]:
    """Pools from a YAML pools file (docs/pools.md)."""
    source, doc = _read(path)
    pools: list[PoolConfig] = []
    for i, entry in enumerate(doc.get("pools") or []):
        if not isinstance(entry, dict):
            raise BackendConfigError(f"{source}: pools[{i}] must be a mapping (name, kind, settings, ...)")
        name = entry.get("name", f"#{i}")
        unknown = sorted(set(entry) - set(_FILE_KEYS))
        if unknown:
            raise BackendConfigError(f"{_where(source, str(name), unknown[0])}: unknown key; known: "
                                     f"{', '.join(_FILE_KEYS)}")
        if "kind" not in entry:
            raise BackendConfigError(f"{_where(source, str(name), 'kind')}: missing; one of {', '.join(POOL_KINDS)}")
        pool = _pool(source, name, entry["kind"], entry.get("settings"), entry)
        if any(p.name == pool.name for p in pools):
            raise BackendConfigError(f"{_where(source, pool.name, 'name')}: defined twice")
        pools.append(pool)
    return pools


def load(settings: Any) -> list[PoolConfig]:
    """The configured pools, in order. Raises BackendConfigError (one line)."""
    pools_file = getattr(settings, "pools_file", "") or ""
    backends = (getattr(settings, "backends", "") or "").strip()
    if pools_file and backends not in ("", "{}"):
        raise BackendConfigError("both ISTHMUS_POOLS_FILE and ISTHMUS_BACKENDS are set: keep one (the pools file; "
                                 "docs/pools.md shows how an ISTHMUS_BACKENDS entry becomes a pool)")
    return from_file(pools_file) if pools_file else from_backends_json(backends)


def load_prices(settings: Any, pools: list[PoolConfig]) -> PriceList:
    """The pools' prices per GPU-hour and the site's currency (docs/pools.md, "Prices"); none
    with ISTHMUS_BACKENDS. Raises BackendConfigError (one line)."""
    currency = ""
    pools_file = getattr(settings, "pools_file", "") or ""
    if pools_file:
        source, doc = _read(pools_file)
        currency = doc.get("currency")
        if currency is None:
            currency = ""
        elif not isinstance(currency, str) or not _CURRENCY.fullmatch(currency):
            raise BackendConfigError(f"{source}: field 'currency': an ISO 4217 code such as EUR or USD "
                                     f"(got {currency!r})")
    return PriceList(currency=currency, pools={p.name: dict(p.prices) for p in pools if p.prices})


def load_storage(settings: Any, pools: list[PoolConfig]) -> Catalog:
    """The storages of the pools file (none with ISTHMUS_BACKENDS). Raises BackendConfigError (one line)."""
    pools_file = getattr(settings, "pools_file", "") or ""
    if not pools_file:
        return Catalog()
    source, doc = _read(pools_file)
    return storage_from(source, doc.get("storage"), {p.name: p.kind for p in pools})


def check_storage(catalog: Catalog, backends: dict[str, Any], accounts: Iterable[str]) -> list[str]:
    """Ask each pool whether it can give the storages it is said to provide (a Kubernetes pool:
    each claim exists and is bound in the namespaces of ``accounts`` that may use it, and
    allows writing where the storage is read-write). Raises BackendConfigError (one line)
    for the first problem; returns notes for the log on pools that could not be asked now."""
    from adapters.base import BackendError, BackendUnavailable, VolumeMount

    notes: list[str] = []
    accounts = sorted(set(accounts))
    for storage in catalog.storages.values():
        users = [a for a in accounts if storage.allows(a)] if storage.accounts is None else sorted(storage.accounts)
        for pool, provision in storage.pools.items():
            backend = backends.get(pool)
            if backend is None:
                continue
            mount = VolumeMount(storage=storage.name, path=storage.path, root=storage.path,
                                read_only=not storage.writable, provider=provision.provider, claim=provision.claim,
                                server=provision.server, source_path=provision.source_path)
            try:
                problems = backend.storage_problems(mount, users)
            except BackendUnavailable as exc:
                notes.append(f"storage {storage.name!r} on pool {pool!r}: not checked ({exc.message})")
                continue
            except BackendError as exc:
                problems = [f"cannot be checked: {exc.message}"]
            for problem in problems:
                raise BackendConfigError(f"storage {storage.name!r}, field 'pools.{pool}': {problem}")
    return notes


_STORAGE_KEYS = ("name", "path", "mode", "tenancy", "accounts", "pools")


def _storage_where(source: str, name: str, field: str | None = None) -> str:
    return f"{source}: storage {name!r}" + (f", field {field!r}" if field else "")


def _provision(source: str, name: str, pool: str, kind: str, value: Any) -> Provision:
    where = _storage_where(source, name, f"pools.{pool}")

    def sub(key: str) -> str:
        return _storage_where(source, name, f"pools.{pool}.{key}")

    # How a pool of this kind may provide a storage: its adapter says (docs/storage.md).
    allowed = adapter_class(kind).storage_providers if kind in ADAPTER_MODULES else ()
    if value is None:
        value = {}
    if not isinstance(value, dict) or len(value) > 1:
        raise BackendConfigError(f"{where}: must be {{}} or one of {{pvc: NAME}}, {{nfs: {{server, path}}}}, "
                                 f"{{host_path: PATH}} (got {value!r})")
    provider = next(iter(value), "shared")
    if provider not in PROVIDERS:
        raise BackendConfigError(f"{where}: unknown key {provider!r}; one of pvc, nfs, host_path (or {{}})")
    if provider not in allowed:
        if allowed == ("shared",):
            raise BackendConfigError(f"{where}: a slurm pool has the storage on its shared file system at the "
                                     f"storage's path: write {{}} (got {provider})")
        raise BackendConfigError(f"{where}: a {kind} pool must say how it mounts the storage: "
                                 f"{', '.join(allowed)}")
    spec = value.get(provider)
    if provider == "pvc":
        if not isinstance(spec, str) or not POOL_NAME.fullmatch(spec):
            raise BackendConfigError(f"{sub('pvc')}: not a claim name (a DNS label, got {spec!r})")
        return Provision("pvc", claim=spec)
    if provider == "nfs":
        if not isinstance(spec, dict) or set(spec) != {"server", "path"}:
            raise BackendConfigError(f"{sub('nfs')}: must be {{server: HOST, path: /EXPORT}} (got {spec!r})")
        server, path = spec["server"], spec["path"]
        if not isinstance(server, str) or not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?", server):
            raise BackendConfigError(f"{sub('nfs.server')}: not a host name or address (got {server!r})")
        if clean_path(path) is None:
            raise BackendConfigError(f"{sub('nfs.path')}: must be an absolute path (got {path!r})")
        return Provision("nfs", server=server, source_path=path)
    if provider == "host_path":
        if clean_path(spec) is None:
            raise BackendConfigError(f"{sub('host_path')}: must be an absolute path (got {spec!r})")
        return Provision("host_path", source_path=spec)
    return Provision("shared")


def storage_from(source: str, entries: Any, pool_kinds: dict[str, str]) -> Catalog:
    """The ``storage:`` list of a pools file as a Catalog; every mistake one line naming the
    source, the storage and the field."""
    if entries is None:
        return Catalog()
    if not isinstance(entries, list):
        raise BackendConfigError(f"{source}: storage must be a list of storages (docs/storage.md)")
    out: dict[str, Storage] = {}
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise BackendConfigError(f"{source}: storage[{i}] must be a mapping (name, path, mode, pools, ...)")
        name = entry.get("name")
        if not isinstance(name, str) or not STORAGE_NAME.fullmatch(name):
            raise BackendConfigError(f"{_storage_where(source, str(name if name is not None else f'#{i}'), 'name')}: "
                                     "not a storage name (lower-case letters, digits and '-', at most 32)")
        unknown = sorted(set(entry) - set(_STORAGE_KEYS))
        if unknown:
            raise BackendConfigError(f"{_storage_where(source, name, unknown[0])}: unknown key; known: "
                                     f"{', '.join(_STORAGE_KEYS)}")
        if name in out:
            raise BackendConfigError(f"{_storage_where(source, name, 'name')}: defined twice")
        path = entry.get("path")
        if clean_path(path) is None:
            raise BackendConfigError(f"{_storage_where(source, name, 'path')}: must be an absolute, normalised path "
                                     f"of plain names, e.g. /shared/datasets (got {path!r})")
        overlap = next((s for s in out.values() if path == s.path or path.startswith(s.path + "/")
                        or s.path.startswith(path + "/")), None)
        if overlap is not None:
            raise BackendConfigError(f"{_storage_where(source, name, 'path')}: {path} overlaps storage "
                                     f"{overlap.name!r} at {overlap.path}")
        mode = entry.get("mode", "read-only")
        if mode not in MODES:
            raise BackendConfigError(f"{_storage_where(source, name, 'mode')}: one of {', '.join(MODES)} "
                                     f"(got {mode!r})")
        tenancy = entry.get("tenancy", "account" if mode == "read-write" else "shared")
        if tenancy not in TENANCIES:
            raise BackendConfigError(f"{_storage_where(source, name, 'tenancy')}: one of {', '.join(TENANCIES)} "
                                     f"(got {tenancy!r})")
        accounts = entry.get("accounts")
        if accounts is not None:
            if not isinstance(accounts, list) or not accounts or \
                    not all(isinstance(a, str) and ACCOUNT_NAME.fullmatch(a) for a in accounts):
                raise BackendConfigError(f"{_storage_where(source, name, 'accounts')}: a non-empty list of account "
                                         f"names, or leave it out for every account (got {accounts!r})")
            accounts = frozenset(accounts)
        provided = entry.get("pools")
        if not isinstance(provided, dict) or not provided:
            raise BackendConfigError(f"{_storage_where(source, name, 'pools')}: a mapping of pool name to how the "
                                     "pool provides it, e.g. {slurm-a100: {}, kube-a100: {pvc: datasets}}")
        provisions = {}
        for pool, value in provided.items():
            if pool not in pool_kinds:
                known = ", ".join(sorted(pool_kinds)) or "none"
                raise BackendConfigError(f"{_storage_where(source, name, f'pools.{pool}')}: unknown pool; "
                                         f"configured: {known}")
            provisions[pool] = _provision(source, name, pool, pool_kinds[pool], value)
        out[name] = Storage(name=name, path=path, mode=mode, tenancy=tenancy, pools=provisions, accounts=accounts)
    return Catalog(out)


def build(pools: list[PoolConfig]) -> dict[str, Any]:
    """One adapter per pool, chosen by the pool's KIND (adapters.base.registered)."""
    from gateway.pools.adapters import build_backend

    backends = {}
    try:
        for pool in pools:
            backends[pool.name] = build_backend(pool.kind, pool.settings, where=_where(pool.source, pool.name)
                                                if pool.source else f"pool {pool.name!r}")
    except BackendConfigError:
        for b in backends.values():
            b.close()
        raise
    return backends
