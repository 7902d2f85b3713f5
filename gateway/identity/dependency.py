"""The one FastAPI dependency that tells every route who the caller is."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from gateway.identity.authn import InvalidToken
from gateway.identity.principal import Principal
from gateway.kit.errors import Forbidden, Unauthorized

PRINCIPAL_SCOPE_KEY = "isthmus.principal"  # set by gateway.identity.bodylimit.BodyLimitMiddleware
# (job id, attempt) of a job credential, set by the same middleware on the checkpoint call only.
JOB_CREDENTIAL_SCOPE_KEY = "isthmus.job_credential"

bearer = HTTPBearer(auto_error=False, description="OIDC access token (or a dev token in dev mode)")


async def get_principal(request: Request,
                        credentials: HTTPAuthorizationCredentials | None = Depends(bearer)) -> Principal:
    """The caller. Async so that the common case costs no hop to the thread pool (issue #32):
    a request with a body was authenticated by BodyLimitMiddleware before it was read, and the
    seen-accounts record writes only when due; a token validated before is taken from the
    authenticator's cache. Validating a new token (which may fetch the issuer's keys) and
    that write run in the thread pool."""
    principal = request.scope.get(PRINCIPAL_SCOPE_KEY)
    if principal is None and credentials is not None and credentials.scheme.lower() == "bearer":
        principal = request.app.state.authenticator.cached(credentials.credentials)
    if principal is None:
        principal = await run_in_threadpool(_authenticate, request, credentials)
    recorder = _recorder(request)
    if recorder is not None and recorder.due(principal):
        await run_in_threadpool(recorder.seen, principal)
    return principal


def _authenticate(request: Request, credentials: HTTPAuthorizationCredentials | None) -> Principal:
    if credentials is None or credentials.scheme.lower() != "bearer" or not credentials.credentials:
        raise Unauthorized("missing bearer token", error="")
    try:
        return request.app.state.authenticator.authenticate(credentials.credentials)
    except InvalidToken as exc:
        raise Unauthorized(str(exc)) from None


def note_seen(request: Request, principal: Principal) -> None:
    """Record the accounts this subject holds (throttled; gateway/identity/seen.py)."""
    recorder = _recorder(request)
    if recorder is not None:
        recorder.seen(principal)


def _recorder(request: Request):
    return getattr(request.app.state, "membership_seen", None)


async def require_admin(principal: Principal = Depends(get_principal)) -> Principal:
    if not principal.is_admin:
        raise Forbidden("this operation needs the admin role")
    return principal


CurrentPrincipal = Annotated[Principal, Depends(get_principal)]


async def get_principal_or_job(request: Request, credentials: HTTPAuthorizationCredentials | None = Depends(bearer)
                               ) -> Principal | tuple[str, int]:
    """The checkpoint call's caller: a job credential (job id, attempt) checked by the body
    middleware, else a principal as everywhere."""
    credential = request.scope.get(JOB_CREDENTIAL_SCOPE_KEY)
    if credential is not None:
        return credential
    return await get_principal(request, credentials)


PrincipalOrJob = Annotated[Principal | tuple[str, int], Depends(get_principal_or_job)]
AdminPrincipal = Annotated[Principal, Depends(require_admin)]
