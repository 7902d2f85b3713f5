"""A real gateway process (``isthmus serve``) on loopback, per database."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import REPO

ISTHMUS = str(Path(sys.executable).parent / "isthmus")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RunningGateway:
    def __init__(self, url: str, env: dict[str, str], gw):
        self.url = url
        self.env = env
        self.gw = gw

    def token(self, user="alice", groups=("team-a",), admin=False) -> str:
        return self.gw.token(user, groups, admin)

    def cli(self, *args: str, token: str | None = None, input: str | None = None) -> subprocess.CompletedProcess:
        env = {**self.env, "ISTHMUS_URL": self.url}
        if token:
            env["ISTHMUS_TOKEN"] = token
        return subprocess.run([ISTHMUS, *args], env=env, capture_output=True, text=True, input=input,
                              timeout=60, cwd=REPO)


def start_gateway(env: dict[str, str], port: int, log: Path, cwd: Path = REPO) -> subprocess.Popen:
    proc = subprocess.Popen([ISTHMUS, "serve", "--dev", "--port", str(port)], env=env,
                            stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=cwd)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"gateway exited: {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"gateway did not become ready: {log.read_text()[-2000:]}")


@pytest.fixture(scope="module")
def running_gateway(module_gateway, database_url, dev_key_path, tmp_path_factory):
    """``isthmus serve`` on this module's database, beside the module's in-process gateway."""
    port = free_port()
    env = {**os.environ, "ISTHMUS_DATABASE_URL": database_url, "ISTHMUS_DEV_MODE": "true",
           "ISTHMUS_DEV_KEY_PATH": str(dev_key_path), "ISTHMUS_DEV_ACCOUNTS": "team-a,team-b"}
    log = tmp_path_factory.mktemp("gateway") / "gateway.log"
    proc = start_gateway(env, port, log)
    try:
        yield RunningGateway(f"http://127.0.0.1:{port}", env, module_gateway.gateway)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
