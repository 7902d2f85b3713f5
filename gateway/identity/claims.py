"""Claims mapping: token claims -> Principal. Configurable per issuer (docs/identity.md).

* ``subject_claim`` (``sub``) -> ``Principal.subject``, the stable caller id;
* ``username_claim`` -> ``Principal.username``, the POSIX user jobs run as on Slurm;
* ``groups_claim`` and optionally ``roles_claim`` -> accounts and the admin role;
* client-credentials tokens (``service_claim`` present) -> a service principal whose
  accounts and POSIX user come from ``service_accounts`` / ``service_users``.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gateway.kit.names import ACCOUNT_NAME, POSIX_USER_RE

_POSIX_USER = re.compile(POSIX_USER_RE)
_ACCOUNT = ACCOUNT_NAME
# The sub claim: OIDC Core 5.1 caps it at 255 ASCII characters, as wide as the subject columns.
SUBJECT_MAX_LEN = 255


class ClaimsMapping(BaseModel):
    # A typo in a mapping would silently give nobody any account: refuse unknown fields.
    model_config = ConfigDict(extra="forbid")

    subject_claim: str = "sub"
    username_claim: str = "preferred_username"
    # When set, the username claim must end in "@<domain>" and the domain is stripped
    # ("alice@example.com" -> "alice"); usernames of other domains are refused.
    username_domain: str | None = None
    groups_claim: str | None = "groups"  # list of group names/paths, e.g. Keycloak "/isthmus/team-a"
    # A group becomes an account when it starts with this prefix ("" = every group);
    # the prefix is stripped: "/isthmus/team-a" -> "team-a".
    account_group_prefix: str = ""
    admin_groups: list[str] = Field(default_factory=lambda: ["isthmus-admins", "/isthmus-admins"])
    roles_claim: str | None = None  # optional dotted path, e.g. "realm_access.roles"
    admin_roles: list[str] = Field(default_factory=lambda: ["isthmus-admin"])
    # Roles starting with this prefix become accounts ("account:team-a" -> "team-a");
    # None: roles never grant accounts. Useful where groups are opaque ids (Entra ID).
    account_role_prefix: str | None = None
    # Client-credentials tokens: the claim carrying the client id. Its presence marks a
    # service principal (Keycloak "client_id", Okta "cid", Entra ID "azp"). None: never.
    service_claim: str | None = "client_id"
    # Claims only user tokens carry, for providers that put the client id in every token
    # (Okta "uid", Entra ID "scp"): when one is present the token is a user's.
    user_marker_claims: list[str] = Field(default_factory=list)
    service_accounts: dict[str, list[str]] = Field(
        default_factory=dict, description="service principal (client id) -> accounts")
    service_users: dict[str, str] = Field(
        default_factory=dict, description="service principal (client id) -> POSIX user its jobs run as")


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


def _accounts(names: list[str], prefix: str, exclude: list[str]) -> set[str]:
    out: set[str] = set()
    for name in names:
        if name in exclude or (prefix and not name.startswith(prefix)):
            continue
        account = name[len(prefix):].strip("/")
        if _ACCOUNT.fullmatch(account):
            out.add(account)
    return out


def principal_from_claims(claims: dict[str, Any], mapping: ClaimsMapping, *, issuer: str):
    """Map validated claims to a Principal.

    Raises:
        ClaimsError: the subject is missing, or a user token has no valid POSIX user name.
    """
    from gateway.identity.principal import Principal

    subject = claims.get(mapping.subject_claim)
    if not isinstance(subject, str) or not subject:
        raise ClaimsError(f"missing claim {mapping.subject_claim}")
    if len(subject) > SUBJECT_MAX_LEN:  # OIDC Core 5.1: at most 255 ASCII characters; the columns hold 255
        raise ClaimsError(f"claim {mapping.subject_claim} is longer than {SUBJECT_MAX_LEN} characters")
    groups = _str_list(_dig(claims, mapping.groups_claim)) if mapping.groups_claim else []
    roles_in_token = _str_list(_dig(claims, mapping.roles_claim)) if mapping.roles_claim else []
    roles: set[str] = set()
    if any(g in mapping.admin_groups for g in groups) or any(r in mapping.admin_roles for r in roles_in_token):
        roles.add("admin")

    accounts = _accounts(groups, mapping.account_group_prefix, mapping.admin_groups)
    if mapping.account_role_prefix is not None:
        accounts |= _accounts(roles_in_token, mapping.account_role_prefix, mapping.admin_roles)

    service_id = claims.get(mapping.service_claim) if mapping.service_claim else None
    is_user = any(claims.get(c) is not None for c in mapping.user_marker_claims)
    if isinstance(service_id, str) and service_id and not is_user:
        accounts.update(mapping.service_accounts.get(service_id, []))
        # A service principal runs jobs as a POSIX user only when one is mapped for it
        # explicitly; "service-account-ci-bot" is not a user on any cluster.
        uname = mapping.service_users.get(service_id, "")
        return Principal(subject=subject, username=uname, accounts=frozenset(accounts),
                         roles=frozenset(roles), kind="service", issuer=issuer)

    username = claims.get(mapping.username_claim)
    if isinstance(username, str) and mapping.username_domain:
        local, at, domain = username.rpartition("@")
        username = local if at and domain.lower() == mapping.username_domain.lower() else None
    if not isinstance(username, str) or not _POSIX_USER.fullmatch(username):
        raise ClaimsError(f"claim {mapping.username_claim} is missing or not a valid POSIX user name")
    return Principal(subject=subject, username=username, accounts=frozenset(accounts),
                     roles=frozenset(roles), kind="user", issuer=issuer)
