"""Standard Webhooks signing and one HTTP POST to a checked, pinned address."""

from __future__ import annotations

import base64
import hashlib
import hmac
import http.client
import secrets
import socket
import ssl

from gateway.webhooks.address import Target

SECRET_PREFIX = "whsec_"
USER_AGENT = "isthmus-webhooks/1"
MAX_ERROR_CHARS = 500


def new_secret() -> str:
    """A Standard Webhooks secret: ``whsec_`` + base64 of 32 random bytes."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def sign(secret: str, msg_id: str, timestamp: int, body: str) -> str:
    """The ``webhook-signature`` header value: ``v1,<base64 HMAC-SHA256 of id.timestamp.body>``."""
    key = base64.b64decode(secret.removeprefix(SECRET_PREFIX))
    mac = hmac.new(key, f"{msg_id}.{timestamp}.{body}".encode(), hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def tls_context(ca_file: str | None) -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    if ca_file:
        ctx.load_verify_locations(cafile=ca_file)  # in addition to the system's roots
    return ctx


class _PinnedHTTPS(http.client.HTTPSConnection):
    """Connects to the checked address; TLS still verifies the certificate for the host name."""

    def __init__(self, target: Target, *, timeout: float, context: ssl.SSLContext):
        super().__init__(target.host, target.port, timeout=timeout, context=context)
        self._address = target.address

    def connect(self) -> None:
        sock = socket.create_connection((self._address, self.port), self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)


class _PinnedHTTP(http.client.HTTPConnection):
    def __init__(self, target: Target, *, timeout: float):
        super().__init__(target.host, target.port, timeout=timeout)
        self._address = target.address

    def connect(self) -> None:
        self.sock = socket.create_connection((self._address, self.port), self.timeout)


class SendError(Exception):
    """The receiver was not reached or did not answer 2xx; ``str()`` is safe to show its owner."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message[:MAX_ERROR_CHARS])
        self.status = status


def post(target: Target, headers: dict[str, str], body: str, *, timeout_s: float,
         context: ssl.SSLContext) -> int:
    """POST ``body``; return the 2xx status or raise SendError. No redirects are followed."""
    conn: http.client.HTTPConnection
    if target.scheme == "https":
        conn = _PinnedHTTPS(target, timeout=timeout_s, context=context)
    else:
        conn = _PinnedHTTP(target, timeout=timeout_s)
    try:
        conn.request("POST", target.path, body=body.encode(), headers={
            **headers, "Content-Type": "application/json", "User-Agent": USER_AGENT})
        resp = conn.getresponse()
        resp.read(64 * 1024)  # a little of the body, so the connection closes cleanly
        if not 200 <= resp.status < 300:
            raise SendError(f"HTTP {resp.status} {resp.reason}".strip(), status=resp.status)
        return resp.status
    except SendError:
        raise
    except ssl.SSLError as exc:
        raise SendError(f"TLS error: {exc.reason or type(exc).__name__}") from exc
    except TimeoutError as exc:
        raise SendError(f"timed out after {timeout_s:g} s") from exc
    except OSError as exc:
        raise SendError(f"connection failed: {exc.strerror or type(exc).__name__}") from exc
    except http.client.HTTPException as exc:
        raise SendError(f"bad HTTP response: {type(exc).__name__}") from exc
    finally:
        conn.close()
