"""Graceful shutdown of `isthmus worker` on SIGTERM, with a real process and the real Slurm
cluster: it stops claiming, finishes the submission it has in flight, and exits 0."""

from __future__ import annotations

import signal

import pytest

from tests.dispatch.test_faults import (  # noqa: F401  (fixtures)
    backend_copies,
    gateway,
    ledger_problems,
    pg_url,
    slurm_backend,
    states,
    submit,
    wait_states,
    workers,
)

pytestmark = [pytest.mark.slurm("24.11"), pytest.mark.postgres]


def test_sigterm_finishes_the_inflight_submission_and_claims_nothing_new(gateway, workers, pg_url, slurm_backend):
    first = submit(gateway, n=1, command=("sleep", "2"))[0]
    # The worker pauses between claiming and submitting: SIGTERM lands with a claim in hand.
    w = workers.start(test_pause_after_claim_s=4)
    wait_states(pg_url, [first], {"dispatching"}, 30)
    w.send_signal(signal.SIGTERM)
    later = submit(gateway, n=1, command=("true",))[0]  # arrives after the signal
    assert w.wait(30) == 0, "the worker did not exit cleanly after SIGTERM"
    st = states(pg_url, [first, later])
    # the claimed job was really submitted and recorded, not left half-way
    assert st[first] in {"queued", "starting", "running", "succeeded"}, st
    assert backend_copies(slurm_backend, first) == 1
    # nothing was claimed after the signal
    assert st[later] == "pending", st
    assert ledger_problems(gateway) == []
