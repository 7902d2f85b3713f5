"""Build the Authenticator from settings: the dev issuer (dev mode) and OIDC issuers."""

from __future__ import annotations

from gateway.identity.authn import Authenticator, StaticKeySource, TrustedIssuer
from gateway.identity.claims import ClaimsMapping
from gateway.identity.dev import DevIssuer
from gateway.kit.settings import Settings


class ConfigurationError(RuntimeError):
    pass


def build_dev_issuer(settings: Settings) -> DevIssuer:
    return DevIssuer(issuer=settings.dev_issuer, audience=settings.audience, key_path=settings.dev_key_path)


def build_authenticator(settings: Settings) -> Authenticator:
    issuers: list[TrustedIssuer] = []
    if settings.dev_mode:
        dev = build_dev_issuer(settings)
        issuers.append(TrustedIssuer(issuer=dev.issuer, audience=settings.audience,
                                     keys=StaticKeySource(dev.public_keyset()), mapping=ClaimsMapping(),
                                     leeway_s=settings.leeway_s, label="development issuer (dev mode)"))
    issuers.extend(_oidc_issuers(settings))
    if not issuers:
        raise ConfigurationError(
            "no trusted token issuer: set ISTHMUS_OIDC_ISSUERS (see docs/identity.md), "
            "or ISTHMUS_DEV_MODE=true for the local development issuer")
    return Authenticator(issuers)


def _oidc_issuers(settings: Settings) -> list[TrustedIssuer]:
    import json

    configs = json.loads(settings.oidc_issuers or "[]")
    if not configs:
        return []
    from gateway.identity.oidc import issuers_from_config  # filled in by the OIDC module

    return issuers_from_config(configs, settings)
