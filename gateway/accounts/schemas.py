"""Wire models for accounts, quotas and usage (user view and admin view)."""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from gateway.kit.names import ACCOUNT_NAME_RE, POOL_NAME_RE
from gateway.models.accounts import MEMBER_ROLES

AccountName = Field(pattern=ACCOUNT_NAME_RE, max_length=63)

# Named enums, used on inputs AND outputs, so a value read from a response can be passed
# back to a generated client without a cast. Built from the one list of each.
# Pools are data (GET /v1/pools lists them): a name is checked against the gateway's pools
# when used, never frozen into the spec as an enum.
POOL_NAME_PATTERN = POOL_NAME_RE
Pool = Annotated[str, Field(pattern=POOL_NAME_PATTERN, max_length=63,
                            description="A pool's name (GET /v1/pools), e.g. `slurm-h100`.")]
MemberRole = enum.Enum("MemberRole", {r.upper(): r for r in MEMBER_ROLES}, type=str)
MemberRole.__doc__ = "`coordinator`s may manage the account's subtree; see docs/ledger.md."


class BudgetPeriod(str, enum.Enum):
    """`month`: calendar month, UTC; `rolling`: the last `budget_window_days`."""

    MONTH = "month"
    ROLLING = "rolling"


class QuotaIn(BaseModel):
    """Limits to set on an account. Omitted fields are left as they are; ``null`` removes a limit
    (the nearest ancestor's then applies). A limit caps the sum over the account's subtree."""

    model_config = ConfigDict(extra="forbid", use_enum_values=True, json_schema_extra={"examples": [
        {"max_gpus": 64, "max_gpus_per_pool": {"slurm-h100": 48}, "guaranteed_gpus": 32,
         "budget_gpu_hours": 20000, "budget_period": "month",
         "max_queued_jobs": 50, "max_queued_jobs_per_user": 10}]})

    max_gpus: int | None = Field(default=None, ge=0, le=1_000_000, description="Concurrent GPUs, all pools together.")
    max_gpus_per_pool: dict[Pool, Annotated[int, Field(ge=0, le=1_000_000)] | None] | None = Field(
        default=None, description="Concurrent GPUs in one pool, on top of `max_gpus`; pools left out are left "
                                  "as they are, `null` removes that pool's limit.")
    guaranteed_gpus: int | None = Field(
        default=None, ge=0, le=1_000_000,
        description="Concurrent GPUs, all pools together, that the subtree's work may hold without ever being "
                    "preempted for another account's; work beyond it runs *borrowed* on idle GPUs and may be "
                    "reclaimed (docs/recovery.md). At most `max_gpus`.")
    guaranteed_gpus_per_pool: dict[Pool, Annotated[int, Field(ge=0, le=1_000_000)] | None] | None = Field(
        default=None, description="The guarantee in one pool; pools left out are left as they are, `null` removes "
                                  "it. At most that pool's limit.")
    max_gpus_slurm: int | None = Field(default=None, ge=0, le=1_000_000, deprecated=True,
                                       description="Deprecated: `max_gpus_per_pool` of the pool named `slurm`.")
    max_gpus_kubernetes: int | None = Field(default=None, ge=0, le=1_000_000, deprecated=True,
                                            description="Deprecated: `max_gpus_per_pool` of the pool named "
                                                        "`kubernetes`.")
    budget_gpu_hours: float | None = Field(default=None, ge=0, le=10**11,
                                           description="Billing-weighted GPU-hours per period.")
    budget_period: BudgetPeriod | None = Field(
        default=None, description="`month` (calendar month, UTC) or `rolling` (last `budget_window_days`).")
    budget_window_days: int | None = Field(default=None, ge=1, le=366)
    max_queued_jobs: int | None = Field(default=None, ge=0, le=10_000_000,
                                        description="Waiting (not yet started) jobs in the subtree; checked at "
                                                    "submit (429) and when the gang is reserved.")
    max_queued_jobs_per_user: int | None = Field(default=None, ge=0, le=10_000_000,
                                                 description="The same, per user.")


class EffectiveLimitOut(BaseModel):
    value: int | None = Field(description="null = unlimited")
    source: str | None = Field(description="Account the limit is set on (itself or an ancestor).")


class EffectiveBudgetOut(BaseModel):
    value: float | None = Field(description="GPU-hours; null = unlimited")
    source: str | None = Field(description="Account the budget is set on (itself or an ancestor).")


class QuotaOut(BaseModel):
    max_gpus: EffectiveLimitOut
    max_gpus_per_pool: dict[str, EffectiveLimitOut] = Field(
        default_factory=dict, description="Per-pool concurrent-GPU limits in force (pools without one are absent).")
    guaranteed_gpus: EffectiveLimitOut = Field(
        default_factory=lambda: EffectiveLimitOut(value=None, source=None),
        description="The guarantee the account's work counts against (its own, else the nearest ancestor's); "
                    "null: none, so all its work runs borrowed.")
    guaranteed_gpus_per_pool: dict[str, EffectiveLimitOut] = Field(
        default_factory=dict, description="Per-pool guarantees in force (pools without one are absent).")
    max_gpus_slurm: EffectiveLimitOut = Field(deprecated=True, description="Deprecated: `max_gpus_per_pool.slurm`.")
    max_gpus_kubernetes: EffectiveLimitOut = Field(deprecated=True,
                                                   description="Deprecated: `max_gpus_per_pool.kubernetes`.")
    budget_gpu_hours: EffectiveBudgetOut
    budget_period: BudgetPeriod | None
    budget_window_days: int | None
    max_queued_jobs: EffectiveLimitOut
    max_queued_jobs_per_user: EffectiveLimitOut


class BalanceOut(BaseModel):
    reserved_gpus: int = Field(description="GPUs held in all pools together (the subtree's running and queued gangs).")
    reserved_gpus_per_pool: dict[str, int] = Field(default_factory=dict, description="The same, per pool.")
    reserved_gpus_slurm: int = Field(deprecated=True, description="Deprecated: `reserved_gpus_per_pool.slurm`.")
    reserved_gpus_kubernetes: int = Field(deprecated=True,
                                          description="Deprecated: `reserved_gpus_per_pool.kubernetes`.")
    committed_gpu_hours: float
    queued_jobs: int


class FairShareOut(BaseModel):
    account: str
    parent: str | None
    shares: int
    level_shares: int
    norm_shares: float
    raw_usage_gpu_hours: float
    # The same decayed usage apportioned over pools by daily usage (gateway/ledger/breakdown.py);
    # the parts add up to raw_usage_gpu_hours. Filled in the admin fair-share table.
    raw_usage_gpu_hours_per_pool: dict[str, float] = Field(default_factory=dict)
    norm_usage: float
    effective_usage: float
    factor: float


class AccountOut(BaseModel):
    name: str
    parent: str | None
    shares: int
    description: str
    fairshare_factor: float | None = None
    created_at: datetime | None = None


class AccountUsageOut(BaseModel):
    account: str
    period: str | None = Field(description="Budget period of the governing budget, e.g. `2026-11` or `last 30 days`.")
    used_gpu_hours: float | None = Field(description="Net charges in the period, subtree of the budget's account.")
    committed_gpu_hours: float = Field(description="Committed time of running/queued jobs not yet charged.")
    remaining_gpu_hours: float | None = Field(description="Budget minus used minus committed; null = no budget.")
    balance: BalanceOut
    quota: QuotaOut
    fairshare: FairShareOut | None


class AccountPage(BaseModel):
    items: list[AccountOut]
