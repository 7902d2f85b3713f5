"""HTTP only: /v1/accounts — a caller's own accounts, their usage and fair share."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from sqlalchemy.orm import Session

from gateway.accounts import service
from gateway.accounts.schemas import (
    AccountOut,
    AccountPage,
    AccountUsageOut,
    BalanceOut,
    EffectiveBudgetOut,
    EffectiveLimitOut,
    FairShareOut,
    QuotaOut,
)
from gateway.domain.fairshare import FairShare
from gateway.identity.dependency import get_principal
from gateway.identity.principal import Principal
from gateway.kit.db import get_session
from gateway.kit.errors import NotFound, problem_responses
from gateway.kit.params import AccountName
from gateway.kit.timeutil import as_utc
from gateway.ledger.decayed import Ledger

router = APIRouter(prefix="/v1/accounts", tags=["accounts"])

USAGE_EXAMPLE = {
    "account": "team-a", "period": "2026-11", "used_gpu_hours": 812.5, "committed_gpu_hours": 256.0,
    "remaining_gpu_hours": 931.5,
    "balance": {"reserved_gpus": 24, "reserved_gpus_per_pool": {"slurm-h100": 16, "kube-a100": 8},
                "reserved_gpus_slurm": 0, "reserved_gpus_kubernetes": 0,
                "committed_gpu_hours": 256.0, "queued_jobs": 1},
    "quota": {"max_gpus": {"value": 32, "source": "team-a"},
              "max_gpus_per_pool": {"slurm-h100": {"value": 16, "source": "org"}},
              "max_gpus_slurm": {"value": None, "source": None},
              "max_gpus_kubernetes": {"value": None, "source": None},
              "budget_gpu_hours": {"value": 2000, "source": "org"}, "budget_period": "month",
              "budget_window_days": 30, "max_queued_jobs": {"value": None, "source": None},
              "max_queued_jobs_per_user": {"value": 10, "source": "org"}},
    "fairshare": {"account": "team-a", "parent": "org", "shares": 1, "level_shares": 2, "norm_shares": 0.375,
                  "raw_usage_gpu_hours": 70.0, "norm_usage": 0.875, "effective_usage": 0.875, "factor": 0.198},
}


def fairshare_out(fs: FairShare) -> FairShareOut:
    return FairShareOut(account=fs.account, parent=fs.parent, shares=fs.shares, level_shares=fs.level_shares,
                        norm_shares=fs.norm_shares, raw_usage_gpu_hours=fs.raw_usage / 3600,
                        norm_usage=fs.norm_usage, effective_usage=fs.effective_usage, factor=fs.factor)


def quota_out(eff: dict) -> QuotaOut:
    def lim(key: str) -> EffectiveLimitOut:
        v = eff[key]
        return EffectiveLimitOut(value=v.value, source=v.source)

    budget = eff["budget_gpu_seconds"]
    per_pool = {p: EffectiveLimitOut(value=v.value, source=v.source) for p, v in eff["max_gpus_per_pool"].items()}
    guaranteed = {p: EffectiveLimitOut(value=v.value, source=v.source)
                  for p, v in eff["guaranteed_gpus_per_pool"].items()}
    none = EffectiveLimitOut(value=None, source=None)
    return QuotaOut(max_gpus=lim("max_gpus"), max_gpus_per_pool=per_pool, guaranteed_gpus=lim("guaranteed_gpus"),
                    guaranteed_gpus_per_pool=guaranteed,
                    max_gpus_slurm=per_pool.get("slurm", none), max_gpus_kubernetes=per_pool.get("kubernetes", none),
                    budget_gpu_hours=EffectiveBudgetOut(
                        value=None if budget.value is None else budget.value / 3600, source=budget.source),
                    budget_period=eff["budget_period"], budget_window_days=eff["budget_window_days"],
                    max_queued_jobs=lim("max_queued_jobs"), max_queued_jobs_per_user=lim("max_queued_jobs_per_user"))


def usage_out(session: Session, name: AccountName, ledger: Ledger) -> AccountUsageOut:
    u = ledger.account_usage(session, account=name)
    b = u["balance"]
    def hours(v):
        return (None if v is None else round(v / 3600, 3))
    return AccountUsageOut(
        account=name, period=u["period"], used_gpu_hours=hours(u["used_gpu_seconds"]),
        committed_gpu_hours=hours(b.committed_gpu_seconds), remaining_gpu_hours=hours(u["remaining_gpu_seconds"]),
        balance=BalanceOut(reserved_gpus=b.reserved_gpus, reserved_gpus_per_pool=u["pools"],
                           reserved_gpus_slurm=u["pools"].get("slurm", 0),
                           reserved_gpus_kubernetes=u["pools"].get("kubernetes", 0),
                           committed_gpu_hours=hours(b.committed_gpu_seconds), queued_jobs=b.queued_jobs),
        quota=quota_out(u["effective"]), fairshare=fairshare_out(u["fairshare"]) if u["fairshare"] else None)


@router.get("", response_model=AccountPage, operation_id="listMyAccounts", summary="List your accounts",
            description="The accounts in your token's groups (plus the subtrees of accounts you coordinate); "
                        "all accounts for admins. Each with its current fair-share factor.",
            responses=problem_responses(401))
def list_accounts(request: Request, principal: Principal = Depends(get_principal),
                  session: Session = Depends(get_session, scope="function")) -> AccountPage:
    names = service.visible_accounts(session, accounts=principal.accounts, username=principal.username,
                                     is_admin=principal.is_admin)
    tree = service.load_tree(session)
    fs = request.app.state.ledger.fairshare(session)
    return AccountPage(items=[AccountOut(name=n, parent=tree[n].parent_name, shares=tree[n].shares,
                                         description=tree[n].description or "",
                                         fairshare_factor=fs[n].factor if n in fs else None,
                                         created_at=as_utc(tree[n].created_at)) for n in names])


@router.get("/{name}/usage", response_model=AccountUsageOut, operation_id="getAccountUsage",
            summary="Usage, remaining budget and fair share of an account",
            description="What the account has used in its budget period, what running and queued jobs have "
                        "committed, what remains, the effective (possibly inherited) quotas and the fair-share "
                        "factor with its inputs. Accounts you may not see are reported as not found.",
            responses={200: {"content": {"application/json": {"example": USAGE_EXAMPLE}}},
                       **problem_responses(401, 404, 422)})
def account_usage(name: AccountName, request: Request, principal: Principal = Depends(get_principal),
                  session: Session = Depends(get_session, scope="function")) -> AccountUsageOut:
    visible = service.visible_accounts(session, accounts=principal.accounts, username=principal.username,
                                       is_admin=principal.is_admin)
    if name not in visible:
        raise NotFound(f"no account {name!r} visible to you")
    return usage_out(session, name, request.app.state.ledger)
