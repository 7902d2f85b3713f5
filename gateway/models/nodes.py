"""The node-health record (issue #48, docs/recovery.md "Node health").

``attempt_end``: one row per attempt of a job that ended after running on nodes, whatever
ended it (written with the attempt's end, in the same transaction: gateway/jobs/node_record.py).
``node_standing``: what the gateway and its admins did about one node: cleared it, drained or
cordoned it in its backend (gateway/pools/nodehealth.py). The verdict itself (suspect or
not) is never stored: it is the rule's (gateway/domain/nodehealth.py) over these rows.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column

from gateway.kit.db import Base, BigIntPK
from gateway.kit.names import POOL_NAME_LEN

NODE_NAME_LEN = 253  # a Kubernetes node name's bound; Slurm's are shorter


class AttemptEnd(Base):
    __tablename__ = "attempt_end"
    __table_args__ = (
        UniqueConstraint("job_id", "attempt", name="uq_attempt_end_job_attempt"),
        # The rule's read: the infrastructure failures of the last window (or avoid time).
        Index("ix_attempt_end_outcome_ended", "outcome", "ended_at"),
    )

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    # No foreign key: the record outlives a job's rows (a node's cost stays on record).
    job_id: Mapped[str] = mapped_column(String(36))
    attempt: Mapped[int] = mapped_column(Integer)
    account_name: Mapped[str] = mapped_column(String(63))
    pool: Mapped[str] = mapped_column(String(POOL_NAME_LEN))
    nodes: Mapped[list[str]] = mapped_column(JSON)  # every node the attempt ran on
    # Of those, the ones its backend had out of service when the failure was seen (a Slurm
    # node DOWN or DRAIN, a Kubernetes node NotReady or gone); [] when it named none: then
    # every node of the attempt shares the blame.
    failed_nodes: Mapped[list[str]] = mapped_column(JSON, default=list)
    ended_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    # node_failure | preempted | exit_code | time_limit | cancelled | lost | succeeded
    outcome: Mapped[str] = mapped_column(String(32))
    charged_gpu_seconds: Mapped[int] = mapped_column(BigInteger, default=0)
    reason: Mapped[str] = mapped_column(Text, default="")


class NodeStanding(Base):
    __tablename__ = "node_standing"

    pool: Mapped[str] = mapped_column(String(POOL_NAME_LEN), primary_key=True)
    node: Mapped[str] = mapped_column(String(NODE_NAME_LEN), primary_key=True)
    # An admin cleared it: failures before this no longer count.
    cleared_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    cleared_by: Mapped[str] = mapped_column(String(255), default="")
    # The gateway found it suspect (first seen so; NULL: not suspect at the last look), and
    # the words it gave.
    suspect_since: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    reason: Mapped[str] = mapped_column(Text, default="")
    # The gateway drained (Slurm) or cordoned (Kubernetes) it in its backend; NULL: it did not.
    drained_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    drain_error: Mapped[str] = mapped_column(Text, default="")
