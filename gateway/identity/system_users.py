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
"""

from __future__ import annotations

import os
import pwd


def own_user() -> str:
    """The POSIX user the gateway process runs as."""
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:  # a uid without a passwd entry (containers): match by number only
        return str(os.geteuid())


def parse_user_list(value: str) -> frozenset[str]:
    return frozenset(u.strip() for u in value.split(",") if u.strip())


def refusal(username: str, *, min_uid: int, denied: frozenset[str]) -> str | None:
    """Why jobs may not run as ``username``, or None when they may."""
    if username in denied:
        return f"POSIX user {username!r} is a system account (ISTHMUS_DENIED_JOB_USERS); jobs never run as it"
    if username == own_user():
        return f"POSIX user {username!r} is the gateway's own user; jobs never run as it"
    try:
        uid = pwd.getpwnam(username).pw_uid
    except KeyError:
        return None
    if uid < min_uid:
        return (f"POSIX user {username!r} has uid {uid}, below this gateway's minimum of {min_uid} "
                f"(ISTHMUS_MIN_JOB_UID); system accounts never run jobs")
    return None
