"""Trusted OpenID Connect providers: configuration, discovery and a cached JWKS.

``issuers_from_config`` turns the entries of ``ISTHMUS_OIDC_ISSUERS`` into
``TrustedIssuer``s whose keys come from a ``JwksKeySource``:

* discovery (``<issuer>/.well-known/openid-configuration``) names the ``jwks_uri``; the
  document's ``issuer`` must equal the configured one (OpenID Connect Discovery 4.3);
* the JWKS is fetched once when the gateway starts, then again
  - on a schedule (``refresh_interval_s``, default 10 min), in a background thread
    started by the first request that finds the keys stale, so no request waits; and
  - at once when a token names a ``kid`` we do not hold (key rotation), at most once per
    ``min_refresh_interval_s`` (default 30 s) per issuer, so a flood of tokens with bogus
    ``kid``s cannot make the gateway hammer the provider;
* when the provider cannot be reached the last good keys stay in use; ``status()``
  says ``ok: false`` with a short reason and /readyz reports "degraded". With no keys
  at all (provider down since start) tokens fail with "keys unavailable".
"""

from __future__ import annotations

import ipaddress
import logging
import threading
import time
from typing import Any
from urllib.parse import urlsplit

import httpx
from joserfc.errors import JoseError
from joserfc.jwk import ECKey, OKPKey, RSAKey
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gateway.identity.authn import ALLOWED_ALGS, InvalidToken, TrustedIssuer
from gateway.identity.claims import ClaimsMapping
from gateway.identity.errors import ConfigurationError
from gateway.kit.settings import Settings

log = logging.getLogger("isthmus.identity")

_KEY_CLASSES = {"RSA": RSAKey, "EC": ECKey, "OKP": OKPKey}
MAX_JWKS_BYTES = 512 * 1024


class IssuerConfig(BaseModel):
    """One entry of ``ISTHMUS_OIDC_ISSUERS`` (see docs/identity.md)."""

    model_config = ConfigDict(extra="forbid")

    issuer: str = Field(description="Exactly the `iss` the provider puts in its tokens.")
    audience: str | list[str] | None = Field(
        default=None, description="Accepted `aud` value(s); default ISTHMUS_AUDIENCE.")
    algorithms: list[str] | None = Field(default=None, description="Subset of the asymmetric allow-list.")
    claims: ClaimsMapping = Field(default_factory=ClaimsMapping)
    label: str = ""
    required_claims: list[str] = Field(default_factory=list, description="Beyond iss, sub, aud, exp, iat.")
    leeway_s: int | None = Field(default=None, ge=0, le=300, description="Default ISTHMUS_LEEWAY_S.")
    discovery_url: str | None = Field(default=None, description="Default <issuer>/.well-known/openid-configuration")
    jwks_uri: str | None = Field(default=None, description="Skip discovery and use this JWKS URL.")
    refresh_interval_s: float = Field(default=600, ge=10)
    min_refresh_interval_s: float = Field(default=30, ge=0)
    http_timeout_s: float = Field(default=5, gt=0, le=60)
    allow_insecure_http: bool = Field(
        default=False, description="Allow http:// URLs to non-loopback hosts (never in production).")

    @field_validator("algorithms")
    @classmethod
    def _asymmetric_only(cls, value: list[str] | None) -> list[str] | None:
        if value is not None:
            bad = [a for a in value if a not in ALLOWED_ALGS]
            if bad or not value:
                raise ValueError(f"only asymmetric algorithms are allowed ({', '.join(ALLOWED_ALGS)}); got {value}")
        return value

    def urls(self) -> list[str]:
        return [u for u in (self.issuer, self.discovery_url, self.jwks_uri) if u]


def _check_url(url: str, *, allow_http: bool) -> None:
    parts = urlsplit(url)
    if parts.scheme == "https" and parts.hostname:
        return
    if parts.scheme == "http" and parts.hostname:
        if allow_http:
            return
        host = parts.hostname
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = host == "localhost"
        if loopback:
            return
        raise ValueError(f"{url}: http:// is only accepted for loopback hosts (set allow_insecure_http to override)")
    raise ValueError(f"{url}: not an https:// URL")


