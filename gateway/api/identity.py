"""HTTP only: /v1/me — what the gateway made of the caller's token."""

from __future__ import annotations

from fastapi import APIRouter

from gateway.accounts import service as accounts_service
from gateway.identity.dependency import CurrentPrincipal
from gateway.identity.schemas import MeOut, MyAccount
from gateway.kit.db import DbSession
from gateway.kit.errors import problem_responses

router = APIRouter(prefix="/v1", tags=["identity"])


@router.get("/me", response_model=MeOut, operation_id="whoami", summary="Who am I",
            description="The caller as the gateway sees it: user, POSIX user, accounts and how each is "
                        "granted, admin, the issuer. An admin also sees every account on the gateway, "
                        "marked `role: admin`.",
            responses=problem_responses(401))
def whoami(principal: CurrentPrincipal, session: DbSession) -> MeOut:
    known = accounts_service.names(session)
    accounts = [MyAccount(name=a, role="member", exists=a in known) for a in sorted(principal.accounts)]
    if principal.is_admin:
        accounts += [MyAccount(name=a, role="admin", exists=True) for a in sorted(known - principal.accounts)]
    return MeOut(subject=principal.subject, user=principal.username, kind=principal.kind, admin=principal.is_admin,
                 roles=sorted(principal.roles), accounts=accounts, issuer=principal.issuer)
