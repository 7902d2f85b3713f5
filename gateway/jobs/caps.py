"""The caps checked at submit: how many jobs may wait per user, per account and per subtree,
and how many new Idempotency-Keys a caller may use (issue #12 finding 10, #15, #27, #32).

One read per account chain (:func:`read_caps`), one rule (:func:`admit`) that every entry
point judges by (single jobs, batches, job sets), and the locks that keep the counts exact
under concurrency (:func:`lock_caps`). Split out of gateway/jobs/service.py (issue #46).
"""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

from sqlalchemy import String, bindparam, func, literal, select, union
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Session

from gateway.accounts.tree import subtree_names, up_cte, up_many_cte
from gateway.domain import quota
from gateway.domain.quota import CapRead, CapTally
from gateway.domain.states import JobState
from gateway.kit.errors import LimitExceeded
from gateway.kit.timeutil import utcnow
from gateway.models.accounts import AccountPoolQuota, AccountQuota
from gateway.models.jobs import IdempotencyKey, WaitingCount


@dataclasses.dataclass(frozen=True)
class SubmitCaps:
    """Site defaults of the caps checked at submit (settings ``max_pending_*``, ``max_idempotency_*``)."""

    pending_per_user: int
    pending_per_account: int
    keys_per_user: int
    key_window_s: int = 86400


# A job counts against the pending caps until its gang starts (a blocked one too: it is a row
# waiting to run, and an array's tasks count one each).
WAITING_STATES = tuple(s.value for s in (JobState.BLOCKED, JobState.PENDING, JobState.DISPATCHING, JobState.QUEUED, JobState.REQUEUED))

_KEY_C = IdempotencyKey.__table__.c
_WC = WaitingCount.__table__.c


def _waiting(*where):
    """How many jobs wait to start, summed from the counters the triggers keep (migration
    0014waiting): a few rows per account and user, whatever the history or the queue."""
    return select(func.coalesce(func.sum(_WC.n), 0)).where(*where).scalar_subquery()


def _count_upto(table, limit, *where):
    """COUNT of at most ``limit`` rows: the cost is bounded by the cap, never a table scan."""
    return select(func.count()).select_from(select(literal(1)).select_from(table).where(*where)
                                            .limit(limit).subquery()).scalar_subquery()


# One read in the common case: the account's chain (leaf first) with the admin-set caps,
# plus the counts the site defaults need (Postgres runs each uncorrelated count once).
_CAP_UP = up_cte("cap_chain")
_CAP_READ = (
    select(_CAP_UP.c.name, AccountQuota.max_queued_jobs, AccountQuota.max_queued_jobs_per_user,
           # The GPU-hour budgets ride along: the submit path's budget verdict needs no read
           # of its own (gateway.ledger.service.budget_verdict_of).
           AccountQuota.budget_gpu_seconds, AccountQuota.budget_period, AccountQuota.budget_window_days,
           # So do the concurrent-GPU limits' presence (the never-admissible check at submit
           # reads them only when one is set: jobs.admission.refuse_if_never_admissible).
           AccountQuota.max_gpus,
           select(literal(1)).where(AccountPoolQuota.account_name == _CAP_UP.c.name,
                                    AccountPoolQuota.max_gpus.is_not(None)).exists().label("has_pool_limits"),
           _waiting(_WC.username == bindparam("username")).label("n_user"),
           _waiting(_WC.account_name == bindparam("leaf")).label("n_account"),
           _count_upto(IdempotencyKey.__table__, bindparam("cap_keys"), _KEY_C.subject == bindparam("subject"),
                       _KEY_C.created_at > bindparam("keys_since")).label("n_keys"))
    .select_from(_CAP_UP.outerjoin(AccountQuota, AccountQuota.account_name == _CAP_UP.c.name))
    .order_by(_CAP_UP.c.depth)
)

# Postgres: the cap check's serialisation (issue #27 finding 3). Transaction-scoped advisory
# locks, held until the submissions commit, so a later transaction counts only after the
# earlier one's jobs are visible: the users' (the per-user caps span every account), then
# the roots of the accounts' trees (every account cap, on the account or an ancestor,
# counts inside that tree). One statement takes every lock a transaction needs (a batch of
# submissions: several users and trees) in one global order, users before trees and each
# kind by key, so two transactions never wait for each other both ways; nothing else takes
# these locks. The order is fixed by the sorted sub-select the locks are taken over, not by
# the order a select list happens to be evaluated in. Keys are a stable hash of namespaced
# names; a collision only serialises two unrelated submissions.
_LOCK_UP = up_many_cte("cap_lock_chain", bindparam("leaves", expanding=True))
_LOCK_USERS = func.unnest(bindparam("users", type_=ARRAY(String))).table_valued("u").render_derived(name="lock_users")
_LOCK_KEYS = union(
    select(literal(0).label("kind"), func.hashtextextended(
        literal("isthmus.caps.user:", String) + _LOCK_USERS.c.u, 0).label("k")).select_from(_LOCK_USERS),
    select(literal(1), func.hashtextextended(literal("isthmus.caps.account:", String) + _LOCK_UP.c.name, 0))
    .where(_LOCK_UP.c.parent.is_(None)),
).subquery("lock_keys")
_LOCK_ORDER = select(_LOCK_KEYS.c.k).order_by(_LOCK_KEYS.c.kind, _LOCK_KEYS.c.k).offset(0).subquery("lock_order")
_CAP_LOCK = select(func.pg_advisory_xact_lock(_LOCK_ORDER.c.k))


