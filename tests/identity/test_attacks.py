"""Forged and broken tokens: each is a 401 invalid_token with no side effect.

Against the real provider's issuer (tokens it issued, altered; tokens we forge with
our own keys) and, for the time claims and required claims that only a signer can set,
against a second app trusting our own local key as an issuer.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time

import pytest
from cryptography.hazmat.primitives import serialization
from joserfc.jwk import RSAKey

from tests.identity.conftest import (
    LOCAL_ISSUER,
    LocalSigner,
    b64,
    b64json,
    bearer,
    job_count,
    segments,
    submit,
)


def assert_refused(client, token: str, reason: str | None = None) -> None:
    before = job_count(client)
    r = submit(client, token, "team-a")
    assert r.status_code == 401, r.text
    assert r.headers["www-authenticate"].startswith('Bearer error="invalid_token"'), r.headers
    assert r.headers["content-type"].startswith("application/problem+json")
    body = r.text
    assert token not in body and token[:40] not in body and token[-40:] not in body
    assert "Traceback" not in body and "File \"" not in body
    if reason:
        assert r.json()["detail"].split(":")[0] == reason, r.json()
    assert job_count(client) == before
    # the same token cannot read either
    assert client.get("/v1/jobs", headers=bearer(token)).status_code == 401


def _provider_public_pem(provider) -> bytes:
    key = next(k for k in provider.jwks()["keys"] if k.get("use") == "sig" and k["alg"] == "RS256")
    rsa = RSAKey.import_key({k: key[k] for k in ("kty", "n", "e")})
    return rsa.public_key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def _forge_hs256(header: dict, payload: dict, secret: bytes) -> str:
    signing_input = f"{b64json(header)}.{b64json(payload)}"
    sig = hmac.new(secret, signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{b64(sig)}"


def _attacks(provider) -> dict[str, tuple[str, str | None]]:
    real = provider.password("alice")
    header, payload, sig = segments(real)
    h64, p64, _ = real.split(".")
    mine = LocalSigner(kid=header["kid"])  # same kid as the provider's key, our own private key
    stranger = LocalSigner(kid="bogus-kid")
    more_groups = {**payload, "groups": ["team-a", "team-b", "isthmus-admins"]}
    flipped = sig[:-6] + ("AAAAAA" if not sig.endswith("AAAAAA") else "BBBBBB")
    return {
        "alg none": (f"{b64json({**header, 'alg': 'none'})}.{p64}.", "algorithm not allowed"),
        "alg none, signature kept": (f"{b64json({**header, 'alg': 'none'})}.{p64}.{sig}", "algorithm not allowed"),
        "HS256 signed with the provider's public key": (
            _forge_hs256({**header, "alg": "HS256"}, more_groups, _provider_public_pem(provider)),
            "algorithm not allowed"),
        "unknown kid": (stranger.sign(payload, kid="bogus-kid"), "unknown key id"),
        "provider's kid, our key": (mine.sign(more_groups), "bad signature"),
        "wrong issuer": (stranger.sign({**payload, "iss": "https://evil.example/realms/isthmus"}),
                         "untrusted issuer"),
        "tampered payload": (f"{h64}.{b64json(more_groups)}.{sig}", "bad signature"),
        "tampered signature": (f"{h64}.{p64}.{flipped}", "bad signature"),
        "signature of another token": (f"{h64}.{p64}.{segments(provider.password('bob'))[2]}", "bad signature"),
        "malformed header": (f"eyJhbGciOi.{p64}.{sig}", "malformed token"),
        "header not an object": (f"{b64json(['RS256'])}.{p64}.{sig}", "malformed token"),
        "two segments": (f"{h64}.{p64}", "malformed token"),
        "not base64": ("!!!.###.$$$", "malformed token"),
        "oversized": (f"{h64}.{b64json({**payload, 'pad': 'x' * 20000})}.{sig}", "token too large"),
        "kid not a string": (f"{b64json({**header, 'kid': 7})}.{p64}.{sig}", "malformed token"),
    }


ATTACKS = ["alg none", "alg none, signature kept", "HS256 signed with the provider's public key", "unknown kid",
           "provider's kid, our key", "wrong issuer", "tampered payload", "tampered signature",
           "signature of another token", "malformed header", "header not an object", "two segments",
           "not base64", "oversized", "kid not a string"]


@pytest.mark.oidc
@pytest.mark.parametrize("attack", ATTACKS)
def test_forged_or_broken_provider_token_is_refused(oidc_client, provider, attack):
    token, reason = _attacks(provider)[attack]
    assert_refused(oidc_client, token, reason)
    # and the genuine article still works
    assert submit(oidc_client, provider.password("alice")).status_code == 202


@pytest.mark.oidc
def test_non_bearer_schemes_and_empty_tokens_are_refused(oidc_client, provider):
    token = provider.password("alice")
    before = job_count(oidc_client)
    for headers in ({"Authorization": f"Basic {base64.b64encode(b'alice:x').decode()}"},
                    {"Authorization": "Bearer "}, {"Authorization": token}):
        r = oidc_client.post("/v1/jobs", json={}, headers=headers)
        assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
    assert job_count(oidc_client) == before


# ---------------------------------------------------- claims only a signer can set

NOW = int(time.time())
LOCAL_CASES = {
    "expired": ({"exp": NOW - 60}, "token expired"),
    "expired within leeway is fine": ({"exp": NOW - 2}, None),
    "not yet valid": ({"nbf": NOW + 120}, "token not yet valid"),
    "issued in the future": ({"iat": NOW + 120}, "token issued in the future"),
    "missing sub": ({"sub": None}, "missing claim sub"),
    "missing exp": ({"exp": None}, "missing claim exp"),
    "missing iat": ({"iat": None}, "missing claim iat"),
    "missing aud": ({"aud": None}, "missing claim aud"),
    "missing configured required claim": ({"preferred_username": None}, "missing claim preferred_username"),
    "wrong audience": ({"aud": ["account", "other"]}, "wrong audience"),
    "exp not a number": ({"exp": "tomorrow"}, "invalid claim exp"),
    "iat not a number": ({"iat": "now"}, "invalid claim iat"),
    "username not a POSIX name": ({"preferred_username": "Alice Smith"}, None),
}


@pytest.mark.parametrize("case", list(LOCAL_CASES))
def test_time_and_required_claims_with_a_local_issuer(local_client, local_signer, case):
    over, reason = LOCAL_CASES[case]
    now = int(time.time())
    claims = local_signer.claims(**{k: (v - NOW + now if isinstance(v, int) else v) for k, v in over.items()})
    token = local_signer.sign(claims)
    if case == "expired within leeway is fine":
        assert submit(local_client, token).status_code == 202
        return
    assert_refused(local_client, token, reason)


def test_local_issuer_sanity(local_client, local_signer):
    token = local_signer.sign(local_signer.claims())
    assert submit(local_client, token).status_code == 202
    assert submit(local_client, token, "team-b").status_code == 403
    # a key pair that is not the trusted one, same kid and issuer
    impostor = LocalSigner(kid=local_signer.kid)
    assert_refused(local_client, impostor.sign(impostor.claims()), "bad signature")
    # a JWKS with an HMAC ("oct") key is never used, even if someone publishes one
    assert json.dumps(local_signer.public_jwks()).count('"d"') == 0
    assert LOCAL_ISSUER in local_client.get("/readyz").json()["identity"]["forge"]["issuer"]
