"""The control loop: fair-share dispatch, routing, submission, reconciliation, recovery.

One module per part of the loop (see gateway/dispatch/dispatcher.py); the names other code
imports are re-exported here.
"""

from gateway.dispatch.claim import accounts_with_pending, pending_order
from gateway.dispatch.common import ACTOR, FOLLOWED, RECONCILER, submit_request
from gateway.dispatch.dispatcher import Dispatcher

__all__ = ["ACTOR", "FOLLOWED", "RECONCILER", "Dispatcher", "accounts_with_pending", "pending_order", "submit_request"]
