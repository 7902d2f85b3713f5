"""A real local HTTPS receiver with a CA the test makes, and a gateway that trusts it."""

from __future__ import annotations

import base64
import dataclasses
import datetime
import hashlib
import hmac
import http.server
import ipaddress
import json
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

SPEC = {"name": "hooked", "account": "team-a", "command": ["python", "train.py"], "workers": 1,
        "gpus_per_worker": 1, "cpus_per_worker": 1, "memory_per_worker": "1Gi", "time_limit": "10m"}
# What the tests' gateways allow: the receiver listens on loopback.
ALLOWLIST = "127.0.0.1/32"


@dataclasses.dataclass
class Pki:
    ca_file: Path
    cert_file: Path
    key_file: Path


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def make_pki(directory: Path, label: str = "test") -> Pki:
    """A CA and a server certificate for 127.0.0.1 signed by it."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(_name(f"isthmus {label} CA")).issuer_name(_name(f"isthmus {label} CA"))
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(_name("127.0.0.1")).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                        x509.DNSName("localhost")]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    directory.mkdir(parents=True, exist_ok=True)
    pki = Pki(directory / "ca.pem", directory / "server.pem", directory / "server.key")
    pki.ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    pki.cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pki.key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
    return pki


def verify(secret: str, headers: dict[str, str], body: bytes, tolerance_s: int = 300) -> bool:
    """Standard Webhooks verification, written from the spec (not the gateway's code)."""
    msg_id, ts, sigs = headers["webhook-id"], headers["webhook-timestamp"], headers["webhook-signature"]
    if abs(time.time() - int(ts)) > tolerance_s:
        return False
    key = base64.b64decode(secret.split("_", 1)[1])
    expected = base64.b64encode(hmac.new(key, f"{msg_id}.{ts}.".encode() + body, hashlib.sha256).digest()).decode()
    return any(s.split(",", 1) == ["v1", expected] and hmac.compare_digest(s.split(",", 1)[1], expected)
               for s in sigs.split(" "))


@dataclasses.dataclass
class Received:
    headers: dict[str, str]
    body: bytes
    at: float
    status: int
    path: str = ""
    peer: tuple = ()

    @property
    def msg_id(self) -> str:
        return self.headers["webhook-id"]

    @property
    def json(self) -> dict:
        return json.loads(self.body)


class Receiver:
    """An HTTPS server on 127.0.0.1. ``mode``: ``ok`` (204), ``fail`` (500), ``stall``
    (answers only once ``release`` is set) or ``trickle`` (answers 204 one byte every
    ``trickle_s``; ``cut`` records when the sender hung up)."""

    def __init__(self, pki: Pki):
        self.mode = "ok"
        self.trickle_s = 1.0
        self.hang_up = False  # close each connection after answering, without saying so
        self.received: list[Received] = []
        self.cut: list[float] = []
        self.release = threading.Event()
        self.arrived = threading.Condition()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                mode = receiver.mode
                status = {"ok": 204, "fail": 500, "stall": 204, "trickle": 204}[mode]
                with receiver.arrived:
                    receiver.received.append(Received({k.lower(): v for k, v in self.headers.items()}, body,
                                                      time.time(), status, self.path, self.client_address))
                    receiver.arrived.notify_all()
                if mode == "stall":
                    receiver.release.wait(120)
                if mode == "trickle":
                    answer = b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\nX-Padding: " + b"." * 40 + b"\r\n\r\n"
                    try:
                        for i in range(len(answer)):
                            self.wfile.write(answer[i:i + 1])
                            self.wfile.flush()
                            if receiver.release.wait(receiver.trickle_s):
                                break
                    except OSError:
                        receiver.cut.append(time.time())
                    self.close_connection = True
                    return
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                except OSError:
                    pass  # the sender is gone (killed mid-delivery)
                if receiver.hang_up:
                    self.close_connection = True

            def log_message(self, *args):
                pass

        class Server(http.server.ThreadingHTTPServer):
            request_queue_size = 128  # the default 5 drops concurrent senders' SYNs (1-3 s retries)

        self.server = Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(pki.cert_file, pki.key_file)
        self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self.url = f"https://127.0.0.1:{self.port}/hook"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def wait_for(self, predicate, timeout: float = 30) -> list[Received]:
        deadline = time.monotonic() + timeout
        with self.arrived:
            while not predicate(self.received):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"receiver: condition not met in {timeout}s; got {len(self.received)}")
                self.arrived.wait(left)
            return list(self.received)

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="session")
def pki(tmp_path_factory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def receiver(pki) -> Iterator[Receiver]:
    r = Receiver(pki)
    yield r
    r.close()


@dataclasses.dataclass
class HookGateway:
    """The in-process gateway (``gw``) plus a webhook worker driven by the test."""

    gw: object
    settings: object

    def worker(self, **overrides):
        from gateway.webhooks.worker import WebhookWorker

        return WebhookWorker(sessions=self.gw.app.state.sessionmaker,
                             settings=self.settings.model_copy(update=overrides).webhooks)

    def register(self, url: str, account: str = "team-a", user: str = "alice") -> dict:
        r = self.gw.client.post(f"/v1/accounts/{account}/webhooks", json={"url": url},
                                headers=self.gw.headers(user, (account,)))
        assert r.status_code == 201, r.text
        return r.json()

    def submit_and_cancel(self, account: str = "team-a", user: str = "alice") -> str:
        h = self.gw.headers(user, (account,))
        r = self.gw.client.post("/v1/jobs", json={**SPEC, "account": account}, headers=h)
        assert r.status_code == 202, r.text
        job = r.json()["id"]
        r = self.gw.client.post(f"/v1/jobs/{job}/cancel", headers=h)
        assert r.status_code == 202, r.text
        return job

    def endpoint(self, endpoint_id: int, account: str = "team-a") -> dict:
        r = self.gw.client.get(f"/v1/accounts/{account}/webhooks/{endpoint_id}", headers=self.gw.headers("alice", (account,)))
        assert r.status_code == 200, r.text
        return r.json()

    def deliveries(self, endpoint_id: int, account: str = "team-a", **params) -> list[dict]:
        r = self.gw.client.get(f"/v1/accounts/{account}/webhooks/{endpoint_id}/deliveries", params=params,
                               headers=self.gw.headers("alice", (account,)))
        assert r.status_code == 200, r.text
        return r.json()["items"]


@pytest.fixture
def hooks(gw, pki) -> Iterator[HookGateway]:
    """``gw`` whose settings allow the loopback receiver and trust the test CA."""
    app = gw.app
    old = app.state.settings
    settings = old.model_copy(update={"webhook_allowlist": ALLOWLIST, "webhook_ca_file": str(pki.ca_file),
                                      "webhook_backoff_base_s": 0.01, "webhook_backoff_max_s": 0.05,
                                      "webhook_timeout_s": 5.0, "webhook_lease_s": 10.0})
    app.state.settings = settings
    app.state.membership_seen.forget()  # the gw fixture wiped membership_seen
    try:
        yield HookGateway(gw, settings)
    finally:
        app.state.settings = old
