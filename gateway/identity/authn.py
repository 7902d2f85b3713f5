"""Bearer-token validation shared by every trusted issuer.

Each issuer supplies its keys through a ``KeySource`` (the dev issuer: a local key; an
OIDC provider: its JWKS, see ``oidc.py``). Validation is the same for all, in this
order, and stops at the first failure:

1. size (``MAX_TOKEN_BYTES``) and shape: three base64url segments, JSON objects, ASCII;
2. ``iss`` (unverified) selects a trusted issuer; unknown issuers are refused;
3. ``alg`` must be in that issuer's allow-list, which only ever holds asymmetric
   algorithms: ``none`` and HMAC are refused before any key is looked at, so a token
   "signed" with the provider's public key as an HMAC secret never reaches a verifier;
4. the key is chosen by ``kid`` from the issuer's key source and must be of the
   algorithm's key type (and match the key's own ``alg`` if it declares one);
5. signature, then ``iss``, ``aud``, ``exp``, ``nbf``, ``iat`` with the issuer's leeway,
   and the required claims;
6. the claims mapping turns the claims into a ``Principal``.

Reasons in ``InvalidToken`` are short fixed strings: they end up in the 401 response
and never contain the token or anything taken from it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import time
from typing import Any, Protocol

from joserfc import jws, jwt
from joserfc.errors import (
    BadSignatureError,
    ExpiredTokenError,
    InvalidClaimError,
    JoseError,
    MissingClaimError,
)
from joserfc.jwk import ECKey, OKPKey, RSAKey

from gateway.identity.claims import ClaimsError, ClaimsMapping, principal_from_claims
from gateway.identity.principal import Principal

ALLOWED_ALGS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")
# Access tokens of the common providers are 1-4 KiB; Entra ID with many groups ~6 KiB.
MAX_TOKEN_BYTES = 16 * 1024
REQUIRED_CLAIMS = ("iss", "sub", "aud", "exp", "iat")
# Keycloak marks its tokens with a "typ" claim. An ID token is addressed to the client
# that logged the user in ("aud": "isthmus" when the CLI's client id is isthmus), so
# without this check it would pass for an access token.
NOT_ACCESS_TOKEN_TYPES = frozenset({"ID", "Refresh", "Offline", "Logout"})

# joserfc only verifies with algorithms named in the registry; restricting it to the
# asymmetric ones is a second, independent guard behind the per-issuer allow-list.
_JWS_REGISTRY = jws.JWSRegistry(algorithms=list(ALLOWED_ALGS))
_KEY_TYPE_FOR_ALG = {**{a: RSAKey for a in ALLOWED_ALGS if a[:2] in ("RS", "PS")},
                     **{a: ECKey for a in ALLOWED_ALGS if a.startswith("ES")}, "EdDSA": OKPKey}


class InvalidToken(Exception):
    """Short, safe reason; never contains the token."""


class KeySource(Protocol):
    def key_for(self, kid: str | None):
        """Return the public joserfc key for ``kid``.

        Raises:
            InvalidToken: 'unknown key id', or 'keys unavailable' when none could be loaded.
        """

    def status(self) -> dict[str, Any]:
        """``{"ok": bool, ...}`` for /readyz."""

    # Bumped whenever the set of keys changes: a validated token remembered under an older
    # generation is validated again (a key the provider withdrew stops working at once).
    generation: int

    def tick(self) -> None:
        """Start whatever upkeep is due (a scheduled refresh) without waiting for it."""


class StaticKeySource:
    """A fixed set of public keys (the dev issuer; tests)."""

    generation = 0

    def __init__(self, keyset):
        self.keyset = keyset

    def tick(self) -> None:
        return None

    def key_for(self, kid: str | None):
        keys = self.keyset.keys
        if kid is None:
            if len(keys) == 1:
                return keys[0]
            raise InvalidToken("token has no key id")
        for key in keys:
            if key.kid == kid:
                return key
        raise InvalidToken("unknown key id")

    def status(self) -> dict[str, Any]:
        return {"ok": True, "keys": len(self.keyset.keys)}


class TrustedIssuer:
    def __init__(self, *, issuer: str, audience: str | list[str], keys: KeySource,
                 mapping: ClaimsMapping | None = None, algorithms: tuple[str, ...] = ALLOWED_ALGS,
                 leeway_s: int = 30, label: str = "", required_claims: tuple[str, ...] = (),
                 signature_hint: str = ""):
        bad = [a for a in algorithms if a not in ALLOWED_ALGS]
        if bad:
            raise ValueError(f"algorithms not allowed (asymmetric only): {bad}")
        if not algorithms:
            raise ValueError("at least one algorithm is needed")
        self.issuer = issuer
        self.audiences = [audience] if isinstance(audience, str) else list(audience)
        if not self.audiences or not all(self.audiences):
            raise ValueError("an audience is needed: tokens for other services must not be accepted")
        self.keys = keys
        self.mapping = mapping or ClaimsMapping()
        self.algorithms = tuple(algorithms)
        self.leeway_s = leeway_s
        self.label = label or issuer
        # Appended to "bad signature" (the dev issuer names its key file: issue #14 item 6).
        self.signature_hint = signature_hint
        self.required_claims = tuple(dict.fromkeys((*REQUIRED_CLAIMS, *required_claims)))
        self._claims_registry_options = {
            "iss": {"essential": True, "value": issuer},
            "aud": {"essential": True, "values": self.audiences},
            **{name: {"essential": True} for name in self.required_claims if name not in ("iss", "aud")},
        }

    def claims_registry(self, now: int) -> jwt.JWTClaimsRegistry:
        return jwt.JWTClaimsRegistry(now=now, leeway=self.leeway_s, **self._claims_registry_options)


def _b64json(segment: str) -> dict[str, Any]:
    padded = segment + "=" * (-len(segment) % 4)
    value = json.loads(base64.urlsafe_b64decode(padded.encode("ascii")))
    if not isinstance(value, dict):
        raise ValueError("not an object")
    return value


class Authenticator:
    """Validates tokens (``authenticate``) and remembers the ones it validated (``cached``).

    A client sends the same access token with every request until it expires; checking its
    RSA signature again each time was a third of a submission's CPU (issue #32). A token that
    passed every check is remembered, under the SHA-256 of the whole token, for at most
    ``cache_s`` seconds and never past its own ``exp`` (plus the issuer's leeway, as
    ``authenticate`` allows), and only while its issuer's key set is the one that validated it.
    Failures are never remembered: each bad token pays the full check. ``cache_s=0`` turns
    the cache off."""

    CACHE_MAX = 10_000

    def __init__(self, issuers: list[TrustedIssuer], *, cache_s: float = 0):
        self.issuers: dict[str, TrustedIssuer] = {}
        for i in issuers:
            if i.issuer in self.issuers:
                raise ValueError(f"issuer configured twice: {i.issuer}")
            self.issuers[i.issuer] = i
        self.cache_s = cache_s
        # sha256(token) -> (principal, issuer, key generation, valid until (wall clock))
        self._validated: dict[bytes, tuple[Principal, TrustedIssuer, int, float]] = {}

    def cached(self, token: str) -> Principal | None:
        """The principal of a token validated earlier and still good, else None (then call
        ``authenticate``). Cheap and non-blocking: safe on the event loop."""
        return self._remembered(_digest(token)) if self.cache_s else None

    def _remembered(self, key: bytes) -> Principal | None:
        entry = self._validated.get(key)
        if entry is None:
            return None
        principal, trusted, generation, until = entry
        if time.time() >= until or trusted.keys.generation != generation:
            self._validated.pop(key, None)
            return None
        trusted.keys.tick()  # a scheduled key refresh is due whether or not tokens are cached
        return principal

    def authenticate(self, token: str) -> Principal:
        """The principal of a token remembered, else validate it fully, map its claims and
        remember it. May block (a key fetch): async callers try ``cached`` first.

        Raises:
            InvalidToken: with a short reason safe to show the caller.
        """
        if not self.cache_s:
            return self._validate(token)[0]
        key = _digest(token)
        principal = self._remembered(key)
        if principal is not None:
            return principal
        principal, trusted, generation, exp = self._validate(token)
        until = min(exp + trusted.leeway_s, time.time() + self.cache_s)
        validated = self._validated
        while len(validated) >= self.CACHE_MAX:
            try:
                validated.pop(next(iter(validated)))  # the oldest entry
            except (StopIteration, KeyError, RuntimeError):
                break
        validated[key] = (principal, trusted, generation, until)
        return principal

    def _validate(self, token: str) -> tuple[Principal, TrustedIssuer, int, float]:
        if len(token) > MAX_TOKEN_BYTES:
            raise InvalidToken("token too large")
        if not token.isascii():
            raise InvalidToken("malformed token")
        parts = token.split(".")
        # An empty signature is let through to the algorithm check: that is what an
        # "alg: none" token looks like, and it deserves the precise reason.
        if len(parts) != 3 or not all(parts[:2]):
            raise InvalidToken("malformed token")
        try:
            header = _b64json(parts[0])
            unverified = _b64json(parts[1])
        except (ValueError, UnicodeError, binascii.Error):
            raise InvalidToken("malformed token") from None
        iss = unverified.get("iss")
        trusted = self.issuers.get(iss) if isinstance(iss, str) else None
        if trusted is None:
            raise InvalidToken(f"untrusted issuer: the token's iss is {_show(iss)}; this gateway trusts "
                               + ", ".join(_show(i) for i in sorted(self.issuers)))
        alg = header.get("alg")
        if not isinstance(alg, str) or alg not in trusted.algorithms:
            raise InvalidToken("algorithm not allowed")
        kid = header.get("kid")
        if kid is not None and not isinstance(kid, str):
            raise InvalidToken("malformed token")
        generation = trusted.keys.generation  # read before the key: a later change re-validates
        key = trusted.keys.key_for(kid)
        if not isinstance(key, _KEY_TYPE_FOR_ALG[alg]):
            raise InvalidToken("algorithm does not match key")
        if key.alg and key.alg != alg:
            raise InvalidToken("algorithm does not match key")
        now = int(time.time())
        try:
            claims = jwt.decode(token, key, algorithms=[alg], registry=_JWS_REGISTRY).claims
            trusted.claims_registry(now).validate(claims)
        except JoseError as exc:
            raise InvalidToken(_with_values(_reason(exc), unverified, trusted, kid, now)) from None
        except (ValueError, TypeError, UnicodeError):
            raise InvalidToken("malformed token") from None
        if claims.get("typ") in NOT_ACCESS_TOKEN_TYPES:
            raise InvalidToken("not an access token")
        # joserfc only checks iat when present; it is required here, and must be a number.
        iat = claims.get("iat")
        if isinstance(iat, bool) or not isinstance(iat, (int, float)):
            raise InvalidToken("invalid claim iat")
        exp = claims.get("exp")
        if isinstance(exp, bool) or not isinstance(exp, (int, float)):
            raise InvalidToken("invalid claim exp")
        try:
            principal = principal_from_claims(dict(claims), trusted.mapping, issuer=trusted.issuer)
        except ClaimsError as exc:
            raise InvalidToken(str(exc)) from None
        return principal, trusted, generation, float(exp)

    def status(self) -> dict[str, Any]:
        return {i.label: i.keys.status() for i in self.issuers.values()}


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("latin-1", "replace")).digest()


def _show(value: Any, limit: int = 120) -> str:
    """A claim value for an error message: quoted, bounded (it comes from an unverified token)."""
    text = json.dumps(value, ensure_ascii=True) if not isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _when(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return _show(value)
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(value))


def _with_values(reason: str, claims: dict[str, Any], trusted: TrustedIssuer, kid: str | None, now: int) -> str:
    """The short reason plus the values it compared, so a misconfiguration can be seen."""
    if reason == "token expired":
        return (f"token expired: exp {_when(claims.get('exp'))}, now {_when(now)} "
                f"(leeway {trusted.leeway_s} s)")
    if reason == "token not yet valid":
        return f"token not yet valid: nbf {_when(claims.get('nbf'))}, now {_when(now)} (leeway {trusted.leeway_s} s)"
    if reason == "token issued in the future":
        return f"token issued in the future: iat {_when(claims.get('iat'))}, now {_when(now)}"
    if reason == "wrong audience":
        return f"wrong audience: the token's aud is {_show(claims.get('aud'))}; this gateway accepts {_show(trusted.audiences)}"
    if reason == "wrong issuer":
        return f"wrong issuer: the token's iss is {_show(claims.get('iss'))}; expected {_show(trusted.issuer)}"
    if reason == "bad signature":
        hint = f"; {trusted.signature_hint}" if trusted.signature_hint else ""
        return f"bad signature: not made by the key {_show(kid)} of {trusted.label} that this gateway holds{hint}"
    return reason


def _reason(exc: JoseError) -> str:
    if isinstance(exc, ExpiredTokenError):
        return "token expired"
    if isinstance(exc, BadSignatureError):
        return "bad signature"
    if isinstance(exc, MissingClaimError):
        # The (comma-joined) names come from our own required-claims list.
        return f"missing claim {exc.claim}"
    if isinstance(exc, InvalidClaimError):
        claim = getattr(exc, "claim", "") or ""
        description = str(exc.description or "")
        if claim == "nbf" and "not yet valid" in description:
            return "token not yet valid"
        if claim == "iat" and "future" in description:
            return "token issued in the future"
        return {
            "iss": "wrong issuer",
            "aud": "wrong audience",
        }.get(claim, f"invalid claim {claim}" if claim.isidentifier() else "invalid claim")
    if getattr(exc, "error", "") in ("unsupported_algorithm", "missing_algorithm"):
        return "algorithm not allowed"
    return "invalid token"
