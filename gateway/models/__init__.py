"""Every table of the gateway, one module per area, on one metadata (``kit.db.Base``).

Importing the package imports every model module, so ``Base.metadata`` is complete
(Alembic, tests). Tables import only ``kit`` and ``domain`` (tests/layout).
"""

from gateway.models.accounts import Account, AccountMember, AccountPoolQuota, AccountQuota  # noqa: F401
from gateway.models.jobs import GatewaySecret, IdempotencyKey, Job, JobAttempt, JobEvent, JobPreemption, WaitingCount  # noqa: F401
from gateway.models.flows import JobDependency, JobSet  # noqa: F401
from gateway.models.identity import MembershipSeen  # noqa: F401
from gateway.kit.db import Base  # noqa: F401
from gateway.models.pools import Pool  # noqa: F401
from gateway.models.ui import UiSession  # noqa: F401
from gateway.models.ledger import AccountBalance, AccountPoolBalance, FairshareUsage, GpuBillingWeight, LedgerEntry, Reservation, UsageBucket  # noqa: F401,E501
from gateway.models.webhooks import WebhookCursor, WebhookDelivery, WebhookEndpoint  # noqa: F401

metadata = Base.metadata
