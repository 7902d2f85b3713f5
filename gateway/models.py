"""Import every model module so ``Base.metadata`` is complete (Alembic, tests)."""

from gateway.accounts.models import Account  # noqa: F401
from gateway.jobs.models import IdempotencyKey, Job, JobEvent  # noqa: F401
from gateway.kit.db import Base  # noqa: F401

metadata = Base.metadata
