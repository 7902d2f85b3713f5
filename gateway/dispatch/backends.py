"""The gateway's backends, built from settings (``ISTHMUS_BACKENDS``).

``ISTHMUS_BACKENDS`` is a JSON object keyed by pool; each value holds that pool's adapter
settings (the fields of its settings dataclass, documented in docs/slurm.md and
docs/kubernetes.md). Every mistake is reported as one line naming the pool and the field.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import json
import logging
from typing import Any

from adapters.base import Backend, registered

log = logging.getLogger("isthmus.backends")

# Importing the adapter package registers it (adapters.base.register). Each adapter takes
# its own settings dataclass; ISTHMUS_BACKENDS options are that dataclass's fields.
ADAPTER_MODULES = {"slurm": "adapters.slurm", "kubernetes": "adapters.kubernetes"}
SETTINGS_CLASSES = {"slurm": "SlurmSettings", "kubernetes": "KubernetesSettings"}
# Settings that only make sense from Python (callables), not from JSON.
_NOT_FROM_JSON = {"slurm": {"token"}}


class BackendConfigError(ValueError):
    """ISTHMUS_BACKENDS cannot work; the message is one line naming the pool and the field."""


def _where(pool: str, field: str | None = None) -> str:
    return f"ISTHMUS_BACKENDS: pool {pool!r}" + (f", field {field!r}" if field else "")


def parse_settings(config_json: str) -> dict[str, Any]:
    """Each pool's adapter settings object, validated. Raises BackendConfigError."""
    try:
        config: Any = json.loads(config_json or "{}")
    except json.JSONDecodeError as exc:
        raise BackendConfigError(f"ISTHMUS_BACKENDS is not valid JSON: {exc.msg} at position {exc.pos}") from None
    if not isinstance(config, dict):
        raise BackendConfigError('ISTHMUS_BACKENDS must be a JSON object keyed by pool, e.g. {"slurm": {...}}')
    out: dict[str, Any] = {}
    for pool, options in config.items():
        if pool not in ADAPTER_MODULES:
            raise BackendConfigError(f"{_where(pool)}: unknown pool; known: {', '.join(sorted(ADAPTER_MODULES))}")
        if options is None:
            options = {}
        if not isinstance(options, dict):
            raise BackendConfigError(f"{_where(pool)}: must be a JSON object of settings, not {type(options).__name__}")
        out[pool] = _settings_of(pool, options)
    return out


def _settings_of(pool: str, options: dict[str, Any]) -> Any:
    from pydantic import TypeAdapter, ValidationError

    module = importlib.import_module(ADAPTER_MODULES[pool])
    cls = getattr(module, SETTINGS_CLASSES[pool])
    known = [f.name for f in dataclasses.fields(cls) if f.name not in _NOT_FROM_JSON.get(pool, ())]
    for key in options:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else f"; known: {', '.join(sorted(known))}"
            raise BackendConfigError(f"{_where(pool, key)}: unknown setting{hint}")
    try:
        settings = TypeAdapter(cls).validate_python(options)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or None
        raise BackendConfigError(f"{_where(pool, field)}: {err['msg']} (got {err.get('input')!r})") from None
    for field, message in settings.problems():
        raise BackendConfigError(f"{_where(pool, field)}: {message}")
    return settings


def build_backends(config_json: str) -> dict[str, Backend]:
    backends: dict[str, Backend] = {}
    for pool, settings in parse_settings(config_json).items():
        cls = registered()[pool]
        try:
            backends[pool] = cls(settings)
        except (TypeError, ValueError) as exc:
            raise BackendConfigError(f"{_where(pool)}: {exc}") from None
        # Settings an adapter can check only by loading them (a kubeconfig's content).
        for field, message in getattr(backends[pool], "config_problems", list)():
            for b in backends.values():
                b.close()
            raise BackendConfigError(f"{_where(pool, field)}: {message}")
    return backends
