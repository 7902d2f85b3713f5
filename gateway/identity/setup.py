"""Build the Authenticator from settings: the dev issuer (dev mode) and OIDC issuers."""

from __future__ import annotations

from gateway.identity.authn import Authenticator, StaticKeySource, TrustedIssuer
from gateway.identity.claims import ClaimsMapping
from gateway.identity.dev import DevIssuer
from gateway.identity.errors import ConfigurationError
from gateway.kit.settings import Settings

__all__ = ["ConfigurationError", "build_authenticator", "build_dev_issuer"]


def build_dev_issuer(settings: Settings) -> DevIssuer:
    return DevIssuer(issuer=settings.dev_issuer, audience=settings.audience, key_path=settings.dev_key_path)


def dev_key_hint(settings: Settings) -> str:
    """Where this gateway's dev key is: a token signed with another file's key is refused."""
    return (f"this gateway's dev key is {settings.dev_key_path} (ISTHMUS_DEV_KEY_PATH); "
            f"mint tokens with `isthmus token` using the same file")


def build_authenticator(settings: Settings) -> Authenticator:
    issuers: list[TrustedIssuer] = []
    if settings.dev_mode:
        dev = build_dev_issuer(settings)
        issuers.append(TrustedIssuer(issuer=dev.issuer, audience=settings.audience,
                                     keys=StaticKeySource(dev.public_keyset()), mapping=ClaimsMapping(),
                                     leeway_s=settings.leeway_s, label="development issuer (dev mode)",
                                     signature_hint=dev_key_hint(settings)))
    issuers.extend(_oidc_issuers(settings))
    if not issuers:
        raise ConfigurationError(
            "no trusted token issuer: set ISTHMUS_OIDC_ISSUERS (see docs/identity.md), "
            "or ISTHMUS_DEV_MODE=true for the local development issuer")
    return Authenticator(issuers, cache_s=settings.token_cache_s)


def _oidc_issuers(settings: Settings) -> list[TrustedIssuer]:
    import json

    try:
        configs = json.loads(settings.oidc_issuers or "[]")
    except json.JSONDecodeError as exc:
        raise ConfigurationError(f"ISTHMUS_OIDC_ISSUERS is not valid JSON: {exc.msg} at position {exc.pos}") from None
    if not configs:
        return []
    from gateway.identity.oidc import (
        issuers_from_config,  # httpx etc. only when OIDC is configured
    )

    return issuers_from_config(configs, settings)
