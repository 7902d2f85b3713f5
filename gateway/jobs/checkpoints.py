"""Checkpoints reported by the job (docs/recovery.md, "Checkpoint reports").

A job says "checkpoint committed" with ``POST /v1/jobs/{id}/checkpoints`` from inside the
job (docs/recovery.md has a ten-line Python helper; the nodes need no gateway client). It authenticates with a **job credential** the gateway puts in
its environment (``ISTHMUS_JOB_TOKEN``): good for that call of that job's current attempt
only, never for anything else (the API's token validation does not know it). The credential
is ``ijt1.<job id>.<attempt>.<HMAC-SHA256 of both>``, keyed by a secret the gateway makes
itself, once, in its database (``gateway_secret``), so every process of a deployment
derives and checks the same credentials and none is stored.

The report moves ``job.checkpoint_at``: reclaim (gateway/domain/preempt.py) counts only the
work since then as at risk, and the job's page shows it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
import threading
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from gateway.domain.preempt import Running, at_risk_gpu_hours
from gateway.domain.states import JobState
from gateway.jobs import journal
from gateway.kit.db import transaction
from gateway.kit.errors import Conflict, Unauthorized
from gateway.kit.timeutil import as_utc, utcnow
from gateway.models.jobs import GatewaySecret, Job, JobAttempt

SECRET_NAME = "job-credential-key"
PREFIX = "ijt1"
TOKEN = re.compile(r"ijt1\.([0-9A-Za-z-]{1,36})\.([0-9]{1,4})\.([A-Za-z0-9_-]{43})")
KIND = "checkpoint"  # the kind of the job's checkpoint events


def at_risk(job: Job) -> float | None:
    """A running job's GPU-hours since its last checkpoint report (or its start): what reclaim
    counts (gateway/domain/preempt.py), for the API and the job's page. None when not running."""
    if job.state != JobState.RUNNING.value or job.started_at is None:
        return None
    checkpoint = as_utc(job.checkpoint_at)
    running = Running(id=job.id, account=job.account_name, pool=job.pool or "", gpus=job.held_gpus or job.total_gpus,
                      nodes=job.workers, borrowed=bool(job.borrowed), started_at=as_utc(job.started_at).timestamp(),
                      checkpoint_at=checkpoint.timestamp() if checkpoint else None)
    return round(at_risk_gpu_hours(running, utcnow().timestamp()), 4)


class JobCredentials:
    """Makes and checks job credentials; the key is read (or made) once per process."""

    def __init__(self, sessions) -> None:
        """``sessions``: the sessionmaker, or a callable returning it (the app makes its own at start-up)."""
        self._sessions = sessions
        self._key: bytes | None = None
        self._lock = threading.Lock()

    def prime(self) -> None:
        """Read (or make) the key now. Call it outside any transaction: on SQLite a second
        writer inside the first one's transaction would wait for itself."""
        self._secret()

    def _secret(self) -> bytes:
        with self._lock:
            if self._key is None:
                self._key = self._load()
            return self._key

    @property
    def sessions(self) -> sessionmaker:
        return self._sessions if isinstance(self._sessions, sessionmaker) else self._sessions()

    def _load(self) -> bytes:
        for _ in range(3):
            with transaction(self.sessions) as s:
                row = s.get(GatewaySecret, SECRET_NAME)
                if row is not None:
                    return base64.urlsafe_b64decode(row.value)
            try:  # first use anywhere: make it; a concurrent maker's key wins (the primary key)
                with transaction(self.sessions) as s:
                    s.add(GatewaySecret(name=SECRET_NAME, value=base64.urlsafe_b64encode(secrets.token_bytes(32))
                                        .decode()))
            except IntegrityError:
                continue
        raise RuntimeError("could not read or make the job credential key")

    def _mac(self, job_id: str, attempt: int) -> str:
        digest = hmac.new(self._secret(), f"{PREFIX}.{job_id}.{attempt}".encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).decode().rstrip("=")

    def token(self, job_id: str, attempt: int) -> str:
        """The credential of ``job_id``'s attempt number ``attempt``."""
        return f"{PREFIX}.{job_id}.{attempt}.{self._mac(job_id, attempt)}"

    def check(self, token: str, job_id: str) -> int:
        """The attempt ``token`` is good for, if it is a credential of ``job_id``; else Unauthorized.

        The whole string must be a credential of this job (no prefix or suffix accepted);
        the comparison of the MACs takes constant time.
        """
        m = TOKEN.fullmatch(token or "")
        if m is None or m.group(1) != job_id:
            raise Unauthorized("not a job credential of this job")
        attempt = int(m.group(2))
        if not hmac.compare_digest(m.group(3), self._mac(job_id, attempt)):
            raise Unauthorized("not a job credential of this job")
        return attempt


def report(session: Session, job: Job, *, attempt: int | None, at: datetime, actor: str, step: int | None,
           note: str) -> Job:
    """Record a committed checkpoint of the job's current attempt (``attempt`` None: by the
    job's owner, for the current attempt). A credential of an earlier attempt, or a job that
    is not running, is refused (409): its report would protect work the current run never did."""
    if attempt is not None and attempt != job.attempt and not _same_run(session, job, attempt):
        raise Conflict(f"this credential is attempt {attempt}'s; the job is at attempt {job.attempt}")
    if job.state != JobState.RUNNING.value:
        raise Conflict(f"job is {job.state}: only a running job reports checkpoints")
    job.checkpoint_at = at
    words = "checkpoint committed" + (f" at step {step}" if step is not None else "") + (f": {note}" if note else "")
    journal.record(session, job.id, at=at, actor=actor, kind=KIND, reason=words,
                   data={"attempt": job.attempt, "step": step})
    return job


def _same_run(session: Session, job: Job, attempt: int) -> bool:
    """Whether the backend job of ``attempt`` is the one running now: a backend that requeued
    the job (Kueue's preemption, docs/recovery.md) runs the same backend job again as a new
    attempt, with the environment, and so the credential, it was submitted with.

    The same backend job is the same pool *and* the same id: a retry that landed on another
    pool whose backend happened to hand out the same id is another run (issue #45, finding 5)."""
    if attempt > job.attempt or not job.backend_job_id:
        return False
    later = session.execute(select(JobAttempt.pool, JobAttempt.backend_job_id).where(
        JobAttempt.job_id == job.id, JobAttempt.number >= attempt)).all()
    return bool(later) and all((pool, b) == (job.pool, job.backend_job_id) for pool, b in later)

