"""Short-lived JWTs for slurmrestd, signed with the cluster's HS256 key.

The gateway holds the key that slurmctld's ``auth/jwt`` uses and signs a token for the
SlurmUser (the only identity allowed to act for other users). Each request then names
the POSIX user in ``X-SLURM-USER-NAME``; slurmctld runs the job as that user. Standard
library only: HS256 is a single HMAC.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path


def _b64(data: bytes) -> bytes:
    return base64.urlsafe_b64encode(data).rstrip(b"=")


def sign_hs256(key: bytes, claims: dict) -> str:
    header = _b64(json.dumps({"alg": "HS256", "typ": "JWT"}, separators=(",", ":")).encode())
    payload = _b64(json.dumps(claims, separators=(",", ":")).encode())
    signing_input = header + b"." + payload
    signature = _b64(hmac.new(key, signing_input, hashlib.sha256).digest())
    return (signing_input + b"." + signature).decode()


class KeyTokenSource:
    """Mints a token for ``username`` and reuses it until shortly before it expires."""

    def __init__(self, key_path: str | Path, *, username: str = "slurm", lifespan_s: int = 300):
        self._key_path = Path(key_path)
        self._username = username
        self._lifespan_s = lifespan_s
        self._lock = threading.Lock()
        self._token = ""
        self._expires = 0.0

    @property
    def username(self) -> str:
        return self._username

    def __call__(self) -> str:
        with self._lock:
            now = time.time()
            if now < self._expires - 30:
                return self._token
            key = self._key_path.read_bytes()
            iat = int(now)
            self._token = sign_hs256(key, {"iat": iat, "exp": iat + self._lifespan_s,
                                           "sun": self._username})
            self._expires = iat + self._lifespan_s
            return self._token


TokenSource = Callable[[], str]
