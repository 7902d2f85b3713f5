"""Wire models of the admin API."""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gateway.accounts.schemas import (
    AccountUsageOut,
    FairShareOut,
    MemberRole,
    Pool,
    QuotaIn,
)
from gateway.kit.names import ACCOUNT_NAME_RE
from gateway.models.ledger import ENTRY_KINDS

NAME = ACCOUNT_NAME_RE
USER = r"^[a-z_][a-z0-9_-]{0,31}$"
# A Kubernetes object name (DNS-1123 subdomain), as a WorkloadPriorityClass is named.
PRIORITY_CLASS = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
PRIORITY_CLASS_DOC = ("Kueue WorkloadPriorityClass of the account's jobs on Kubernetes: it decides which "
                      "accounts' jobs the shared ClusterQueue may preempt. Only administrators set it; a "
                      "user's job `priority` orders jobs within their account only. null: the backend's "
                      "default class.")

LedgerEntryKind = enum.Enum("LedgerEntryKind", {k.upper(): k for k in ENTRY_KINDS}, type=str)
LedgerEntryKind.__doc__ = "What a ledger entry records (docs/ledger.md)."


class UsagePeriod(str, enum.Enum):
    """Granularity of a usage report."""

    MONTH = "month"
    DAY = "day"


class AccountCreate(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"name": "team-a", "parent": "org", "shares": 2, "description": "Vision team",
         "quota": {"max_gpus": 32, "budget_gpu_hours": 5000}}]})

    name: str = Field(pattern=NAME, max_length=63)
    parent: str | None = Field(default=None, pattern=NAME, max_length=63)
    shares: int = Field(default=1, ge=0, le=1_000_000, description="Fair-share weight among siblings.")
    description: str = Field(default="", max_length=2000)
    priority_class: str | None = Field(default=None, pattern=PRIORITY_CLASS, max_length=253,
                                       description=PRIORITY_CLASS_DOC)
    quota: QuotaIn | None = None


class AccountUpdate(BaseModel):
    """Only the fields present change. ``parent: null`` makes the account a root."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"shares": 3}, {"parent": "org-b"},
                                                                                 {"priority_class": "isthmus-high"}]})

    parent: str | None = Field(default=None, pattern=NAME, max_length=63)
    shares: int | None = Field(default=None, ge=0, le=1_000_000)
    description: str | None = Field(default=None, max_length=2000)
    priority_class: str | None = Field(default=None, pattern=PRIORITY_CLASS, max_length=253,
                                       description=PRIORITY_CLASS_DOC + " `null` goes back to the default.")


class AdminAccountOut(AccountUsageOut):
    parent: str | None
    shares: int
    description: str
    priority_class: str | None = Field(default=None, description=PRIORITY_CLASS_DOC)
    members: list[MemberOut] = []  # noqa: RUF012 - pydantic copies a field default per instance


class MemberIn(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"role": "coordinator"}]})

    role: MemberRole = MemberRole.MEMBER


class MemberOut(BaseModel):
    account: str
    username: str
    role: MemberRole
    created_at: datetime | None = None


class AdjustmentIn(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"account": "team-a", "kind": "credit", "gpu_hours": 100, "reason": "outage on 2026-11-03"},
        {"account": "team-a", "kind": "refund", "gpu_hours": 16, "job_id": "0192f3c4-...",
         "reason": "node failure"}]})

    account: str = Field(pattern=NAME, max_length=63)
    kind: Literal["credit", "debit", "refund"] = Field(
        description="credit gives budget back, debit takes budget, refund gives back (part of) a job's usage.")
    gpu_hours: float = Field(gt=0, le=10**11, description="Billing-weighted GPU-hours.")
    reason: str = Field(min_length=1, max_length=2000)
    job_id: str | None = Field(default=None, max_length=36)
    pool: Pool | None = None


class LedgerEntryOut(BaseModel):
    id: int
    at: datetime
    account: str
    kind: LedgerEntryKind
    job_id: str | None
    pool: str | None
    gpu_type: str | None
    username: str | None
    gpus: int = Field(description="Change of GPUs held.")
    committed_gpu_seconds: int = Field(description="Change of outstanding committed GPU-seconds.")
    gpu_seconds: int = Field(description="Billing-weighted charge (+) or credit (-) against the budget.")
    billing_weight: float
    actor: str
    reason: str
    data: dict[str, Any] | None = None


class LedgerPage(BaseModel):
    items: list[LedgerEntryOut]
    next_cursor: str | None


class UsageRow(BaseModel):
    account: str
    pool: str | None = Field(description="null for admin credits/debits not tied to a pool")
    period: str = Field(examples=["2026-11"])
    jobs: int
    usage_gpu_seconds: int
    adjustment_gpu_seconds: int
    net_gpu_seconds: int
    net_gpu_hours: float


class UsageReport(BaseModel):
    since: str
    until: str
    period: UsagePeriod
    items: list[UsageRow]


class FairShareTable(BaseModel):
    at: datetime
    half_life_s: int
    items: list[FairShareOut]


class BillingWeightIn(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"weight": 2.0}]})

    weight: float = Field(gt=0, le=1000)


class BillingWeightOut(BaseModel):
    pool: str
    gpu_type: str
    weight: float


AdminAccountOut.model_rebuild()


class OrphanOut(BaseModel):
    """A backend job that carries a gateway id the registry does not know (or a backend
    that could not be listed: then only ``backend`` and ``error`` are set)."""

    backend: str
    backend_job_id: str | None = None
    gateway_job_id: str | None = None
    state: str | None = None
    error: str | None = None
