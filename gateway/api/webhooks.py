"""HTTP only: /v1/accounts/{account}/webhooks (an account's) and /v1/admin/webhooks (all accounts')."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Request, Response
from sqlalchemy.orm import Session

from gateway.accounts import service as accounts_service
from gateway.identity.dependency import get_principal, require_admin
from gateway.identity.principal import Principal
from gateway.kit.db import get_session
from gateway.kit.errors import NotFound, problem_responses
from gateway.kit.params import AccountName
from gateway.webhooks import service
from gateway.webhooks.address import Allowlist
from gateway.webhooks.schemas import (
    DeliveryPage,
    DeliveryStatus,
    WebhookCreated,
    WebhookIn,
    WebhookOut,
    WebhookPage,
    WebhookUpdate,
    delivery_out,
    endpoint_out,
)

account_router = APIRouter(prefix="/v1/accounts/{account}/webhooks", tags=["webhooks"])
admin_router = APIRouter(prefix="/v1/admin/webhooks", tags=["admin"], dependencies=[Depends(require_admin)])

EndpointId = Annotated[int, Path(ge=1, le=2**62, description="Webhook endpoint id.")]
Session_ = Annotated[Session, Depends(get_session, scope="function")]
Limit = Annotated[int, Query(ge=1, le=500, description="At most this many, newest first.")]
Status = Annotated[DeliveryStatus | None, Query(description="Only deliveries in this status.")]

CREATE_DOC = ("Registers an HTTPS endpoint for job state changes, signed with the Standard Webhooks scheme "
              "(docs/webhooks.md). The secret is in this response only. A URL whose host resolves to a "
              "loopback, link-local, private, unique-local, multicast or unspecified address is refused with "
              "a 422 naming `body.url`, unless an admin allowed it.")


def _allow(request: Request) -> Allowlist:
    return Allowlist.parse(request.app.state.settings.webhook_allowlist)


def _account_or_404(session: Session, principal: Principal, account: str) -> str:
    """The tenancy of job reads (gateway/jobs/repository.py ``readable_jobs``): the token's
    accounts, or any for an admin. A coordinator of a parent account does not read its
    children's jobs, so it does not register, see or manage their webhooks either."""
    if not principal.may_use(account) or not accounts_service.exists(session, account):
        raise NotFound(f"no account {account!r} visible to you")
    return account


def _page(session: Session, account: str | None) -> WebhookPage:
    eps = service.list_(session, account=account)
    pending = service.pending_counts(session, [e.id for e in eps])
    return WebhookPage(items=[endpoint_out(e, pending.get(e.id, 0)) for e in eps])


def _one(session: Session, account: str | None, endpoint_id: int) -> WebhookOut:
    ep = service.get_or_raise(session, account=account, endpoint_id=endpoint_id)
    return endpoint_out(ep, service.pending_counts(session, [ep.id]).get(ep.id, 0))


def _patch(session: Session, account: str | None, endpoint_id: int, body: WebhookUpdate, caller: Principal
           ) -> WebhookOut:
    ep = service.get_or_raise(session, account=account, endpoint_id=endpoint_id, for_update=True)
    service.update_(session, endpoint=ep, enabled=body.enabled, description=body.description, by=caller.who)
    return endpoint_out(ep, service.pending_counts(session, [ep.id]).get(ep.id, 0))


def _deliveries(session: Session, account: str | None, endpoint_id: int, status: DeliveryStatus | None,
                limit: int) -> DeliveryPage:
    ep = service.get_or_raise(session, account=account, endpoint_id=endpoint_id)
    return DeliveryPage(items=[delivery_out(d) for d in service.deliveries(
        session, endpoint_id=ep.id, status=status.value if status else None, limit=limit)])


# --- an account's endpoints (its members and coordinators; admins) ---------------------

@account_router.post("", status_code=201, response_model=WebhookCreated, operation_id="createWebhook",
                     summary="Register a webhook endpoint for an account's job events",
                     description=CREATE_DOC + " An account may have `ISTHMUS_WEBHOOK_MAX_ENDPOINTS_PER_ACCOUNT` "
                     "endpoints (10 by default); beyond that a 429 names the limit.",
                     responses=problem_responses(401, 404, 422, 429))
def create_webhook(account: AccountName, body: WebhookIn, request: Request, session: Session_,
                   principal: Principal = Depends(get_principal)) -> WebhookCreated:
    _account_or_404(session, principal, account)
    ep = service.create(session, account=account, url=body.url, description=body.description,
                        by=principal.who, allow=_allow(request),
                        max_per_account=request.app.state.settings.webhook_max_endpoints_per_account)
    return endpoint_out(ep, secret=True)


@account_router.get("", response_model=WebhookPage, operation_id="listWebhooks",
                    summary="List an account's webhook endpoints",
                    description="With each endpoint's status: enabled, failures in a row and the last error.",
                    responses=problem_responses(401, 404, 422))
def list_webhooks(account: AccountName, session: Session_, principal: Principal = Depends(get_principal)
                  ) -> WebhookPage:
    return _page(session, _account_or_404(session, principal, account))


