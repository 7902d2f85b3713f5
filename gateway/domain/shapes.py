"""Job shapes as plain values: memory and duration parsing, GPU-type normalisation.

The request schemas (gateway/jobs/schemas.py) validate with these; the ledger, routing,
the pools file and dispatch read stored specs with them. Pure: no I/O.
"""

from __future__ import annotations

import re
from typing import Any

MIN_MEMORY_MIB, MAX_MEMORY_MIB = 16, 16 * 1024 * 1024  # 16 MiB .. 16 TiB per worker
_MEM_RE = re.compile(r"^\s*(\d{1,12})\s*([KMGT]i?)?B?\s*$", re.IGNORECASE)
_MEM_UNITS = {"k": 1 / 1024, "m": 1, "g": 1024, "t": 1024 * 1024}
_TIME_HMS = re.compile(r"^(?:(\d{1,3})-)?(\d{1,3}):(\d{2}):(\d{2})$")
_TIME_UNITS = re.compile(r"^(\d{1,7})\s*([smhd])$")


def parse_memory_mib(value: Any) -> int:
    """``"64Gi"``, ``"64G"``, ``"512Mi"`` or an integer number of MiB. Slurm's units are binary."""
    if isinstance(value, bool):
        raise ValueError("must be a size such as '64Gi' or an integer number of MiB")
    if isinstance(value, int):
        mib = value
    elif isinstance(value, str):
        m = _MEM_RE.fullmatch(value)
        if not m:
            raise ValueError("must be a size such as '64Gi', '512Mi' or an integer number of MiB")
        number, unit = int(m.group(1)), (m.group(2) or "M")[0].lower()
        mib_f = number * _MEM_UNITS[unit]
        if mib_f != int(mib_f):
            raise ValueError("must be a whole number of MiB")
        mib = int(mib_f)
    else:
        raise ValueError("must be a size such as '64Gi' or an integer number of MiB")
    if not MIN_MEMORY_MIB <= mib <= MAX_MEMORY_MIB:
        raise ValueError(f"must be between {MIN_MEMORY_MIB}Mi and 16Ti per worker")
    return mib


def normalise_gpu_type(value: str | None) -> str | None:
    """GPU types are compared in lower case: ``NVIDIA-H100-80GB-HBM3`` is ``nvidia-h100-80gb-hbm3``."""
    return value.lower() if value else value


def format_memory(mib: int) -> str:
    for unit, size in (("Ti", 1024 * 1024), ("Gi", 1024)):
        if mib % size == 0:
            return f"{mib // size}{unit}"
    return f"{mib}Mi"


def parse_duration_s(value: Any) -> int:
    """Seconds, ``"90m"``, ``"2h"``, ``"1d"``, ``"HH:MM:SS"`` or Slurm's ``"D-HH:MM:SS"``."""
    if isinstance(value, bool):
        raise ValueError("must be seconds or a duration such as '2h' or '1-00:00:00'")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        v = value.strip()
        if v.isdigit():
            return int(v)
        m = _TIME_UNITS.fullmatch(v)
        if m:
            return int(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
        m = _TIME_HMS.fullmatch(v)
        if m:
            days, h, mi, s = (int(x) if x else 0 for x in m.groups())
            if mi >= 60 or s >= 60:
                raise ValueError("minutes and seconds must be below 60")
            return days * 86400 + h * 3600 + mi * 60 + s
    raise ValueError("must be seconds or a duration such as '2h', '90m' or '1-00:00:00'")


def format_duration(seconds: int) -> str:
    days, rest = divmod(seconds, 86400)
    h, rest = divmod(rest, 3600)
    m, s = divmod(rest, 60)
    return (f"{days}-" if days else "") + f"{h:02d}:{m:02d}:{s:02d}"