def lock_caps(session: Session, pairs) -> None:
    """Postgres: take the cap locks of every ``(account, username)`` about to be counted, held
    to the end of the transaction (one statement, see ``_CAP_LOCK``). SQLite serialises
    writers itself."""
    if session.get_bind().dialect.name != "postgresql":
        return
    pairs = list(pairs)
    session.connection().execute(_CAP_LOCK, {"leaves": sorted({a for a, _ in pairs}),
                                             "users": sorted({u for _, u in pairs})})


def read_caps(session: Session, *, account: str, username: str, subject: str, caps: SubmitCaps,
              with_key: bool, now=None) -> CapRead | None:
    """The caps on ``account``'s chain and the counts they limit; None for an unknown account.

    One round trip unless an admin set a cap on the account or an ancestor (then two).
    The pending counts are read from ``waiting_count``, which triggers keep in each writer's
    transaction (issue #32): a few rows per account and user, so the cost does not grow
    with the jobs that wait or with history. The idempotency-key count is an index range
    scan stopped at its cap. Counts are only exact under the locks of :func:`lock_caps`.
    """
    now = now or utcnow()
    # Without a key, "since" is in the future: the key count is an empty index probe.
    since = now - timedelta(seconds=caps.key_window_s) if with_key else now + timedelta(days=1)
    chain = session.connection().execute(_CAP_READ, {"leaf": account, "username": username, "subject": subject,
                                        "cap_user": caps.pending_per_user, "cap_account": caps.pending_per_account,
                                        "cap_keys": caps.keys_per_user, "keys_since": since}).all()
    if not chain:
        return None  # unknown account
    first = chain[0]
    user, own = ("user", username), ("account", account)
    counts = {user: first.n_user, own: first.n_account}
    checks: list[tuple[tuple, int, str, bool]] = [
        (user, caps.pending_per_user, (f"user {username} has {{n}} of {caps.pending_per_user} pending jobs allowed "
                                       f"per user (ISTHMUS_MAX_PENDING_JOBS_PER_USER)"), True)]
    if all(row.max_queued_jobs is None for row in chain):
        checks.append((own, caps.pending_per_account, (f"{account}: {{n}} of {caps.pending_per_account} pending jobs "
                                                       f"allowed per account (ISTHMUS_MAX_PENDING_JOBS_PER_ACCOUNT)"),
                       True))
    subtree: list[tuple[Any, tuple, int, str]] = []
    for i, row in enumerate(chain):
        if row.max_queued_jobs is None and row.max_queued_jobs_per_user is None:
            continue  # no admin-set cap here: no subtree to build (the common case)
        in_subtree = _WC.account_name.in_(subtree_names(row.name, name=f"cap_sub_{i}"))  # caps the subtree
        if row.max_queued_jobs is not None:
            subtree.append((_waiting(in_subtree), ("tree", row.name), row.max_queued_jobs,
                            (f"{row.name}: {{n}} of {row.max_queued_jobs} pending jobs (max_queued_jobs of "
                             f"{row.name})")))
        if row.max_queued_jobs_per_user is not None:
            subtree.append((_waiting(in_subtree, _WC.username == username), ("tree_user", row.name, username),
                            row.max_queued_jobs_per_user,
                            (f"{row.name}: user {username} has {{n}} of {row.max_queued_jobs_per_user} pending jobs "
                             f"(max_queued_jobs_per_user of {row.name})")))
    if subtree:
        for n, (_, counter, limit, message) in zip(session.execute(select(*[q for q, *_ in subtree])).one(), subtree, strict=True):
            counts[counter] = n
            checks.append((counter, limit, message, True))
    key_counter = None
    if with_key:
        key_counter = ("keys", subject)
        counts[key_counter] = first.n_keys
        checks.append((key_counter, caps.keys_per_user,
                       (f"{{n}} of {caps.keys_per_user} new idempotency keys allowed per caller in "
                        f"{caps.key_window_s} s (ISTHMUS_MAX_IDEMPOTENCY_KEYS_PER_USER); replays of existing keys "
                        f"still work"), False))
    touches = (user, own, *(c for row in chain for c in (("tree", row.name), ("tree_user", row.name, username))))
    return CapRead(chain=chain, counts=counts, checks=checks, touches=touches, key_counter=key_counter)


def admit(read: CapRead, tally: CapTally, *, adding: int = 1) -> None:
    """THE cap rule (:func:`gateway.domain.quota.cap_refusal`, then :func:`~gateway.domain.quota.count`):
    refuse ``adding`` more jobs (and, when read with a key, one new key) that would pass a
    cap, counting what was read plus what ``tally`` says this transaction admitted since;
    else add them to ``tally``. Every entry point judges through here.

    Raises:
        LimitExceeded: 429 whose detail names the limit; ``tally`` is unchanged.
    """
    why = quota.cap_refusal(read, tally, adding=adding)
    if why is not None:
        raise LimitExceeded(why)
    quota.count(read, tally, adding=adding)
