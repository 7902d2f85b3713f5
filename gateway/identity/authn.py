"""Bearer-token validation shared by every trusted issuer.

Each issuer supplies its keys through a ``KeySource`` (the dev issuer: a local key; an
OIDC provider: its JWKS, see ``oidc.py``). Validation is the same for all: size limit,
algorithm allow-list (asymmetric only), signature with a key chosen by ``kid``, then
``iss``, ``aud``, ``exp``, ``nbf``, ``iat`` with a small leeway and required claims.
"""

from __future__ import annotations

import base64
import json
import time
from typing import Any, Protocol

from authlib.jose import JsonWebToken
from authlib.jose.errors import JoseError

from gateway.identity.claims import ClaimsError, ClaimsMapping, principal_from_claims
from gateway.identity.principal import Principal

ALLOWED_ALGS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")
MAX_TOKEN_BYTES = 16 * 1024
REQUIRED_CLAIMS = ("iss", "sub", "aud", "exp", "iat")


class InvalidToken(Exception):
    """Short, safe reason; never contains the token."""


class KeySource(Protocol):
    def key_for(self, kid: str | None):
        """Return the public JWK for ``kid`` or raise InvalidToken('unknown key id')."""

    def status(self) -> dict[str, Any]:
        ...


class StaticKeySource:
    def __init__(self, keyset):
        self.keyset = keyset

    def key_for(self, kid: str | None):
        for key in self.keyset.keys:
            if kid is None or key.kid == kid:
                return key
        raise InvalidToken("unknown key id")

    def status(self) -> dict[str, Any]:
        return {"ok": True, "keys": len(self.keyset.keys)}


class TrustedIssuer:
    def __init__(self, *, issuer: str, audience: str | list[str], keys: KeySource,
                 mapping: ClaimsMapping | None = None, algorithms: tuple[str, ...] = ALLOWED_ALGS,
                 leeway_s: int = 30, label: str = ""):
        bad = [a for a in algorithms if a not in ALLOWED_ALGS]
        if bad:
            raise ValueError(f"algorithms not allowed (asymmetric only): {bad}")
        self.issuer = issuer
        self.audiences = [audience] if isinstance(audience, str) else list(audience)
        self.keys = keys
        self.mapping = mapping or ClaimsMapping()
        self.algorithms = algorithms
        self.leeway_s = leeway_s
        self.label = label or issuer


def _b64json(segment: str) -> dict[str, Any]:
    padded = segment + "=" * (-len(segment) % 4)
    value = json.loads(base64.urlsafe_b64decode(padded.encode("ascii")))
    if not isinstance(value, dict):
        raise ValueError("not an object")
    return value


class Authenticator:
    def __init__(self, issuers: list[TrustedIssuer]):
        self.issuers = {i.issuer: i for i in issuers}

    def authenticate(self, token: str) -> Principal:
        if len(token) > MAX_TOKEN_BYTES:
            raise InvalidToken("token too large")
        parts = token.split(".")
        if len(parts) != 3 or not all(parts[:2]):
            raise InvalidToken("malformed token")
        try:
            header = _b64json(parts[0])
            unverified = _b64json(parts[1])
        except (ValueError, UnicodeError):
            raise InvalidToken("malformed token") from None
        alg = header.get("alg")
        iss = unverified.get("iss")
        trusted = self.issuers.get(iss) if isinstance(iss, str) else None
        if trusted is None:
            raise InvalidToken("untrusted issuer")
        if alg not in trusted.algorithms:
            raise InvalidToken("algorithm not allowed")
        kid = header.get("kid")
        if kid is not None and not isinstance(kid, str):
            raise InvalidToken("malformed token")
        key = trusted.keys.key_for(kid)
        now = int(time.time())
        options = {
            "iss": {"essential": True, "value": trusted.issuer},
            "aud": {"essential": True, "values": trusted.audiences},
            "sub": {"essential": True},
            "exp": {"essential": True},
            "iat": {"essential": True},
        }
        try:
            claims = JsonWebToken(list(trusted.algorithms)).decode(token, key, claims_options=options)
            claims.validate(now=now, leeway=trusted.leeway_s)
        except JoseError as exc:
            raise InvalidToken(_reason(exc)) from None
        except (ValueError, TypeError):
            raise InvalidToken("malformed token") from None
        iat = claims.get("iat")
        if not isinstance(iat, (int, float)) or iat > now + trusted.leeway_s:
            raise InvalidToken("token issued in the future")
        for name in REQUIRED_CLAIMS:
            if name not in claims:
                raise InvalidToken(f"missing claim {name}")
        try:
            return principal_from_claims(dict(claims), trusted.mapping, issuer=trusted.issuer)
        except ClaimsError as exc:
            raise InvalidToken(str(exc)) from None

    def status(self) -> dict[str, Any]:
        return {i.label: i.keys.status() for i in self.issuers.values()}


def _reason(exc: JoseError) -> str:
    name = getattr(exc, "error", "") or type(exc).__name__
    return {
        "expired_token": "token expired",
        "invalid_token": "token not yet valid",
        "bad_signature": "bad signature",
        "invalid_claim": "invalid claim",
        "missing_claim": "missing claim",
        "unsupported_algorithm": "algorithm not allowed",
    }.get(name, "invalid token")
