"""Decayed usage broken down per pool, for the fair-share table (like ``sshare``).

Fair share is ONE factor per account over every pool (docs/ledger.md): the decayed usage
behind it is one number per account (``fairshare_usage``), kept exact at every charge. The
breakdown apportions that exact number over pools by the account's daily usage buckets,
each decayed from the end of its day:

    raw_usage[pool] = raw_usage * decayed(buckets of pool) / decayed(buckets of all pools)

so the parts always add up to the ``RawUsage`` the factor uses. Within a day the apportioning
cannot tell an early charge from a late one (day resolution: at a 7-day half-life a part may
be off by at most 5 % of itself, never the total). Buckets older than 20 half-lives weigh
less than 1e-6 and are not read.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from gateway.domain.tree import walk_up
from gateway.models.ledger import UsageBucket

_HORIZON_HALF_LIVES = 20


def own_pool_weights(session: Session, *, now: datetime, half_life_s: float) -> dict[str, dict[str, float]]:
    """account -> pool -> decayed job usage (GPU-seconds) of the account's own jobs, from buckets."""
    since = (now - timedelta(seconds=half_life_s * _HORIZON_HALF_LIVES)).date()
    out: dict[str, dict[str, float]] = {}
    rows = session.execute(
        select(UsageBucket.account_name, UsageBucket.pool, UsageBucket.day, func.sum(UsageBucket.usage_gpu_seconds))
        .where(UsageBucket.day >= since, UsageBucket.usage_gpu_seconds != 0)
        .group_by(UsageBucket.account_name, UsageBucket.pool, UsageBucket.day))
    for account, pool, day, usage in rows:
        if not pool:  # admin adjustments carry no job usage; they never count in fair share
            continue
        day_end = datetime(day.year, day.month, day.day, tzinfo=now.tzinfo) + timedelta(days=1)
        age = max(0.0, (now - min(day_end, now)).total_seconds())
        per = out.setdefault(account, {})
        per[pool] = per.get(pool, 0.0) + float(usage or 0) * 2.0 ** (-age / half_life_s)
    return out


def raw_usage_by_pool(tree: dict[str, str | None], own_usage: dict[str, float],
                      weights: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """account -> pool -> decayed GPU-seconds of the account's SUBTREE (pure function).

    ``tree`` maps each account to its parent; ``own_usage`` is each account's exact decayed
    usage of its own jobs (what the factor uses); ``weights`` comes from
    :func:`own_pool_weights`. An account whose usage has no bucket left in the horizon
    (all of it decayed to nothing) gets no parts.
    """
    own: dict[str, dict[str, float]] = {}
    for name, used in own_usage.items():
        w = weights.get(name) or {}
        total = sum(w.values())
        if used > 0 and total > 0:
            own[name] = {pool: used * v / total for pool, v in w.items()}
    out: dict[str, dict[str, float]] = {name: {} for name in tree}
    for name, parts in own.items():
        for node in walk_up(tree, name, partial=True) or ():  # the account and its ancestors
            acc = out[node]
            for pool, v in parts.items():
                acc[pool] = acc.get(pool, 0.0) + v
    return out
