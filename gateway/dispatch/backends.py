"""The gateway's backends: one adapter per pool, chosen by the pool's kind.

Pools are configured in ``ISTHMUS_POOLS_FILE`` or ``ISTHMUS_BACKENDS`` (gateway/pools/config.py);
the adapters per kind are in gateway/pools/adapters.py. Every mistake is reported as one
line naming the pool and the field.
"""

from __future__ import annotations

from typing import Any

from adapters.base import Backend
from gateway.pools.adapters import (  # noqa: F401 - re-exported: older imports take them from here
    ADAPTER_MODULES, SETTINGS_CLASSES, BackendConfigError, build_backend, settings_of,
)
from gateway.pools.config import build, from_backends_json


def parse_settings(config_json: str) -> dict[str, Any]:
    """Each ``ISTHMUS_BACKENDS`` pool's adapter settings object, validated. Raises BackendConfigError."""
    return {p.name: p.settings for p in from_backends_json(config_json)}


def build_backends(config_json: str) -> dict[str, Backend]:
    """One backend per ``ISTHMUS_BACKENDS`` pool (tests; the gateway uses gateway.pools.config.load/build)."""
    return build(from_backends_json(config_json))
