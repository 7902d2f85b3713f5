"""Identity on the wire: what the gateway made of a caller's token."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class MyAccount(BaseModel):
    name: str
    role: Literal["member", "admin"] = Field(
        description="member: from the token's groups/roles; admin: not in the token, usable through the admin role")
    exists: bool = Field(description="false: the token names it but this gateway has no such account yet")


class MeOut(BaseModel):
    subject: str = Field(description="the token's stable id (sub, or the service's client id)")
    user: str = Field(description="the POSIX user jobs run as on Slurm ('' for a service without one)")
    kind: Literal["user", "service"]
    admin: bool
    roles: list[str]
    accounts: list[MyAccount] = Field(description="accounts this caller may charge and see")
    issuer: str = Field(description="the token's issuer (iss) that validated it")
