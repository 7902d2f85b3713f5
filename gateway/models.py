"""Import every model module so ``Base.metadata`` is complete (Alembic, tests)."""

from gateway.accounts.models import Account, AccountMember, AccountPoolQuota, AccountQuota  # noqa: F401
from gateway.jobs.models import IdempotencyKey, Job, JobEvent  # noqa: F401
from gateway.flows.models import JobDependency, JobSet  # noqa: F401
from gateway.kit.db import Base  # noqa: F401
from gateway.pools.models import Pool  # noqa: F401
from gateway.ledger.models import AccountBalance, AccountPoolBalance, FairshareUsage, GpuBillingWeight, LedgerEntry, Reservation, UsageBucket  # noqa: F401,E501
from gateway.webhooks.models import WebhookCursor, WebhookDelivery, WebhookEndpoint  # noqa: F401

metadata = Base.metadata
