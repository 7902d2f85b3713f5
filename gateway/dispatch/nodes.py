"""Node health in the dispatcher (issue #48, docs/recovery.md "Node health").

Each round (at most every REFRESH_S) it asks every pool that can say which nodes it has out
of service, applies the rule to the record (gateway/pools/nodehealth.py), keeps the nodes'
standing, and drains or cordons a node newly found suspect where the pool allows it. Every
submission then avoids the pool's quarantined nodes and, for a retry, the nodes whose failure
ended the job's earlier attempts (:meth:`NodeWatch.excluded`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import datetime

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from adapters.base import BackendError, Feature, features_of
from gateway.dispatch.common import log
from gateway.domain.nodehealth import Node, Verdict
from gateway.kit.db import transaction
from gateway.models.jobs import Job
from gateway.pools import nodehealth


class NodeWatch:
    REFRESH_S = 5.0
    DRAIN_RETRY_S = 30.0

    def __init__(self, *, sessions, backends: dict, settings, clock,
                 views: Callable[[], dict] = dict) -> None:
        self.sessions = sessions
        self.views = views  # the last capacity snapshot (PoolView by pool): how many nodes a pool has
        self.backends = backends
        self.settings = settings
        self.clock = clock
        self._lock = threading.Lock()
        self._at = -1e9
        self._quarantined: dict[str, dict[str, str]] = {}  # pool -> node -> why
        self._withheld: dict[str, set[str]] = {}  # pool -> quarantined nodes its backend still offers
        self.down: dict[Node, str] = {}  # what the backends said at the last look
        self._tried: dict[Node, float] = {}  # a drain that failed: when (monotonic), to try again later

    def invalidate(self) -> None:
        self._at = -1e9

    def quarantined(self, pool: str) -> dict[str, str]:
        """The pool's quarantined nodes (node -> why) as of the last refresh."""
        return dict(self._quarantined.get(pool, {}))

    def withheld(self, pool: str) -> int:
        """How many quarantined nodes of ``pool`` its backend still counts in service: the planner
        takes them out of the pool's capacity (a node drained or down is out of it already)."""
        return len(self._withheld.get(pool, ()))

    def refresh(self, *, force: bool = False) -> int:
        """Apply the rule now (or when the last look is older than REFRESH_S); returns how many
        nodes were newly found suspect."""
        if not force and time.monotonic() - self._at < self.REFRESH_S:
            return 0
        with self._lock:
            down: dict[Node, str] = {}
            for pool, backend in self.backends.items():
                if not features_of(backend).has(Feature.NODE_HEALTH):
                    continue
                try:
                    down.update({(pool, n): why for n, why in backend.node_problems().items()})
                except BackendError as exc:
                    log.info("node states of %s unknown this round: %s", pool, exc.message)
            now = self.clock()
            thresholds = nodehealth.thresholds_of(self.settings)
            for last in (False, True):
                try:
                    with transaction(self.sessions) as s:
                        verdicts = nodehealth.health(s, now=now, thresholds=thresholds, backend_down=down)
                        newly = nodehealth.note(s, verdicts, now=now)
                        # A drain that failed (a node gone for a while, the API unreachable) is tried again.
                        again = [verdicts[k] for k in nodehealth.undrained(s)
                                 if k in verdicts and verdicts[k].suspect and not verdicts[k].by_backend
                                 and time.monotonic() - self._tried.get(k, -1e9) > self.DRAIN_RETRY_S]
                    break
                except IntegrityError:
                    # Another dispatch worker wrote the node's standing first: read it again (it
                    # found the node suspect, and drains it; this one then does not).
                    if last:
                        raise
            self.down = down
            self._quarantined = nodehealth.quarantined(verdicts)
            self._withheld = {pool: {n for n in nodes if (pool, n) not in down}
                              for pool, nodes in self._quarantined.items()}
            self._at = time.monotonic()
        for v in newly:
            log.warning("node %s of pool %s is suspect: %s", v.node, v.pool, v.reason,
                        extra={"pool": v.pool, "node": v.node})
            self._drain(v, now)
        for v in again:
            self._drain(v, now)
        return len(newly)

    def _drain(self, v: Verdict, now: datetime) -> None:
        """Take a newly suspect node out of service in its backend, where the pool allows it."""
        backend = self.backends.get(v.pool)
        if backend is None or not features_of(backend).has(Feature.NODE_DRAIN):
            return
        try:
            backend.drain_node(v.node, f"{nodehealth.GATEWAY_REASON} {v.reason}")
        except BackendError as exc:
            self._tried[(v.pool, v.node)] = time.monotonic()
            log.warning("could not drain node %s of pool %s: %s", v.node, v.pool, exc.message)
            with transaction(self.sessions) as s:
                nodehealth.mark_drained(s, v.pool, v.node, at=None, error=exc.message)
            return
        with transaction(self.sessions) as s:
            nodehealth.mark_drained(s, v.pool, v.node, at=now)

    def excluded(self, session: Session, job: Job, pool: str) -> tuple[str, ...]:
        """The nodes of ``pool`` this job's gang must not land on: the pool's quarantined nodes
        and, from its second attempt on, those whose failure ended its earlier attempts.

        The planner already keeps a gang that needs a quarantined node waiting (the node is out
        of the pool's capacity). A retry's avoidance is a preference: it is dropped when the pool
        would have too few nodes left for the gang, which would then never run there (Slurm
        refuses such a job outright)."""
        quarantined = set(self._quarantined.get(pool, {}))
        if (job.attempt or 1) <= 1:
            return tuple(sorted(quarantined))
        avoided = {node for p, node in nodehealth.avoided_by(session, job.id, now=self.clock(),
                                                             thresholds=nodehealth.thresholds_of(self.settings))
                   if p == pool} - quarantined
        spare, present = self._room(job, pool)
        if avoided and len({n for n in quarantined | avoided if present is None or n in present}) > spare:
            log.info("job %s: not avoiding %s on %s: the gang needs the pool's other nodes", job.id,
                     ", ".join(sorted(avoided)), pool, extra={"job_id": job.id})
            avoided = set()
        return tuple(sorted(quarantined | avoided))

    def _room(self, job: Job, pool: str) -> tuple[int, set[str] | None]:
        """(How many of the pool's nodes its gang can do without, the pool's nodes by name or None
        when unknown), from the last capacity snapshot. An unknown pool size: none to spare."""
        view = self.views().get(pool)
        total = getattr(view, "total_nodes", 0) or 0
        per_node = getattr(view, "gpus_per_node", 0) or 0
        capacity = getattr(view, "capacity", None)
        names = {n for p in (capacity.pools if capacity is not None else ()) for n in p.nodes} or None
        if not total:
            return 0, names
        needs = job.workers if getattr(view, "node_exclusive", True) or not per_node else \
            -(-(job.held_gpus or job.total_gpus) // per_node)
        return max(0, total - needs), names