@account_router.get("/{endpoint_id}", response_model=WebhookOut, operation_id="getWebhook",
                    summary="One webhook endpoint", responses=problem_responses(401, 404, 422))
def get_webhook(account: AccountName, endpoint_id: EndpointId, session: Session_,
                principal: Principal = Depends(get_principal)) -> WebhookOut:
    return _one(session, _account_or_404(session, principal, account), endpoint_id)


@account_router.patch("/{endpoint_id}", response_model=WebhookOut, operation_id="updateWebhook",
                      summary="Re-enable, disable or describe a webhook endpoint",
                      description="Re-enabling (also a suspended endpoint) makes the caller the endpoint's "
                                  "holder: it lives while the caller holds the account (docs/webhooks.md).",
                      responses=problem_responses(401, 404, 422))
def update_webhook(account: AccountName, endpoint_id: EndpointId, body: WebhookUpdate, session: Session_,
                   principal: Principal = Depends(get_principal)) -> WebhookOut:
    return _patch(session, _account_or_404(session, principal, account), endpoint_id, body, principal)


@account_router.delete("/{endpoint_id}", status_code=204, operation_id="deleteWebhook",
                       summary="Delete a webhook endpoint and its undelivered deliveries",
                       responses=problem_responses(401, 404, 422))
def delete_webhook(account: AccountName, endpoint_id: EndpointId, session: Session_,
                   principal: Principal = Depends(get_principal)) -> Response:
    ep = service.get_or_raise(session, account=_account_or_404(session, principal, account),
                              endpoint_id=endpoint_id, for_update=True)
    service.delete(session, endpoint=ep, by=principal.who)
    return Response(status_code=204)


@account_router.get("/{endpoint_id}/deliveries", response_model=DeliveryPage, operation_id="listWebhookDeliveries",
                    summary="Deliveries to a webhook endpoint, newest first",
                    responses=problem_responses(401, 404, 422))
def list_deliveries(account: AccountName, endpoint_id: EndpointId, session: Session_, status: Status = None,
                    limit: Limit = 100, principal: Principal = Depends(get_principal)) -> DeliveryPage:
    return _deliveries(session, _account_or_404(session, principal, account), endpoint_id, status, limit)


# --- admin endpoints: every account's job events ---------------------------------------

@admin_router.post("", status_code=201, response_model=WebhookCreated, operation_id="adminCreateWebhook",
                   summary="Register a webhook endpoint for every account's job events", description=CREATE_DOC,
                   responses=problem_responses(401, 403, 422))
def admin_create_webhook(body: WebhookIn, request: Request, session: Session_,
                         principal: Principal = Depends(get_principal)) -> WebhookCreated:
    ep = service.create(session, account=None, url=body.url, description=body.description,
                        by=principal.who, allow=_allow(request), max_per_account=0)
    return endpoint_out(ep, secret=True)


@admin_router.get("", response_model=WebhookPage, operation_id="adminListWebhooks",
                  summary="List the admin (all-accounts) webhook endpoints", responses=problem_responses(401, 403))
def admin_list_webhooks(session: Session_) -> WebhookPage:
    return _page(session, None)


@admin_router.get("/{endpoint_id}", response_model=WebhookOut, operation_id="adminGetWebhook",
                  summary="One admin webhook endpoint", responses=problem_responses(401, 403, 404, 422))
def admin_get_webhook(endpoint_id: EndpointId, session: Session_) -> WebhookOut:
    return _one(session, None, endpoint_id)


@admin_router.patch("/{endpoint_id}", response_model=WebhookOut, operation_id="adminUpdateWebhook",
                    summary="Re-enable, disable or describe an admin webhook endpoint",
                    responses=problem_responses(401, 403, 404, 422))
def admin_update_webhook(endpoint_id: EndpointId, body: WebhookUpdate, session: Session_,
                         principal: Principal = Depends(get_principal)) -> WebhookOut:
    return _patch(session, None, endpoint_id, body, principal)


@admin_router.delete("/{endpoint_id}", status_code=204, operation_id="adminDeleteWebhook",
                     summary="Delete an admin webhook endpoint", responses=problem_responses(401, 403, 404, 422))
def admin_delete_webhook(endpoint_id: EndpointId, session: Session_,
                         principal: Principal = Depends(get_principal)) -> Response:
    service.delete(session, endpoint=service.get_or_raise(session, account=None, endpoint_id=endpoint_id,
                                                           for_update=True), by=principal.who)
    return Response(status_code=204)


@admin_router.get("/{endpoint_id}/deliveries", response_model=DeliveryPage,
                  operation_id="adminListWebhookDeliveries", summary="Deliveries to an admin webhook endpoint",
                  responses=problem_responses(401, 403, 404, 422))
def admin_list_deliveries(endpoint_id: EndpointId, session: Session_, status: Status = None,
                          limit: Limit = 100) -> DeliveryPage:
    return _deliveries(session, None, endpoint_id, status, limit)
