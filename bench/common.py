"""Shared helpers for the benchmark scripts: percentiles, servers, and docs/benchmarks.md sections."""

from __future__ import annotations

import contextlib
import os
import platform
import re
import socket
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "benchmarks.md"
BIN = Path(sys.executable).parent


def stack_postgres_url() -> str:
    """The benchmark Postgres server: ISTHMUS_BENCH_POSTGRES_URL, else the test stack's own
    cluster (stack/postgres.sh writes its URL to .stack/postgres/env)."""
    if url := os.environ.get("ISTHMUS_BENCH_POSTGRES_URL"):
        return url
    env = REPO / ".stack" / "postgres" / "env"
    if env.exists():
        from adapters.envfile import read_env_file

        if url := read_env_file(env).get("ISTHMUS_TEST_POSTGRES_URL"):
            return url
    return "postgresql+psycopg://isthmus:isthmus@127.0.0.1:55432/isthmus"


@contextlib.contextmanager
def fresh_database(server_url: str | None = None, *, migrated: bool = False) -> Iterator[str]:
    """A new database on the benchmark server for one run, dropped afterwards: a benchmark
    never depends on a database an earlier run or a manual step left behind."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.pool import NullPool

    server_url = server_url or stack_postgres_url()
    name = f"isthmus_bench_{uuid.uuid4().hex[:8]}"
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    with admin.connect() as c:
        c.execute(text(f'CREATE DATABASE "{name}"'))
    url = server_url.rsplit("/", 1)[0] + "/" + name
    try:
        if migrated:
            from gateway.cli import run_migrations

            run_migrations(url)
        yield url
    finally:
        with admin.connect() as c:
            c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    k = min(len(s) - 1, max(0, int(round(q / 100 * (len(s) - 1)))))
    return s[k]


def median(values):
    return statistics.median(values)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, proc: subprocess.Popen, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.2)
    raise RuntimeError(f"{url} not ready")


def machine() -> str:
    return f"{os.cpu_count()} cores, Python {platform.python_version()}, {platform.system()} {platform.release()}"


def write_section(name: str, body: str) -> None:
    """Replace the section between <!-- bench:NAME:start/end --> in docs/benchmarks.md."""
    start, end = f"<!-- bench:{name}:start -->", f"<!-- bench:{name}:end -->"
    block = f"{start}\n{body.rstrip()}\n{end}"
    text = DOC.read_text() if DOC.exists() else "# Benchmarks\n\nFigures are medians over repeats on a noisy 2-core machine; compare ratios, not absolutes.\n"
    if start in text:
        text = re.sub(re.escape(start) + r".*?" + re.escape(end), lambda _: block, text, flags=re.S)
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    DOC.parent.mkdir(parents=True, exist_ok=True)
    DOC.write_text(text)
