"""Finding 5: bodies are capped, unauthenticated bodies are never read, slow senders are cut off.

Most of this runs against a real ``isthmus serve`` process (uvicorn) over a socket, and
measures that process's resident memory: the in-process TestClient would hide what the
server really buffers.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gateway.models.jobs import Job

SPEC = {"name": "b", "account": "team-a", "command": ["true"], "workers": 1}
MIB = 1024 * 1024
BODY_TIMEOUT_S = 2.0


# ------------------------------------------------------------------ in process

def test_unauthenticated_post_is_401_problem_json(gw):
    r = gw.client.post("/v1/jobs", json=SPEC)
    assert r.status_code == 401
    assert r.headers["content-type"].startswith("application/problem+json")
    assert r.headers["www-authenticate"].startswith("Bearer")
    r = gw.client.post("/v1/jobs", json=SPEC, headers={"Authorization": "Bearer not.a.token"})
    assert r.status_code == 401 and r.json()["detail"] == "malformed token"


def test_body_over_the_cap_is_413_and_records_nothing(gw):
    body = json.dumps(SPEC).encode() + b" " * MIB  # valid JSON, one byte per space
    assert len(body) > gw.settings.max_body_bytes
    r = gw.client.post("/v1/jobs", content=body, headers={**gw.headers(), "Content-Type": "application/json"})
    assert r.status_code == 413, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert "ISTHMUS_MAX_BODY_BYTES" in r.json()["detail"]
    with gw.session() as s:
        assert s.query(Job).count() == 0


def test_authenticated_submit_still_works(gw):
    r = gw.client.post("/v1/jobs", json=SPEC, headers=gw.headers())
    assert r.status_code == 202, r.text


# ------------------------------------------------------------- real server

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve")
    port = _free_port()
    env = {**os.environ, "ISTHMUS_DATABASE_URL": f"sqlite:///{tmp / 'isthmus.db'}",
           "ISTHMUS_DEV_KEY_PATH": str(tmp / "dev.pem"), "ISTHMUS_BODY_TIMEOUT_S": str(BODY_TIMEOUT_S),
           "ISTHMUS_BACKENDS": "{}", "ISTHMUS_LOG_LEVEL": "warning"}
    proc = subprocess.Popen([str(Path(sys.executable).with_name("isthmus")), "serve", "--dev", "--port", str(port)],
                            cwd=tmp, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while True:
        with contextlib.suppress(OSError):
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                if b"200" in s.recv(100):
                    break
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"isthmus serve did not start: {proc.stderr.read().decode()[-2000:]}")
        time.sleep(0.2)
    from gateway.identity.dev import DevIssuer

    issuer = DevIssuer(issuer="urn:isthmus:dev-issuer", audience="isthmus", key_path=tmp / "dev.pem")
    yield {"port": port, "pid": proc.pid, "token": issuer.mint(user="alice", groups=["team-a"])}
    proc.terminate()
    proc.wait(timeout=10)


def _connect(server) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", server["port"]), timeout=10)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
    return s


def _head(length: int | None, token: str | None = None) -> bytes:
    lines = ["POST /v1/jobs HTTP/1.1", "Host: x", "Content-Type: application/json"]
    lines.append(f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked")
    if token:
        lines.append(f"Authorization: Bearer {token}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _status(sock: socket.socket) -> tuple[int, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    assert data, "no response"
    return int(data.split(b" ", 2)[1]), data


def _push(sock: socket.socket, total: int, *, chunked: bool) -> int:
    """Send up to ``total`` body bytes until the server closes; returns bytes sent."""
    sent, piece = 0, b"x" * (256 * 1024)
    sock.settimeout(5)
    with contextlib.suppress(OSError):
        while sent < total:
            data = (b"%x\r\n" % len(piece) + piece + b"\r\n") if chunked else piece
            sock.sendall(data)
            sent += len(piece)
    return sent


def _settle_rss(pid: int) -> int:
    time.sleep(0.5)
    return _rss_bytes(pid)


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_64mib_post_without_token_is_refused_unread(server, chunked):
    before = _settle_rss(server["pid"])
    with _connect(server) as sock:
        sock.sendall(_head(None if chunked else 64 * MIB))
        status, raw = _status(sock)      # answered before any body byte was sent
        sent = _push(sock, 64 * MIB, chunked=chunked)
    assert status in (401, 413), raw
    assert b"application/problem+json" in raw
    assert sent < 64 * MIB, "the server kept reading a body it had refused"
    assert _settle_rss(server["pid"]) - before < 16 * MIB


def test_64mib_post_with_token_stops_at_the_cap(server):
    before = _settle_rss(server["pid"])
    with _connect(server) as sock:
        sock.sendall(_head(None, server["token"]))
        sent = _push(sock, 64 * MIB, chunked=True)
        status, raw = _status(sock)
    assert status == 413, raw
    assert sent < 64 * MIB
    assert _settle_rss(server["pid"]) - before < 16 * MIB


def test_byte_by_byte_sender_is_cut_off_after_the_timeout(server):
    body = json.dumps(SPEC).encode()
    with _connect(server) as sock:
        sock.sendall(_head(len(body), server["token"]))
        start = time.monotonic()
        sock.settimeout(0.3)
        answer = b""
        for i in range(len(body)):
            with contextlib.suppress(OSError):
                sock.sendall(body[i:i + 1])
            with contextlib.suppress(socket.timeout, OSError):
                answer += sock.recv(65536)
            if answer or time.monotonic() - start > BODY_TIMEOUT_S + 5:
                break
        elapsed = time.monotonic() - start
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert BODY_TIMEOUT_S - 0.5 <= elapsed <= BODY_TIMEOUT_S + 3


def test_stalled_uploads_are_released(server):
    socks = []
    try:
        for _ in range(200):
            s = _connect(server)
            s.sendall(_head(1000, server["token"]) + b'{"name": ')
            socks.append(s)
        time.sleep(BODY_TIMEOUT_S + 2)
        released = 0
        for s in socks:
            s.settimeout(2)
            data = b""
            with contextlib.suppress(OSError):
                while chunk := s.recv(65536):
                    data += chunk
            if data.startswith(b"HTTP/1.1 408"):
                released += 1
        assert released == 200
    finally:
        for s in socks:
            s.close()
    # and the server still answers
    with _connect(server) as sock:
        body = json.dumps(SPEC).encode()
        sock.sendall(_head(len(body), server["token"]) + body)
        assert _status(sock)[0] == 202


def test_headers_that_keep_growing_are_refused(server):
    # h11 bounds what it buffers of an unfinished request head (ISTHMUS_MAX_HEADER_BYTES).
    with _connect(server) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * (64 * 1024))
        status, _ = _status(sock)
    assert status == 400
