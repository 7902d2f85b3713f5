"""Which POSIX users a job may never run as (issue #12, finding 6).

A job runs as the caller's POSIX user (``Principal.username``). An IdP that hands out
``preferred_username: root``, or a service principal mapped to ``slurm``, must not turn
the gateway into a way to run code as a system account. A user is refused when

* it is in the deny-list (``ISTHMUS_DENIED_JOB_USERS``), or
* it is the gateway's own user (the CLI transport would otherwise run sbatch as it), or
* the gateway resolves it (``getpwnam``: the same NSS the cluster uses, as a rule) and
  its uid is below ``ISTHMUS_MIN_JOB_UID``.

A name the gateway cannot resolve is let through: the cluster decides then (it refuses
unknown users). The reason is a sentence for the 403, never more than the name and uid.

Lookups are cached for ``LOOKUP_TTL_S`` (60 s): ``getpwnam`` goes through NSS (files,
sssd, LDAP) and ran on every submission; a uid changed in the directory is seen within a
minute.
"""

from __future__ import annotations

import os
import pwd
import threading
import time

LOOKUP_TTL_S = 60.0
_MAX_CACHED = 4096
_cache: dict[str, tuple[float, int | None]] = {}
_own: tuple[float, int, str] | None = None
_lock = threading.Lock()


def own_user() -> str:
    """The POSIX user the gateway process runs as (cached for LOOKUP_TTL_S)."""
    global _own
    now, euid = time.monotonic(), os.geteuid()
    own = _own
    if own is not None and own[0] > now and own[1] == euid:
        return own[2]
    try:
        name = pwd.getpwuid(euid).pw_name
    except KeyError:  # a uid without a passwd entry (containers): match by number only
        name = str(euid)
    _own = (now + LOOKUP_TTL_S, euid, name)
    return name


def _uid_of(username: str) -> int | None:
    """``getpwnam(username).pw_uid``, None when unknown; cached for LOOKUP_TTL_S."""
    now = time.monotonic()
    hit = _cache.get(username)
    if hit is not None and hit[0] > now:
        return hit[1]
    try:
        uid: int | None = pwd.getpwnam(username).pw_uid
    except KeyError:
        uid = None
    with _lock:
        if len(_cache) >= _MAX_CACHED:
            _cache.clear()
        _cache[username] = (now + LOOKUP_TTL_S, uid)
    return uid


def needs_lookup(username: str) -> bool:
    """Would ``refusal(username, ...)`` ask NSS (nothing cached, or the cache is stale)?
    Async callers then run ``look_up`` in the thread pool first: NSS may block (LDAP)."""
    now = time.monotonic()
    own, hit = _own, _cache.get(username)
    return own is None or own[0] <= now or own[1] != os.geteuid() or hit is None or hit[0] <= now


def look_up(username: str) -> None:
    """Fill the caches ``refusal`` reads (blocking: NSS)."""
    own_user()
    _uid_of(username)


def parse_user_list(value: str) -> frozenset[str]:
    return frozenset(u.strip() for u in value.split(",") if u.strip())


def refusal(username: str, *, min_uid: int, denied: frozenset[str]) -> str | None:
    """Why jobs may not run as ``username``, or None when they may."""
    if username in denied:
        return f"POSIX user {username!r} is a system account (ISTHMUS_DENIED_JOB_USERS); jobs never run as it"
    if username == own_user():
        return f"POSIX user {username!r} is the gateway's own user; jobs never run as it"
    uid = _uid_of(username)
    if uid is None:
        return None
    if uid < min_uid:
        return (f"POSIX user {username!r} has uid {uid}, below this gateway's minimum of {min_uid} "
                f"(ISTHMUS_MIN_JOB_UID); system accounts never run jobs")
    return None