class JwksKeySource:
    """Public keys of one provider, fetched over HTTP and cached (see module docstring)."""

    def __init__(self, *, issuer: str, discovery_url: str | None = None, jwks_uri: str | None = None,
                 refresh_interval_s: float = 600, min_refresh_interval_s: float = 30,
                 http_timeout_s: float = 5, fetch_at_start: bool = True,
                 transport: httpx.BaseTransport | None = None):
        self.issuer = issuer
        self.discovery_url = discovery_url or issuer.rstrip("/") + "/.well-known/openid-configuration"
        self._configured_jwks_uri = jwks_uri
        self.jwks_uri = jwks_uri
        self.refresh_interval_s = refresh_interval_s
        self.min_refresh_interval_s = min_refresh_interval_s
        self.http_timeout_s = http_timeout_s
        self._transport = transport
        self._keys: dict[str | None, Any] = {}
        self._lock = threading.Lock()  # serialises fetches; readers use the dict snapshot
        self._background: threading.Thread | None = None
        self.last_attempt_at = 0.0  # monotonic
        self.last_success_at = 0.0  # monotonic
        self.last_success_wall: float | None = None
        self.error: str | None = "keys not fetched yet"
        self.fetches = 0
        self.generation = 0  # bumped when the key set changes (Authenticator's cache)
        if fetch_at_start:
            self.refresh(reason="start")

    # ------------------------------------------------------------------ fetching

    def _client(self) -> httpx.Client:
        return httpx.Client(timeout=self.http_timeout_s, transport=self._transport, follow_redirects=False,
                            headers={"Accept": "application/json"})

    def _get_json(self, client: httpx.Client, url: str) -> dict[str, Any]:
        resp = client.get(url)
        if resp.status_code != 200:
            raise _FetchError(f"HTTP {resp.status_code} from {url}")
        if len(resp.content) > MAX_JWKS_BYTES:
            raise _FetchError(f"response from {url} too large")
        try:
            body = resp.json()
        except ValueError:
            raise _FetchError(f"{url} did not return JSON") from None
        if not isinstance(body, dict):
            raise _FetchError(f"{url} did not return a JSON object")
        return body

    def _fetch(self) -> dict[str | None, Any]:
        with self._client() as client:
            if not self._configured_jwks_uri:
                doc = self._get_json(client, self.discovery_url)
                if doc.get("issuer") != self.issuer:
                    raise _FetchError("discovery document names a different issuer")
                uri = doc.get("jwks_uri")
                if not isinstance(uri, str) or not uri:
                    raise _FetchError("discovery document has no jwks_uri")
                self.jwks_uri = uri
            jwks = self._get_json(client, self.jwks_uri)
        keys = _parse_jwks(jwks)
        if not keys:
            raise _FetchError("JWKS holds no usable signing key")
        return keys

    def refresh(self, *, reason: str) -> bool:
        """Fetch discovery + JWKS now. Keeps the old keys on failure. Returns success."""
        with self._lock:
            self.last_attempt_at = time.monotonic()
            self.fetches += 1
            try:
                keys = self._fetch()
            except (httpx.HTTPError, _FetchError) as exc:
                self.error = _short(exc)
                log.warning("identity provider %s: key refresh (%s) failed: %s; %d cached key(s) stay in use",
                            self.issuer, reason, self.error, len(self._keys))
                return False
            added = set(keys) - set(self._keys)
            removed = set(self._keys) - set(keys)
            replaced = [k for k in set(keys) & set(self._keys) if keys[k].thumbprint() != self._keys[k].thumbprint()]
            self._keys = keys
            if added or removed or replaced:
                # After the swap: a token validated meanwhile is remembered under the old
                # generation, so it is validated again with the new keys.
                self.generation += 1
            self.error = None
            self.last_success_at = time.monotonic()
            self.last_success_wall = time.time()
            if added or removed:
                log.info("identity provider %s: keys refreshed (%s): +%s -%s", self.issuer, reason,
                         sorted(map(str, added)), sorted(map(str, removed)))
            return True

    def _refresh_in_background(self) -> None:
        if self._background is not None and self._background.is_alive():
            return
        self._background = threading.Thread(target=self.refresh, kwargs={"reason": "schedule"},
                                            name=f"jwks-refresh {self.issuer}", daemon=True)
        self._background.start()

    # ------------------------------------------------------------------ KeySource

    def tick(self) -> None:
        """Start the scheduled refresh in the background when it is due."""
        # After a failed fetch retry sooner than the schedule, so /readyz recovers
        # shortly after the provider does; still in the background, still bounded.
        interval = self.refresh_interval_s if self.error is None else max(self.min_refresh_interval_s, 10)
        if time.monotonic() - self.last_attempt_at >= interval:
            self._refresh_in_background()

    def key_for(self, kid: str | None):
        self.tick()
        key = self._lookup(kid)
        if key is not None:
            return key
        # Unknown kid: the provider may have rotated its keys. Ask again, but not more
        # often than min_refresh_interval_s, whatever the callers send.
        if time.monotonic() - self.last_attempt_at >= self.min_refresh_interval_s:
            with self._lock:
                recheck = self._lookup(kid)  # another thread may have fetched meanwhile
                due = time.monotonic() - self.last_attempt_at >= self.min_refresh_interval_s
            if recheck is not None:
                return recheck
            if due:
                self.refresh(reason="unknown key id")
                key = self._lookup(kid)
                if key is not None:
                    return key
        if not self._keys:
            raise InvalidToken("keys unavailable")
        raise InvalidToken("token has no key id" if kid is None else "unknown key id")

    def _lookup(self, kid: str | None):
        keys = self._keys
        if kid is None:
            # Only unambiguous: a provider with a single signing key may omit kid.
            return next(iter(keys.values())) if len(keys) == 1 else None
        return keys.get(kid)

    def status(self) -> dict[str, Any]:
        body: dict[str, Any] = {"ok": self.error is None and bool(self._keys), "issuer": self.issuer,
                                "keys": len(self._keys)}
        if self.last_success_wall is not None:
            body["keys_fetched_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.last_success_wall))
        if self.error:
            body["reason"] = self.error
        return body


class _FetchError(Exception):
    pass


def _short(exc: Exception) -> str:
    if isinstance(exc, httpx.TimeoutException):
        return "provider timed out"
    if isinstance(exc, httpx.ConnectError):
        return "provider unreachable"
    if isinstance(exc, httpx.HTTPError):
        return f"provider error: {type(exc).__name__}"
    return str(exc)[:200]


def _parse_jwks(jwks: dict[str, Any]) -> dict[str | None, Any]:
    """Signing keys of a JWKS by kid; encryption keys and unusable entries are skipped."""
    out: dict[str | None, Any] = {}
    entries = jwks.get("keys")
    if not isinstance(entries, list):
        return out
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        if entry.get("use", "sig") != "sig":
            continue  # e.g. Keycloak's RSA-OAEP encryption key
        alg = entry.get("alg")
        if alg is not None and alg not in ALLOWED_ALGS:
            continue
        cls = _KEY_CLASSES.get(entry.get("kty"))
        if cls is None or any(p in entry for p in ("d", "p", "q", "k")):
            continue  # unknown type, symmetric, or (wrongly published) private material
        try:
            key = cls.import_key({k: v for k, v in entry.items() if k not in ("x5c", "x5t", "x5t#S256")})
        except (JoseError, ValueError, TypeError):
            log.warning("skipping a JWKS entry that cannot be imported (kid %r)", entry.get("kid"))
            continue
        kid = entry.get("kid")
        out[kid if isinstance(kid, str) else None] = key
    return out


def issuers_from_config(configs: list[dict], settings: Settings) -> list[TrustedIssuer]:
    """Build trusted issuers from ``ISTHMUS_OIDC_ISSUERS`` entries.

    Args:
        configs: parsed JSON list, one object per provider (see ``IssuerConfig``).
        settings: gateway settings (default audience and leeway).

    Returns:
        One ``TrustedIssuer`` per entry; their keys are fetched now (a provider that
        cannot be reached is reported by ``status()``, it does not stop the gateway).

    Raises:
        ConfigurationError: an entry is invalid; the message names it and the field.
    """
    if not isinstance(configs, list):
        raise ConfigurationError("ISTHMUS_OIDC_ISSUERS must be a JSON list of issuer objects")
    parsed: list[IssuerConfig] = []
    for n, raw in enumerate(configs):
        where = f"ISTHMUS_OIDC_ISSUERS[{n}]"
        try:
            cfg = IssuerConfig.model_validate(raw)
            for url in cfg.urls():
                _check_url(url, allow_http=cfg.allow_insecure_http)
        except ValidationError as exc:
            fields = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'entry'}: {e['msg']}" for e in exc.errors())
            raise ConfigurationError(f"{where}: {fields}") from None
        except ValueError as exc:
            raise ConfigurationError(f"{where}: {exc}") from None
        if any(p.issuer == cfg.issuer for p in parsed):
            raise ConfigurationError(f"{where}: issuer {cfg.issuer} is configured twice")
        parsed.append(cfg)
    issuers = []
    for cfg in parsed:
        keys = JwksKeySource(issuer=cfg.issuer, discovery_url=cfg.discovery_url, jwks_uri=cfg.jwks_uri,
                             refresh_interval_s=cfg.refresh_interval_s,
                             min_refresh_interval_s=cfg.min_refresh_interval_s, http_timeout_s=cfg.http_timeout_s)
        issuers.append(TrustedIssuer(
            issuer=cfg.issuer, audience=cfg.audience or settings.audience, keys=keys, mapping=cfg.claims,
            algorithms=tuple(cfg.algorithms or ALLOWED_ALGS),
            leeway_s=settings.leeway_s if cfg.leeway_s is None else cfg.leeway_s,
            label=cfg.label or cfg.issuer, required_claims=tuple(cfg.required_claims)))
    return issuers
