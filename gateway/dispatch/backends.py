"""The gateway's backends, built from settings (``ISTHMUS_BACKENDS``)."""

from __future__ import annotations

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


class BackendConfigError(ValueError):
    pass


def build_backends(config_json: str) -> dict[str, Backend]:
    try:
        config: dict[str, Any] = json.loads(config_json or "{}")
    except json.JSONDecodeError as exc:
        raise BackendConfigError(f"ISTHMUS_BACKENDS is not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise BackendConfigError("ISTHMUS_BACKENDS must be a JSON object {name: options}")
    backends: dict[str, Backend] = {}
    for name, options in config.items():
        if name not in ADAPTER_MODULES:
            raise BackendConfigError(f"unknown backend {name!r}; known: {sorted(ADAPTER_MODULES)}")
        module = importlib.import_module(ADAPTER_MODULES[name])
        cls = registered()[name]
        try:
            settings_cls = getattr(module, SETTINGS_CLASSES[name])
            backends[name] = cls(settings_cls(**(options or {})))
        except (TypeError, ValueError) as exc:
            raise BackendConfigError(f"backend {name!r}: bad options: {exc}") from None
    return backends
