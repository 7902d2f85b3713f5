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
from pathlib import Path
from typing import Any

from gateway.pools.adapters import ADAPTER_MODULES, BackendConfigError, settings_of

from gateway.kit.names import POOL_NAME  # noqa: E402  (an RFC 1123 label, used with fullmatch)

POOL_STATES = ("active", "draining", "disabled")
POOL_KINDS = tuple(sorted(ADAPTER_MODULES))
MAX_COST = 1000.0
_FILE_KEYS = ("name", "kind", "gpu_types", "weight", "cost", "state", "settings")
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
        source=source)


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


def from_file(path: str | Path) -> list[PoolConfig]:
    """Pools from a YAML pools file (docs/pools.md)."""
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
    if not isinstance(doc, dict) or set(doc) - {"pools"} or not isinstance(doc.get("pools", []), list):
        raise BackendConfigError(f"{source}: must be a mapping with one key, pools: a list of pools")
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
