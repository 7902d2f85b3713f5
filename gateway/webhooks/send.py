"""Standard Webhooks signing and one HTTP POST to a checked, pinned address."""

from __future__ import annotations

import base64
import hashlib
import hmac
import http.client
import secrets
import socket
import ssl
import threading
import time

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


class _Deadline:
    """A hard deadline for one attempt: when it passes, the socket is shut down.

    A socket timeout bounds each read, so a receiver answering one byte every few seconds
    would hold an attempt for ever; shutting the socket down from a timer thread makes the
    blocked read return at once, whatever the receiver does.
    """

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.at = time.monotonic() + seconds
        self.passed = False
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True
        self._timer.start()

    def left(self) -> float:
        left = self.at - time.monotonic()
        if left <= 0:
            raise TimeoutError("deadline passed")
        return left

    def watch(self, sock: socket.socket) -> None:
        with self._lock:
            self._sock = sock
            if self.passed:
                self._shutdown()

    def _fire(self) -> None:
        with self._lock:
            self.passed = True
            self._shutdown()

    def _shutdown(self) -> None:
        if self._sock is not None:
            try:
                # The plain socket's shutdown, also for an SSLSocket: its own shutdown()
                # would tear down the TLS object under the thread reading from it.
                socket.socket.shutdown(self._sock, socket.SHUT_RDWR)
            except OSError:
                pass  # already closed

    def cancel(self) -> None:
        self._timer.cancel()


class _PinnedHTTPS(http.client.HTTPSConnection):
    """Connects to the checked address; TLS still verifies the certificate for the host name."""

    def __init__(self, target: Target, *, deadline: _Deadline, context: ssl.SSLContext):
        super().__init__(target.host, target.port, timeout=deadline.seconds, context=context)
        self._address = target.address
        self._deadline = deadline

    def connect(self) -> None:
        sock = _connect(self._address, self.port, self._deadline)
        tls = self._context.wrap_socket(sock, server_hostname=self.host, do_handshake_on_connect=False)
        self._deadline.watch(tls)  # the descriptor moved to the TLS socket
        self.sock = tls
        tls.settimeout(self._deadline.left())
        tls.do_handshake()


class _PinnedHTTP(http.client.HTTPConnection):
    def __init__(self, target: Target, *, deadline: _Deadline):
        super().__init__(target.host, target.port, timeout=deadline.seconds)
        self._address = target.address
        self._deadline = deadline

    def connect(self) -> None:
        self.sock = _connect(self._address, self.port, self._deadline)


def _connect(address: str, port: int, deadline: _Deadline) -> socket.socket:
    sock = socket.create_connection((address, port), deadline.left())
    deadline.watch(sock)
    # A reused connection sends small requests back to back: without this, Nagle's algorithm
    # and the receiver's delayed ACK add ~40 ms to each.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


class SendError(Exception):
    """The receiver was not reached or did not answer 2xx; ``str()`` is safe to show its owner."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message[:MAX_ERROR_CHARS])
        self.status = status


class Sender:
    """POSTs to one endpoint's receiver, keeping the connection open between attempts.

    One per slot (not thread-safe): an endpoint's burst pays one TLS handshake, not one per
    delivery. A connection is reused only for the same scheme, host, port and checked
    address; a receiver that closed it while idle gets the request again on a new one.
    """

    def __init__(self, context: ssl.SSLContext):
        self.context = context
        self._conn: _PinnedHTTP | _PinnedHTTPS | None = None
        self._key: tuple[str, str, int, str] | None = None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self._conn = self._key = None

    def _open(self, target: Target, deadline: _Deadline) -> _PinnedHTTP | _PinnedHTTPS:
        self.close()
        if target.scheme == "https":
            self._conn = _PinnedHTTPS(target, deadline=deadline, context=self.context)
        else:
            self._conn = _PinnedHTTP(target, deadline=deadline)
        self._key = (target.scheme, target.host, target.port, target.address)
        return self._conn

    def post(self, target: Target, headers: dict[str, str], body: str, *, timeout_s: float) -> int:
        """POST ``body``; return the 2xx status or raise SendError. No redirects are followed.

        ``timeout_s`` bounds the whole attempt (connect, TLS, request and answer), not each read.
        """
        deadline = _Deadline(timeout_s)
        conn = self._conn
        reused = conn is not None and conn.sock is not None and self._key == (
            target.scheme, target.host, target.port, target.address)
        try:
            if reused:
                conn._deadline = deadline
                deadline.watch(conn.sock)
                conn.sock.settimeout(deadline.left())
            else:
                conn = self._open(target, deadline)
            try:
                resp = self._exchange(conn, target, headers, body)
            except (OSError, http.client.HTTPException):
                if not reused or deadline.passed:
                    raise
                # The receiver closed the idle connection (seen as a reset, an EOF or a TLS
                # EOF, depending on timing): once more, on a new one.
                conn = self._open(target, deadline)
                resp = self._exchange(conn, target, headers, body)
            if resp.will_close or not resp.isclosed():
                self.close()
            if not 200 <= resp.status < 300:
                raise SendError(f"HTTP {resp.status} {resp.reason}".strip(), status=resp.status)
            return resp.status
        except SendError:
            raise
        except Exception as exc:
            self.close()
            if deadline.passed or isinstance(exc, TimeoutError):
                raise SendError(f"timed out: no complete answer within {timeout_s:g} s "
                                "(the deadline for the whole attempt)") from exc
            if isinstance(exc, ssl.SSLError):
                raise SendError(f"TLS error: {exc.reason or type(exc).__name__}") from exc
            if isinstance(exc, OSError):
                raise SendError(f"connection failed: {exc.strerror or type(exc).__name__}") from exc
            if isinstance(exc, http.client.HTTPException):
                raise SendError(f"bad HTTP response: {type(exc).__name__}") from exc
            raise
        finally:
            deadline.cancel()

    @staticmethod
    def _exchange(conn: http.client.HTTPConnection, target: Target, headers: dict[str, str], body: str
                  ) -> http.client.HTTPResponse:
        conn.request("POST", target.path, body=body.encode(), headers={
            **headers, "Content-Type": "application/json", "User-Agent": USER_AGENT})
        resp = conn.getresponse()
        resp.read(64 * 1024)  # a little of the body; a longer one closes the connection
        return resp


def post(target: Target, headers: dict[str, str], body: str, *, timeout_s: float,
         context: ssl.SSLContext) -> int:
    """One POST on a new connection (see ``Sender.post``)."""
    sender = Sender(context)
    try:
        return sender.post(target, headers, body, timeout_s=timeout_s)
    finally:
        sender.close()
