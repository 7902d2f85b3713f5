"""Claims mapping: token claims -> Principal. Configurable per issuer (docs/identity.md)."""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, Field

_POSIX_USER = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
_ACCOUNT = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")


class ClaimsMapping(BaseModel):
    subject_claim: str = "sub"
    username_claim: str = "preferred_username"
    groups_claim: str = "groups"  # list of group names/paths, e.g. Keycloak "/isthmus/team-a"
    # A group becomes an account when it starts with this prefix ("" = every group);
    # the prefix is stripped: "/isthmus/team-a" -> "team-a".
    account_group_prefix: str = ""
    admin_groups: list[str] = Field(default_factory=lambda: ["isthmus-admins", "/isthmus-admins"])
    roles_claim: str | None = None  # optional dotted path, e.g. "realm_access.roles"
    admin_roles: list[str] = Field(default_factory=lambda: ["isthmus-admin"])
    # Client-credentials tokens: recognised by this claim being present (Keycloak puts
    # "client_id"/"azp"); such a caller is a service principal.
    service_claim: str = "client_id"
    service_accounts: dict[str, list[str]] = Field(
        default_factory=dict, description="service principal (client id) -> accounts")


def _dig(claims: dict[str, Any], path: str) -> Any:
    cur: Any = claims
    for part in path.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur


def _str_list(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, str)]
    return []


class ClaimsError(ValueError):
    """The token is valid but lacks what the mapping needs."""


def principal_from_claims(claims: dict[str, Any], mapping: ClaimsMapping, *, issuer: str):
    from gateway.identity.principal import Principal

    subject = claims.get(mapping.subject_claim)
    if not isinstance(subject, str) or not subject:
        raise ClaimsError(f"missing claim {mapping.subject_claim!r}")
    groups = _str_list(_dig(claims, mapping.groups_claim)) if mapping.groups_claim else []
    roles: set[str] = set()
    if any(g in mapping.admin_groups for g in groups):
        roles.add("admin")
    if mapping.roles_claim:
        if any(r in mapping.admin_roles for r in _str_list(_dig(claims, mapping.roles_claim))):
            roles.add("admin")

    accounts: set[str] = set()
    for g in groups:
        if mapping.account_group_prefix and not g.startswith(mapping.account_group_prefix):
            continue
        name = g[len(mapping.account_group_prefix):].strip("/")
        if _ACCOUNT.match(name):
            accounts.add(name)

    service_id = claims.get(mapping.service_claim) if mapping.service_claim else None
    username = claims.get(mapping.username_claim)
    if isinstance(service_id, str) and service_id and not claims.get("email"):
        accounts.update(mapping.service_accounts.get(service_id, []))
        # A service principal has no POSIX identity of its own unless one is mapped.
        uname = username if isinstance(username, str) and _POSIX_USER.match(username) else ""
        return Principal(subject=subject, username=uname, accounts=frozenset(accounts),
                         roles=frozenset(roles), kind="service", issuer=issuer)

    if not isinstance(username, str) or not _POSIX_USER.match(username):
        raise ClaimsError(f"claim {mapping.username_claim!r} is missing or not a valid POSIX user name")
    return Principal(subject=subject, username=username, accounts=frozenset(accounts),
                     roles=frozenset(roles), kind="user", issuer=issuer)
