"""Compatibility: the dispatcher is the package ``gateway.dispatch`` now; import from there."""

from gateway.dispatch import (  # noqa: F401 - re-exports for older imports
    ACTOR, BACKEND_TO_JOB, FOLLOWED, RECONCILER, Dispatcher, accounts_with_pending, pending_order, requeued_at,
    submit_request,
)
