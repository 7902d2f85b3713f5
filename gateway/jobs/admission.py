"""Admission at submit: the checks every entry point runs before a job or a job set is recorded.

Single jobs (:func:`record_jobs`) and job sets (gateway/flows/service.py ``record_set``) take one path, in one
order: :func:`refuse_early`, then their service checks membership, the time limit and the
caps (gateway/jobs/caps.py: the same read and the same rule, a set counting all its tasks),
and then :func:`budget_hold` on the account chain the cap check read gives the budget verdict
and refuses a job no concurrent-GPU limit lets run. One place, so the two paths cannot
drift: a set whose tasks exceed the account's ``max_gpus`` was once accepted while the same
single job got a 422 (issue #28), and a set was once judged on its budget before its caps
(issue #46).

What admission reads besides the request is one typed :class:`Admission`, built once per
process where the app is built (gateway/app.py) and handed to every entry point: never the
app's state object (issue #47, item 1).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any

from gateway.identity import system_users
from gateway.jobs import caps as job_caps
from gateway.jobs import intake
from gateway.jobs.schemas import JobSpec
from gateway.kit.errors import Forbidden, Invalid
from gateway.kit.settings import Settings


def _no_views() -> Mapping[str, Any]:
    return {}


@dataclasses.dataclass(frozen=True)
class Admission:
    """What admission at submit reads besides the request, built once per process.

    ``settings``: the caps, time limits, system-user rules; ``storage``: the storage catalog
    (gateway/domain/storage.py ``Catalog``); ``backends``: the pools' adapters by name (empty:
    no pool configured, jobs wait for one); ``latest_views``: this process's capacity
    snapshot, as it is (``Capacity.latest_views``; none without a dispatcher): per process,
    a cache of what the pools said, never a decision of another replica's.
    """

    settings: Settings
    storage: Any = None
    backends: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    latest_views: Callable[[], Mapping[str, Any]] = _no_views

    @property
    def catalog(self):
        from gateway.domain.storage import NO_STORAGE

        return self.storage or NO_STORAGE


def refuse_early(session, context: Admission, principal, spec: JobSpec) -> None:
    """403/422 before anything is recorded: a system user, an unknown pool, storage the job may
    not have (or not where it asks), a pool it never fits."""
    refuse_system_user(principal, context.settings)
    refuse_unknown_pool(session, spec)
    refuse_bad_storage(session, context, principal, spec)
    refuse_if_never_fits(session, context, spec)


async def look_up_user(principal) -> None:
    """For an async route, before its transaction: the NSS look-up ``refuse_system_user`` needs,
    in the thread pool and only when it is not cached (once a minute per user)."""
    if principal.username and system_users.needs_lookup(principal.username):
        from starlette.concurrency import run_in_threadpool

        await run_in_threadpool(system_users.look_up, principal.username)


def refuse_bad_storage(session, context: Admission, principal, spec: JobSpec) -> None:
    """422 naming ``body.mounts[i]`` or ``body.checkpoint``: a storage that does not exist, that
    the account may not use, a writable mount of a read-only storage, overlapping mounts, a
    pinned pool without the storage (docs/storage.md). Only for a member of the account:
    anyone else is refused (403) by the service before learning anything of its storage."""
    if not (spec.mounts or spec.checkpoint) or not principal.may_use(spec.account):
        return
    from gateway.domain.storage import MountError, check_spec, pinned_refusal

    catalog = context.catalog
    data = spec.model_dump(mode="json", include={"mounts", "checkpoint"})
    chain: list[str] = []
    if any(s.accounts is not None for s in catalog.storages.values()):
        from gateway.accounts.service import chains

        chain = chains(session, [spec.account]).get(spec.account, [])
    try:
        check_spec(data, catalog, spec.account, chain)
    except MountError as exc:
        raise Invalid(exc.field, exc.message) from None
    if spec.pool != "auto":
        from adapters.base import Feature, features_of

        backend = context.backends.get(spec.pool)
        remount = features_of(backend).why_not(Feature.MOUNT_PATHS) if backend is not None else ""
        refusal = pinned_refusal(data, catalog, spec.pool, remount)
        if refusal:
            raise Invalid(*refusal)


def checkpoint_lineage(session, principal, spec: JobSpec) -> str | None:
    """The lineage a job resuming ``spec.resume_from`` continues (None: a new one, its own).

    422 naming ``body.resume_from`` unless the earlier job is one of the same account the
    caller may see, and kept its checkpoints in the same storage."""
    if not spec.resume_from:
        return None
    from gateway.jobs.repository import get_readable
    from gateway.models.specs import field_of

    earlier = get_readable(session, principal, spec.resume_from)
    if earlier is None or earlier.account_name != spec.account:
        raise Invalid("body.resume_from", f"no job {spec.resume_from} of account {spec.account!r} to resume from")
    kept = field_of(earlier, "checkpoint", session)
    if not kept:
        raise Invalid("body.resume_from", f"job {spec.resume_from} kept no checkpoints (it had no checkpoint)")
    if kept.get("storage") != spec.checkpoint.storage:
        raise Invalid("body.resume_from", f"job {spec.resume_from} kept its checkpoints in storage "
                                          f"{kept.get('storage')!r}, not {spec.checkpoint.storage!r}")
    return earlier.checkpoint_lineage


def record_jobs(session, context: Admission, submissions: list[intake.Submission]) -> list:
    """``POST /v1/jobs``: admit and record ``submissions`` in one transaction (a group
    commit's batch, gateway/kit/groupcommit.py; one request is a batch of one), judged in
    order as if each were alone. One result each: ``(job, created)`` or its refusal."""
    settings = context.settings

    def prepare(session, sub: intake.Submission) -> None:
        refuse_early(session, context, sub.principal, sub.spec)
        sub.lineage = checkpoint_lineage(session, sub.principal, sub.spec)
        sub.hold = budget_hold(session, sub.spec, settings)

    return intake.create_many(session, submissions, default_time_limit_s=settings.default_time_limit_s,
                               max_time_limit_s=settings.max_time_limit_s, caps=caps(settings),
                               waiting_reason=waiting_reason(context), prepare=prepare)


def caps(settings) -> job_caps.SubmitCaps:
    return job_caps.SubmitCaps(pending_per_user=settings.max_pending_jobs_per_user,
                              pending_per_account=settings.max_pending_jobs_per_account,
                              keys_per_user=settings.max_idempotency_keys_per_user,
                              key_window_s=settings.idempotency_key_window_s)


@functools.lru_cache(maxsize=8)
def _denied_users(value: str) -> frozenset[str]:
    return system_users.parse_user_list(value)


def refuse_system_user(principal, settings) -> None:
    """403 before anything is recorded when the caller's POSIX user is a system account."""
    if not principal.username:
        return  # refused by intake.create_many with its own reason
    reason = system_users.refusal(principal.username, min_uid=settings.min_job_uid,
                                  denied=_denied_users(settings.denied_job_users))
    if reason:
        raise Forbidden(reason)


def refuse_unknown_pool(session, spec: JobSpec) -> None:
    """A job naming a pool the gateway does not know (or no longer has) is refused, naming the field."""
    if spec.pool == "auto":
        return
    from gateway.pools.service import require_known

    require_known(session, spec.pool, "body.pool" if "pool" in spec.model_fields_set else "body.backend",
                  or_auto=True)


def refuse_if_never_fits(session, context: Admission, spec: JobSpec) -> None:
    """A job that can never fit the pool it names (or, with ``auto``, any pool) is refused now,
    not left pending forever.

    Judged on this process's dispatcher's latest capacity snapshot when it has one; else
    (``isthmus serve`` beside ``isthmus worker``, or before the first round) on the limits a
    dispatcher last stored for each pool (gateway/pools/service.py ``stored_views``, trusted
    for ``LIMITS_FRESH_S``). A pool with no known limits refuses nothing: with ``auto`` the
    job is then accepted, and the dispatcher fails it with the same reason once it knows.
    """
    from gateway.domain.routing import JobShape, check_pinned

    if not context.backends:
        return  # no pool configured: the job waits for one (waiting_reason)
    views = context.latest_views()
    if not views:
        from gateway.kit.timeutil import utcnow
        from gateway.pools.service import stored_views

        # Read once per transaction: a batch of submissions (group commit) shares it.
        stored = session.info.get("isthmus.stored_views")
        if stored is None:
            stored = session.info["isthmus.stored_views"] = stored_views(session, now=utcnow(),
                                                                         storage=context.catalog)
        views, configured = stored
        if not views or (spec.pool == "auto" and set(views) != configured) or \
                (spec.pool != "auto" and spec.pool not in views):
            return
    shape = JobShape.of_spec(workers=spec.workers, gpus_per_worker=spec.gpus_per_worker,
                             total_gpus=spec.total_gpus, spec=spec.model_dump(mode="json"))
    reason = check_pinned(shape, spec.pool, views)
    if reason:
        field = "body" if spec.pool == "auto" else ("body.pool" if "pool" in spec.model_fields_set else "body.backend")
        raise Invalid(field, f"this job can never run: {reason}")


def refuse_if_never_admissible(session, spec: JobSpec) -> None:
    """A job larger than its account's concurrent-GPU limit on every pool it may use is refused
    now (:func:`gateway.domain.quota.never_admissible`, docs/dispatch.md, "Reservations and
    backfill"): it could never be admitted and would wait forever. The pools it may use: the
    one it names, else every routable pool (of its ``pool_kind``).
    """
    from sqlalchemy import select

    from gateway.accounts import service as accounts
    from gateway.domain import quota
    from gateway.kit.errors import NotFound
    from gateway.ledger.rules import quota_of, routable_pools
    from gateway.models.accounts import AccountPoolQuota, AccountQuota
    from gateway.models.pools import Pool

    try:
        names = [a.name for a in accounts.chain(session, spec.account)]
    except NotFound:
        return  # an unknown account: create() names the field
    quotas = {q.account_name: quota_of(q) for q in
              session.scalars(select(AccountQuota).where(AccountQuota.account_name.in_(names)))}
    per_pool = {(q.account_name, q.pool): q.max_gpus for q in session.scalars(
        select(AccountPoolQuota).where(AccountPoolQuota.account_name.in_(names), AccountPoolQuota.max_gpus.is_not(None)))}
    view = quota.ChainView(parent={}, quotas=quotas, pool_limits=per_pool)
    if not per_pool and all(q.max_gpus is None for q in quotas.values()):
        return  # the common case: no concurrent-GPU limit set anywhere on the chain
    if spec.pool != "auto":
        pools = [spec.pool]
    else:
        pools = routable_pools(session)
        if spec.pool_kind is not None:
            kinds = dict(session.execute(select(Pool.name, Pool.kind).where(Pool.name.in_(pools))).all())
            pools = [p for p in pools if kinds.get(p) == spec.pool_kind]
    why = quota.never_admissible(view, names, account=spec.account, total_gpus=spec.total_gpus, pools=pools)
    if why is not None:
        raise Invalid("body.workers", why)


def budget_hold(session, spec: JobSpec, settings):
    """Refuse a job no concurrent-GPU limit lets run, or one bigger than a whole budget period;
    the reason it is held when this period's budget is short. Works on the account chain the
    cap check read (budgets and whether GPU limits are set ride along), so the common case
    costs no read of its own. Single jobs and every task of a set (one verdict for all: they
    share a shape) are judged by it, after the caps."""
    from gateway.ledger import rules as ledger_rules

    def hold(chain) -> str | None:  # called by create() after it checked the caller and the time limit
        if any(row.max_gpus is not None or row.has_pool_limits for row in chain):
            refuse_if_never_admissible(session, spec)  # reads only when a GPU limit is set
        time_limit_s = intake.time_limit_of(spec.time_limit, default_s=settings.default_time_limit_s,
                                             max_s=settings.max_time_limit_s)
        return held_reason(ledger_rules.budget_verdict_of(session, chain, total_gpus=spec.total_gpus,
                                                     time_limit_s=time_limit_s, gpu_type=spec.gpu_type))

    return hold


def held_reason(verdict) -> str | None:
    """A budget verdict as create() wants it: None, the reason a job is held, or 422 for never."""
    if verdict is None:
        return None
    if verdict[0] == "never":
        raise Invalid("body.time_limit", f"this job can never run: {verdict[1]}")
    return verdict[1]


def waiting_reason(context: Admission) -> str:
    """What a newly recorded job waits for: a pool to be configured, or the dispatcher."""
    if not context.backends:
        from gateway.pools.service import NO_POOL

        return NO_POOL
    return "waiting for dispatch"
