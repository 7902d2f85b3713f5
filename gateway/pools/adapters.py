"""Adapters per pool kind: which module, which settings class, and building one.

Pools are configured in ``ISTHMUS_POOLS_FILE`` or ``ISTHMUS_BACKENDS`` (gateway/pools/config.py);
each holds its adapter's settings (the fields of its settings dataclass, documented in
docs/slurm.md and docs/kubernetes.md). Every mistake is reported as one line naming the
pool and the field.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
from typing import Any

# The one registry of adapters by pool kind (adapters.base): it knows where each kind's adapter
# lives (ADAPTER_MODULES, imported lazily) and its settings dataclass (``settings_class``): a
# pool's settings are that dataclass's fields.
from adapters.base import ADAPTER_MODULES, Backend, adapter_class

__all__ = ["ADAPTER_MODULES", "BackendConfigError", "adapter_class", "build_backend", "settings_of"]

log = logging.getLogger("isthmus.backends")


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
