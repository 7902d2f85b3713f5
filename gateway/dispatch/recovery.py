"""Recovery: re-drive claims whose dispatcher died (lease expired while dispatching)."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select

from gateway.dispatch.common import ACTOR
from gateway.domain.states import JobState
from gateway.jobs import service as jobs
from gateway.kit.db import transaction
from gateway.models.jobs import Job


class Recovery:
    """Re-drives claims whose dispatcher died (lease expired while dispatching)."""

    def __init__(self, *, sessions, settings, clock, submitter) -> None:
        self.sessions = sessions
        self.settings = settings
        self.clock = clock
        self.submitter = submitter

    def recover_round(self) -> list[str]:
        """Re-drive claims whose dispatcher died (lease expired while dispatching)."""
        now = self.clock()
        with transaction(self.sessions) as s:
            stmt = (select(Job).where(Job.state == JobState.DISPATCHING.value, Job.backend_job_id.is_(None),
                                      Job.next_attempt_at <= now).limit(self.settings.dispatch_batch))
            if not self.settings.is_sqlite:
                stmt = stmt.with_for_update(skip_locked=True)
            stale = list(s.scalars(stmt))
            for job in stale:
                jobs.renew_lease(s, job, until=now + timedelta(seconds=self.settings.dispatch_lease_s), actor=ACTOR,
                                 reason="dispatch claim expired; re-driving the submission idempotently")
            ids = [j.id for j in stale]
        self.submitter.submit_all(ids, recovering=True)
        return ids
