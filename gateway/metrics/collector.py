"""Prometheus metrics, computed from the job registry and the ledger at scrape time.

Why from the registry and not from counters in each process: Isthmus runs as several
uvicorn workers plus separate ``isthmus worker`` processes, possibly on several hosts. The
database is the one place that sees every submission, state change and charge, so a
scrape of ANY gateway process returns the same, complete numbers, with no shared
multiprocess directory and nothing lost when a process restarts. The price is a few
aggregate queries per scrape; they are cached for ``ttl_s`` (default 5 s) so several
scrapers or a fast scrape interval cost no more.

Cardinality is bounded by design: labels are state, pool and account (admin-created),
never a user or a job.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from datetime import datetime

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.registry import Collector
from sqlalchemy import and_, case, func, select
from sqlalchemy.orm import Session, sessionmaker

from gateway.domain.states import JobState
from gateway.kit.db import transaction
from gateway.kit.timeutil import utcnow
from gateway.ledger.decayed import Ledger
from gateway.models.jobs import Job
from gateway.models.ledger import LedgerEntry, Reservation, UsageBucket
from gateway.pools import nodehealth

FINAL = {JobState.SUCCEEDED.value, JobState.FAILED.value, JobState.CANCELLED.value}
# Queue wait (submitted -> every worker running), seconds.
WAIT_BUCKETS = (1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0, 4 * 3600.0, 12 * 3600.0, 86400.0)
NONE = "none"  # the pool label of a job not routed yet


def _reason_class(reason: str) -> str:
    """Why a pending job waits, in a few fixed words (bounded label values)."""
    r = (reason or "").lower()
    if r.startswith("quota") and "budget" in r:
        return "budget"
    if r.startswith("quota"):
        return "quota"
    if r.startswith("waiting for capacity"):
        return "capacity"
    if "unavailable" in r:
        return "backend_unavailable"
    return "dispatch"


class RegistryCollector(Collector):
    """Yields every Isthmus metric family from one consistent read of the database."""

    def __init__(self, sessions: sessionmaker[Session], *, pools: Callable[[], dict] | None = None,
                 ledger: Ledger, ttl_s: float = 5.0, clock: Callable[[], datetime] = utcnow):
        self.sessions = sessions
        self.ledger = ledger  # at the fair-share half-life of the settings the app was built with
        self.pools = pools  # () -> {name: PoolView-like}, the capacity the dispatcher sees
        self.ttl_s = ttl_s
        self.clock = clock
        self._cache: tuple[float, list] | None = None
        self._lock = threading.Lock()

    def describe(self) -> Iterable:
        return []  # families are only known at collect time (unchecked collector)

    def collect(self) -> Iterable:
        with self._lock:
            if self._cache is None or time.monotonic() - self._cache[0] > self.ttl_s:
                self._cache = (time.monotonic(), self._read())
            return list(self._cache[1])

    # ------------------------------------------------------------------ reads

    def _read(self) -> list:
        now = self.clock()
        fams: list = []
        with transaction(self.sessions) as s:
            fams += self._jobs(s)
            fams.append(self._queue_wait(s))
            fams += self._ledger(s, now)
            fams += self._nodes(s, now)
        fams += self._capacity()
        return fams

    def _jobs(self, s: Session) -> list:
        active = GaugeMetricFamily("isthmus_jobs", "Jobs not yet finished, by state, pool and account.",
                                   labels=["state", "pool", "account"])
        finished = CounterMetricFamily("isthmus_jobs_finished", "Jobs that reached a final state.",
                                       labels=["state", "pool", "account"])
        submitted = CounterMetricFamily("isthmus_job_submissions", "Jobs accepted by the gateway.",
                                        labels=["account"])
        pending = GaugeMetricFamily("isthmus_pending_jobs",
                                    "Pending jobs by why they wait (quota, budget, capacity, ...).",
                                    labels=["account", "reason"])
        totals: dict[str, int] = {}
        for state, pool, account, n in s.execute(
                select(Job.state, Job.pool, Job.account_name, func.count())
                .group_by(Job.state, Job.pool, Job.account_name)):
            labels = [state, pool or NONE, account]
            (finished if state in FINAL else active).add_metric(labels, n)
            totals[account] = totals.get(account, 0) + n
        for account, n in sorted(totals.items()):
            submitted.add_metric([account], n)
        waiting: dict[tuple[str, str], int] = {}
        for account, reason, n in s.execute(
                select(Job.account_name, Job.state_reason, func.count())
                .where(Job.state == JobState.PENDING.value).group_by(Job.account_name, Job.state_reason)):
            key = (account, _reason_class(reason))
            waiting[key] = waiting.get(key, 0) + n
        for (account, why), n in sorted(waiting.items()):
            pending.add_metric([account, why], n)
        return [active, finished, submitted, pending]

    def _queue_wait(self, s: Session) -> HistogramMetricFamily:
        fam = HistogramMetricFamily("isthmus_job_queue_wait_seconds",
                                    "From submission to the whole gang running, per pool.", labels=["pool"])
        started = Job.started_at.is_not(None)
        # Seconds between two timestamps, on SQLite and Postgres alike.
        if s.get_bind().dialect.name == "sqlite":
            wait = (func.julianday(Job.started_at) - func.julianday(Job.created_at)) * 86400.0
        else:
            wait = func.extract("epoch", Job.started_at - Job.created_at)
        cols = [func.sum(case((wait <= b, 1), else_=0)) for b in WAIT_BUCKETS]
        rows = s.execute(select(Job.pool, func.count(), func.coalesce(func.sum(wait), 0.0), *cols)
                         .where(and_(started, Job.pool.is_not(None))).group_by(Job.pool)).all()
        for pool, count, total, *le in rows:
            buckets = [(str(b), int(n or 0)) for b, n in zip(WAIT_BUCKETS, le, strict=True)] + [("+Inf", int(count))]
            fam.add_metric([pool], buckets, float(total or 0.0))
        return fam

    def _ledger(self, s: Session, now: datetime) -> list:
        factor = GaugeMetricFamily("isthmus_account_fairshare_factor",
                                   "Fair-share factor (1 = no recent usage, towards 0 = over its share).",
                                   labels=["account"])
        for name, fs in sorted(self.ledger.fairshare(s, now=now).items()):
            factor.add_metric([name], fs.factor)
        in_use = GaugeMetricFamily("isthmus_account_gpus_reserved",
                                   "GPUs held by an account's gangs (reserved or running), per pool.",
                                   labels=["account", "pool", "status"])
        for account, pool, status, gpus in s.execute(
                select(Reservation.account_name, Reservation.pool, Reservation.status, func.sum(Reservation.gpus))
                .where(Reservation.status.in_(("reserved", "started")))
                .group_by(Reservation.account_name, Reservation.pool, Reservation.status)):
            in_use.add_metric([account, pool, "running" if status == "started" else "reserved"], int(gpus or 0))
        charged = CounterMetricFamily("isthmus_account_gpu_seconds_charged",
                                      "GPU-seconds charged for job usage (billing weight applied), per pool.",
                                      labels=["account", "pool"])
        for account, pool, gpu_s in s.execute(
                select(UsageBucket.account_name, UsageBucket.pool, func.sum(UsageBucket.usage_gpu_seconds))
                .group_by(UsageBucket.account_name, UsageBucket.pool)):
            charged.add_metric([account, pool], max(0, int(gpu_s or 0)))
        entries = CounterMetricFamily("isthmus_ledger_entries", "Ledger entries written, by kind.",
                                      labels=["kind"])
        for kind, n in s.execute(select(LedgerEntry.kind, func.count()).group_by(LedgerEntry.kind)):
            entries.add_metric([kind], n)
        return [factor, in_use, charged, entries]

    def _nodes(self, s: Session, now: datetime) -> list:
        """Node health (docs/recovery.md): the quarantined nodes, and what each node's failures cost."""
        held = GaugeMetricFamily("isthmus_node_quarantined", "1 for each node the gateway holds quarantined "
                                 "(no gang is placed on it until an admin clears it).", labels=["pool", "node"])
        for pool, names in nodehealth.quarantined_now(s).items():
            for node in names:
                held.add_metric([pool, node], 1)
        lost = GaugeMetricFamily("isthmus_node_lost_gpu_hours", "GPU-hours of the failed attempts blamed on the "
                                 "node, last 30 days.", labels=["pool", "node"])
        for (pool, node), gpu_s in sorted(nodehealth.lost_by_node(s, now=now).items()):
            lost.add_metric([pool, node], round(gpu_s / 3600.0, 4))
        return [held, lost]

    def _capacity(self) -> list:
        if self.pools is None:
            return []
        up = GaugeMetricFamily("isthmus_pool_up", "1 when the pool answered its last capacity probe.",
                               labels=["pool"])
        gpus = GaugeMetricFamily("isthmus_pool_gpus", "GPUs in the pool, total and free now.",
                                 labels=["pool", "state"])
        nodes = GaugeMetricFamily("isthmus_pool_nodes", "Nodes in the pool, total and idle now.",
                                  labels=["pool", "state"])
        for name, view in sorted(self.pools().items()):
            ok = getattr(view, "capacity", None) is not None
            up.add_metric([name], 1 if ok else 0)
            if ok:
                gpus.add_metric([name, "total"], view.total_gpus)
                gpus.add_metric([name, "free"], view.free_gpus)
                nodes.add_metric([name, "total"], view.total_nodes)
                nodes.add_metric([name, "idle"], view.idle_nodes)
        return [up, gpus, nodes]
