"""Every table of the gateway, one module per area, on one metadata (``kit.db.Base``).

Importing the package imports every model module, so ``Base.metadata`` is complete
(Alembic, tests). Tables import only ``kit`` and ``domain`` (tests/layout).
"""

from gateway.kit.db import Base
from gateway.models.accounts import (  # noqa: F401
    Account,
    AccountMember,
    AccountPoolQuota,
    AccountQuota,
)
from gateway.models.audit import AuditRecord  # noqa: F401
from gateway.models.flows import JobDependency, JobSet  # noqa: F401
from gateway.models.identity import MembershipSeen  # noqa: F401
from gateway.models.jobs import (  # noqa: F401
    GatewaySecret,
    IdempotencyKey,
    Job,
    JobAttempt,
    JobEvent,
    JobPreemption,
    WaitingCount,
)
from gateway.models.ledger import (  # noqa: F401
    AccountBalance,
    AccountPoolBalance,
    FairshareUsage,
    GpuBillingWeight,
    LedgerEntry,
    Reservation,
    UsageBucket,
)
from gateway.models.nodes import AttemptEnd, NodeStanding  # noqa: F401
from gateway.models.pools import Pool  # noqa: F401
from gateway.models.ui import UiSession  # noqa: F401
from gateway.models.webhooks import WebhookCursor, WebhookDelivery, WebhookEndpoint  # noqa: F401

metadata = Base.metadata
