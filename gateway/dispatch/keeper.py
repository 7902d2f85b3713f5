"""Keeping a job's output where its pool deletes it with the job (docs/logs.md).

A Kubernetes pool deletes a job's pods, and their output with them, when the job ends or is
cancelled: the reconciler keeps a copy before it cancels one, and after one ends.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from adapters.base import Backend, Feature, features_of
from gateway.jobs import logs as output
from gateway.kit.db import transaction
from gateway.models.jobs import Job


class OutputKeeper:
    """Copies the output of jobs on pools that stream it (``Feature.OUTPUT_STREAM``)."""

    def __init__(self, *, sessions, settings) -> None:
        self.sessions = sessions
        self.settings = settings
        self._kept_before_cancel: set[str] = set()  # output kept once per job and process before a cancel
        self._output_keeper: ThreadPoolExecutor | None = None

    def keep_before_cancel(self, backend: Backend, job_id: str, backend_job_id: str) -> None:
        """Cancelling deletes the pods with their output: keep it first (one try per job
        and process: a pool that cannot serve it must not slow every cancel round)."""
        tried = self._kept_before_cancel
        if features_of(backend).has(Feature.OUTPUT_STREAM) and job_id not in tried:
            tried.add(job_id)
            with transaction(self.sessions) as s:
                job = s.get(Job, job_id)
                workers = job.workers if job is not None else 0
            self.keep(backend, job_id, backend_job_id, workers, wait=True)

    def forget(self, job_id: str) -> None:
        """The job ended: a later cancel of it is no reason to try again."""
        self._kept_before_cancel.discard(job_id)

    def keep(self, backend: Backend, job_id: str, backend_job_id: str | None, workers: int, *,
             wait: bool = False) -> None:
        """Keep the job's output if its pool deletes it with the job (docs/logs.md).

        In the background by default (two threads per dispatcher), so that a large output
        never holds up the reconciler; ``wait`` keeps it before returning.
        """
        if backend_job_id is None or not features_of(backend).has(Feature.OUTPUT_STREAM):
            return
        args = (backend, job_id, backend_job_id, workers, self.settings.output_keep_dir,
                self.settings.output_keep_mib * 1024 * 1024)
        if wait:
            output.keep_output(*args)
            return
        if self._output_keeper is None:
            self._output_keeper = ThreadPoolExecutor(max_workers=2, thread_name_prefix="isthmus-keep-output")
        self._output_keeper.submit(output.keep_output, *args)

    def stop(self) -> None:
        """Take no more copies; those under way finish (their threads end with them)."""
        keeper, self._output_keeper = self._output_keeper, None
        if keeper is not None:
            keeper.shutdown(wait=False)
