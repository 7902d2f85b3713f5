"""Claims mapping (no provider needed): what a site configures is what a caller gets."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gateway.identity.claims import ClaimsError, ClaimsMapping, principal_from_claims

ISS = "https://idp.example/realms/x"


def principal(claims, **mapping):
    return principal_from_claims({"sub": "u-1", **claims}, ClaimsMapping(**mapping), issuer=ISS)


def test_keycloak_defaults_groups_become_accounts_admin_group_is_a_role():
    p = principal({"preferred_username": "carol", "groups": ["team-a", "team-b", "isthmus-admins", "Not An Account"]})
    assert p.username == "carol" and p.kind == "user" and p.issuer == ISS and p.subject == "u-1"
    assert p.accounts == {"team-a", "team-b"}  # the admin group is a role, not an account
    assert p.is_admin and p.may_use("anything")


def test_group_prefix_selects_and_strips_full_paths():
    p = principal({"preferred_username": "alice", "groups": ["/isthmus/team-a", "/other/team-b", "/isthmus/x/y"]},
                  account_group_prefix="/isthmus/")
    assert p.accounts == {"team-a"}
    assert not p.is_admin


def test_roles_claim_grants_admin_and_accounts():
    claims = {"preferred_username": "alice", "realm_access": {"roles": ["isthmus-admin", "account:team-b", "x"]}}
    p = principal(claims, roles_claim="realm_access.roles", account_role_prefix="account:", groups_claim=None)
    assert p.is_admin and p.accounts == {"team-b"}
    p = principal(claims, roles_claim="realm_access.roles")  # roles never grant accounts unless asked
    assert p.accounts == frozenset()


def test_username_domain_is_checked_and_stripped():
    p = principal({"preferred_username": "alice@Example.com"}, username_domain="example.com")
    assert p.username == "alice"
    with pytest.raises(ClaimsError):
        principal({"preferred_username": "alice@evil.example"}, username_domain="example.com")
    with pytest.raises(ClaimsError):
        principal({"preferred_username": "alice@example.com"})  # not a POSIX name without the mapping


@pytest.mark.parametrize("username", [None, "", "Alice", "root user", "a" * 33, "-x", 7])
def test_user_tokens_need_a_posix_user_name(username):
    with pytest.raises(ClaimsError):
        principal({"preferred_username": username})


def test_client_credentials_token_is_a_service_principal_with_its_own_accounts():
    claims = {"client_id": "ci-bot", "preferred_username": "service-account-ci-bot", "groups": ["team-b"]}
    p = principal(claims, service_accounts={"ci-bot": ["team-a"]}, service_users={"ci-bot": "cibot"})
    assert p.kind == "service" and p.accounts == {"team-a", "team-b"} and p.username == "cibot"
    unmapped = principal(claims)
    assert unmapped.kind == "service" and unmapped.username == ""  # cannot run jobs as anyone


def test_user_marker_claims_tell_users_from_services_when_every_token_has_a_client_id():
    okta_user = {"cid": "0oa1", "uid": "00u1", "preferred_username": "alice", "groups": ["team-a"]}
    okta_app = {"cid": "0oa1", "sub": "0oa1"}
    mapping = {"service_claim": "cid", "user_marker_claims": ["uid"], "service_accounts": {"0oa1": ["team-b"]}}
    assert principal(okta_user, **mapping).kind == "user"
    app = principal(okta_app, **mapping)
    assert app.kind == "service" and app.accounts == {"team-b"}


def test_missing_subject_is_refused():
    with pytest.raises(ClaimsError, match="missing claim sub"):
        principal_from_claims({"preferred_username": "alice"}, ClaimsMapping(), issuer=ISS)


def test_unknown_mapping_fields_are_refused():
    with pytest.raises(ValidationError):
        ClaimsMapping(group_claim="groups")  # typo of groups_claim


def test_a_subject_longer_than_oidc_allows_is_refused():
    # OIDC Core caps sub at 255 characters and every subject column is that wide: a longer one
    # must be a clean refusal, not a database error at the first write (issue #28).
    assert principal({"sub": "s" * 255, "preferred_username": "alice"}).subject == "s" * 255
    with pytest.raises(ClaimsError, match="longer than 255"):
        principal({"sub": "s" * 256, "preferred_username": "alice"})
