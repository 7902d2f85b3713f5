"""The development issuer: a locally generated RSA key that mints and verifies tokens.

Only active in dev mode (``ISTHMUS_DEV_MODE=true``). Its tokens go through the same
validation path as a real provider's (signature, iss, aud, exp, nbf, iat).
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

from joserfc import jwt
from joserfc.jwk import KeySet, RSAKey

DEV_KID = "isthmus-dev-1"


def load_or_create_key(path: Path) -> RSAKey:
    path = Path(path)
    if path.exists():
        return RSAKey.import_key(path.read_bytes(), {"kid": DEV_KID})
    path.parent.mkdir(parents=True, exist_ok=True)
    key = RSAKey.generate_key(2048, {"kid": DEV_KID}, private=True)
    pem = key.as_pem(private=True)
    # O_EXCL: two gateways starting at once must not overwrite each other's key.
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return RSAKey.import_key(path.read_bytes(), {"kid": DEV_KID})
    with os.fdopen(fd, "wb") as fh:
        fh.write(pem)
    return RSAKey.import_key(pem, {"kid": DEV_KID})


class DevIssuer:
    def __init__(self, *, issuer: str, audience: str, key_path: Path):
        self.issuer = issuer
        self.audience = audience
        self.key = load_or_create_key(key_path)

    def public_keyset(self) -> KeySet:
        return KeySet([RSAKey.import_key(self.key.as_dict(private=False))])

    def mint(self, *, user: str, groups: list[str] = (), admin: bool = False, lifetime_s: int = 3600,
             extra: dict | None = None) -> str:
        now = int(time.time())
        claims = {
            "iss": self.issuer, "aud": self.audience, "sub": f"dev:{user}", "preferred_username": user,
            "groups": list(groups) + (["isthmus-admins"] if admin else []),
            "iat": now, "nbf": now, "exp": now + lifetime_s, "jti": uuid.uuid4().hex,
        }
        claims.update(extra or {})
        header = {"alg": "RS256", "kid": DEV_KID, "typ": "JWT"}
        return jwt.encode(header, claims, self.key, algorithms=["RS256"])
