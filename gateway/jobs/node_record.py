"""The node-health record's one writer (issue #48; gateway/models/nodes.py ``attempt_end``).

Every attempt that ended after running on nodes gets one row, in the transaction that ends
it (gateway/jobs/service.py ``end_attempt`` and ``finish`` call :func:`record`): which pool
and nodes, whose job, how it ended, and, for an infrastructure failure, which nodes its
backend had out of service and what the attempt's run was charged (the GPU-hours it cost).
An attempt that never ran on a node says nothing about one and is not recorded. The rule
reads the record in gateway/pools/nodehealth.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime

from sqlalchemy.orm import Session

from gateway.models.jobs import Job
from gateway.models.nodes import AttemptEnd


def record(session: Session, job: Job, *, number: int, outcome: str, ended_at: datetime,
           nodes: Sequence[str] | None, failed_nodes: Iterable[str] = (), charged_gpu_seconds: int = 0,
           reason: str = "") -> None:
    """Record attempt ``number`` of ``job`` as ended (nothing when it ran on no node)."""
    if not nodes or not job.pool:
        return
    session.add(AttemptEnd(job_id=job.id, attempt=number, account_name=job.account_name, pool=job.pool,
                           nodes=list(nodes), failed_nodes=[n for n in failed_nodes if n in nodes],
                           ended_at=ended_at, outcome=outcome, charged_gpu_seconds=int(charged_gpu_seconds),
                           reason=reason[:2000]))
