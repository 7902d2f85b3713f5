"""Webhook endpoints and deliveries on the wire."""

from __future__ import annotations

import enum
import json
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gateway.kit.timeutil import as_utc
from gateway.models.webhooks import WebhookDelivery, WebhookEndpoint


class DeliveryStatus(str, enum.Enum):
    """`pending`: not yet acknowledged (due at `next_attempt_at`); `delivered`: a 2xx came back."""

    PENDING = "pending"
    DELIVERED = "delivered"


class WebhookIn(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"url": "https://hooks.example.org/isthmus", "description": "team-a chat bot"}]})

    url: str = Field(min_length=1, max_length=2048,
                     description="An https:// URL whose host resolves to public addresses only.")
    description: str = Field(default="", max_length=500)


class WebhookUpdate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool | None = Field(default=None, description="`true` re-enables a disabled endpoint: its failure "
                                                           "count is reset and its waiting deliveries go out now.")
    description: str | None = Field(default=None, max_length=500)


class WebhookOut(BaseModel):
    id: int
    account: str | None = Field(description="The account whose job events it receives; null: all accounts "
                                            "(an admin endpoint).")
    url: str
    description: str
    enabled: bool
    consecutive_failures: int = Field(description="Failed attempts since the last success.")
    last_error: str = Field(description="The last failed attempt's error (empty if none).")
    last_error_at: datetime | None
    last_success_at: datetime | None
    disabled_at: datetime | None
    disabled_reason: str = Field(description="Why it is disabled (empty while enabled).")
    pending_deliveries: int = Field(description="Deliveries not yet acknowledged by the receiver.")
    created_at: datetime
    created_by: str
    held_by: str = Field(description="The subject whose hold on the account keeps the endpoint alive: its creator "
                                     "or whoever re-enabled it last. When they no longer hold the account the "
                                     "endpoint is suspended (`enabled` false, `disabled_reason` says why).")


class WebhookCreated(WebhookOut):
    secret: str = Field(description="The signing secret (`whsec_` + base64). Shown only in this response: "
                                    "store it now.")


class WebhookPage(BaseModel):
    items: list[WebhookOut]


class DeliveryOut(BaseModel):
    id: int
    msg_id: str = Field(description="The `webhook-id` header; the same on every retry (dedupe on it).")
    event_id: int
    type: str
    job_id: str
    status: DeliveryStatus
    attempts: int
    next_attempt_at: datetime | None = Field(description="When it is tried next (null once delivered).")
    last_attempt_at: datetime | None
    last_status_code: int | None
    last_error: str
    delivered_at: datetime | None
    created_at: datetime
    payload: dict[str, Any] = Field(description="The body sent.")


class DeliveryPage(BaseModel):
    items: list[DeliveryOut]


def endpoint_out(ep: WebhookEndpoint, pending: int = 0, *, secret: bool = False) -> WebhookOut:
    fields = dict(id=ep.id, account=ep.account_name, url=ep.url, description=ep.description or "",
                  enabled=ep.enabled, consecutive_failures=ep.consecutive_failures, last_error=ep.last_error or "",
                  last_error_at=as_utc(ep.last_error_at), last_success_at=as_utc(ep.last_success_at),
                  disabled_at=as_utc(ep.disabled_at), disabled_reason=ep.disabled_reason or "",
                  pending_deliveries=pending, created_at=as_utc(ep.created_at), created_by=ep.created_by,
                  held_by=ep.held_by)
    return WebhookCreated(**fields, secret=ep.secret) if secret else WebhookOut(**fields)


def delivery_out(d: WebhookDelivery) -> DeliveryOut:
    return DeliveryOut(id=d.id, msg_id=d.msg_id, event_id=d.event_id, type=d.event_type, job_id=d.job_id,
                       status=DeliveryStatus(d.status), attempts=d.attempts,
                       next_attempt_at=None if d.status == "delivered" else as_utc(d.next_attempt_at),
                       last_attempt_at=as_utc(d.last_attempt_at), last_status_code=d.last_status_code,
                       last_error=d.last_error or "", delivered_at=as_utc(d.delivered_at),
                       created_at=as_utc(d.created_at), payload=json.loads(d.payload))
