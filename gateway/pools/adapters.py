"""Adapters per pool kind: which module, which settings class, and building one.

Pools are configured in ``ISTHMUS_POOLS_FILE`` or ``ISTHMUS_BACKENDS`` (gateway/pools/config.py);
each holds its adapter's settings (the fields of its settings dataclass, documented in
docs/slurm.md and docs/kubernetes.md). Every mistake is reported as one line naming the
pool and the field.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import logging
from typing import Any

from adapters.base import Backend, registered

log = logging.getLogger("isthmus.backends")

# Where each pool KIND's adapter lives (never a pool name). Importing it registers the
# adapter class in the one registry (adapters.base.register), which also knows its settings
# dataclass (``settings_class``): a pool's settings are that dataclass's fields. Imported
# lazily: a site without Kubernetes pools never loads the Kubernetes client.
ADAPTER_MODULES = {"slurm": "adapters.slurm", "kubernetes": "adapters.kubernetes"}


def adapter_class(kind: str) -> type[Backend]:
    importlib.import_module(ADAPTER_MODULES[kind])
    return registered()[kind]


class BackendConfigError(ValueError):
    """The pools' configuration cannot work; the message is one line naming the pool and the field."""


def settings_of(kind: str, options: dict[str, Any], *, where: str) -> Any:
    """The adapter settings of a pool of ``kind``; ``where`` starts each error ("ISTHMUS_BACKENDS: pool 'x'")."""
    from pydantic import TypeAdapter, ValidationError

    def at(field: str | None) -> str:
        return where + (f", field {field!r}" if field else "")

    adapter = adapter_class(kind)
    cls = adapter.settings_class
    known = [f.name for f in dataclasses.fields(cls) if f.name not in adapter.code_only_settings]
    for key in options:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else f"; known: {', '.join(sorted(known))}"
            raise BackendConfigError(f"{at(key)}: unknown setting{hint}")
    try:
        settings = TypeAdapter(cls).validate_python(options)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or None
        raise BackendConfigError(f"{at(field)}: {err['msg']} (got {err.get('input')!r})") from None
    for field, message in settings.problems():
        raise BackendConfigError(f"{at(field)}: {message}")
    return settings


def build_backend(kind: str, settings: Any, *, where: str) -> Backend:
    cls = adapter_class(kind)
    try:
        backend = cls(settings)
    except (TypeError, ValueError) as exc:
        raise BackendConfigError(f"{where}: {exc}") from None
    # Settings an adapter can check only by loading them (a kubeconfig's content).
    for field, message in backend.config_problems():
        backend.close()
        raise BackendConfigError(f"{where}, field {field!r}: {message}")
    return backend
