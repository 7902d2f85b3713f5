"""Recovery: re-drive claims whose dispatcher died (its liveness lock gone, or its lease expired)."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import or_, select

from gateway.dispatch.common import ACTOR
from gateway.dispatch.liveness import Liveness, dead_owners
from gateway.domain.states import JobState
from gateway.jobs import service as jobs
from gateway.kit.db import transaction
from gateway.models.jobs import Job


class Recovery:
    """Re-drives claims whose dispatcher died: at once when its liveness lock has been gone for
    the grace period (Postgres, dispatch/liveness.py), else when the claim's lease expires."""

    def __init__(self, *, sessions, settings, clock, submitter, liveness: Liveness) -> None:
        self.sessions = sessions
        self.settings = settings
        self.clock = clock
        self.submitter = submitter
        self.liveness = liveness

    def recover_round(self) -> list[str]:
        """Re-drive the claims of dead workers and those whose lease expired; returns their ids."""
        now = self.clock()
        with transaction(self.sessions) as s:
            dead = dead_owners(s, self.liveness, (JobState.DISPATCHING,))
            gone = Job.next_attempt_at <= now
            if dead:
                gone = or_(gone, Job.claim_owner.in_(dead))
            stmt = (select(Job).where(Job.state == JobState.DISPATCHING.value, Job.backend_job_id.is_(None), gone)
                    .limit(self.settings.dispatch_batch))
            if not self.settings.is_sqlite:
                stmt = stmt.with_for_update(skip_locked=True)
            stale = list(s.scalars(stmt))
            for job in stale:
                why = (f"dispatch worker {job.claim_owner} is gone" if job.claim_owner in dead
                       else "dispatch claim expired")
                jobs.renew_lease(s, job, until=now + timedelta(seconds=self.settings.dispatch_lease_s), actor=ACTOR,
                                 reason=f"{why}; re-driving the submission idempotently", owner=self.liveness.key)
            ids = [j.id for j in stale]
        self.submitter.submit_all(ids, recovering=True)
        return ids

