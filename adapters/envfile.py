"""Read the KEY=VALUE files the local test stack writes (``.stack/*/env``)."""

from __future__ import annotations

import shlex
from pathlib import Path


def read_env_file(path: str | Path) -> dict[str, str]:
    """Shell-style KEY=VALUE lines; comments and blank lines skipped, quotes removed."""
    out: dict[str, str] = {}
    for line in Path(path).read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, raw = line.split("=", 1)
        out[key.strip()] = " ".join(shlex.split(raw))
    return out
