"""The backend contract suite: every adapter must pass it against its real system.

Use it by subclassing :class:`BackendContract` in a backend's test module and providing
two fixtures:

* ``backend``: a connected :class:`adapters.base.Backend` instance for the real system.
* ``scenario``: a callable ``scenario(kind, gateway_job_id) -> SubmitRequest`` building a
  request that, on that backend, behaves as ``kind`` says:
  ``"succeeds"`` (finishes with exit 0 within ~30 s), ``"fails"`` (finishes with exit
  code 3), ``"long"`` (runs for minutes unless cancelled), ``"too_big"`` (can never fit
  the pool: the backend must reject it).

Optionally override ``final_timeout_s`` for slow systems.
"""

from __future__ import annotations

import time
import uuid

import pytest

from adapters.base import (
    Backend,
    BackendError,
    BackendState,
    JobNotFound,
    JobStatus,
    SubmissionRejected,
)


def new_gateway_id() -> str:
    return f"contract-{uuid.uuid4().hex[:12]}"


def wait_for(backend: Backend, backend_job_id: str, predicate, timeout_s: float) -> JobStatus:
    deadline = time.monotonic() + timeout_s
    status = backend.status(backend_job_id)
    while not predicate(status):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s; last status: {status}")
        time.sleep(0.5)
        status = backend.status(backend_job_id)
    return status


class BackendContract:
    final_timeout_s: float = 120.0

    def test_submit_is_found_by_gateway_id(self, backend, scenario):
        gid = new_gateway_id()
        result = backend.submit(scenario("long", gid))
        try:
            assert result.backend_job_id
            assert result.adopted is False
            found = backend.find_by_gateway_id(gid)
            assert found is not None
            assert found.backend_job_id == result.backend_job_id
            assert found.gateway_job_id == gid
            status = backend.status(result.backend_job_id)
            assert status.gateway_job_id == gid
            assert not status.state.final
        finally:
            backend.cancel(result.backend_job_id)

    def test_resubmit_same_gateway_id_adopts_instead_of_duplicating(self, backend, scenario):
        gid = new_gateway_id()
        first = backend.submit(scenario("long", gid))
        try:
            second = backend.submit(scenario("long", gid))
            assert second.backend_job_id == first.backend_job_id
            assert second.adopted is True
        finally:
            backend.cancel(first.backend_job_id)

    def test_successful_job_reports_times_and_exit_zero(self, backend, scenario):
        gid = new_gateway_id()
        result = backend.submit(scenario("succeeds", gid))
        status = wait_for(backend, result.backend_job_id, lambda s: s.state.final, self.final_timeout_s)
        assert status.state is BackendState.SUCCEEDED, status
        assert status.exit_code in (0, None) or status.exit_code == 0
        assert status.started_at is not None and status.ended_at is not None
        assert status.ended_at >= status.started_at
        assert status.allocated_gpus == 0  # a finished job holds nothing

    def test_failing_job_reports_failed_with_exit_code(self, backend, scenario):
        gid = new_gateway_id()
        result = backend.submit(scenario("fails", gid))
        status = wait_for(backend, result.backend_job_id, lambda s: s.state.final, self.final_timeout_s)
        assert status.state is BackendState.FAILED, status
        assert status.exit_code == 3, status
        assert status.reason

    def test_cancel_long_job(self, backend, scenario):
        gid = new_gateway_id()
        result = backend.submit(scenario("long", gid))
        backend.cancel(result.backend_job_id)
        status = wait_for(
            backend, result.backend_job_id,
            lambda s: s.state is BackendState.CANCELLED or s.state.final, self.final_timeout_s,
        )
        assert status.state is BackendState.CANCELLED, status
        backend.cancel(result.backend_job_id)  # cancelling twice is not an error

    def test_unknown_job(self, backend):
        assert backend.find_by_gateway_id(new_gateway_id()) is None
        with pytest.raises(JobNotFound):
            backend.status("999999999" if backend.name == "slurm" else "isthmus-no-such-job")

    def test_capacity_reports_pools(self, backend):
        cap = backend.capacity()
        assert cap.backend == backend.name
        assert cap.pools
        assert cap.total_gpus > 0
        for pool in cap.pools:
            assert 0 <= pool.free_gpus <= pool.total_gpus
            assert 0 <= pool.idle_nodes <= pool.total_nodes

    def test_impossible_job_is_rejected_with_backend_message(self, backend, scenario):
        gid = new_gateway_id()
        with pytest.raises(SubmissionRejected) as exc:
            backend.submit(scenario("too_big", gid))
        assert exc.value.message
        assert not exc.value.retryable
        assert isinstance(exc.value, BackendError)

    def test_first_attempt_submit_creates_one_job(self, backend, scenario):
        import dataclasses

        gid = new_gateway_id()
        result = backend.submit(dataclasses.replace(scenario("long", gid), first_attempt=True))
        try:
            assert result.adopted is False
            again = backend.submit(scenario("long", gid))  # a retry looks first and adopts
            assert again.backend_job_id == result.backend_job_id and again.adopted is True
        finally:
            backend.cancel(result.backend_job_id)
