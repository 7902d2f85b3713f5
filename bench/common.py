"""Shared helpers for the benchmark scripts: percentiles, servers, and docs/benchmarks.md sections."""

from __future__ import annotations

import os
import platform
import re
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

from stack.databases import server_url, temporary_database

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "benchmarks.md"
BIN = Path(sys.executable).parent


def stack_postgres_url() -> str:
    """The benchmark Postgres server: ISTHMUS_BENCH_POSTGRES_URL, else the test stack's own."""
    return server_url("ISTHMUS_BENCH_POSTGRES_URL")


def fresh_database(server: str | None = None, *, migrated: bool = False):
    """A new database on the benchmark server for one run, dropped afterwards."""
    return temporary_database(server or stack_postgres_url(), prefix="isthmus_bench", migrated=migrated)


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    k = min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))
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
        text = re.sub(re.escape(start) + r".*?" + re.escape(end), lambda _: block, text, flags=re.DOTALL)
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    DOC.parent.mkdir(parents=True, exist_ok=True)
    DOC.write_text(text)


def short_rev(ref: str) -> str:
    """``git rev-parse --short ref`` in this checkout."""
    return subprocess.run(["git", "rev-parse", "--short", ref], cwd=REPO, capture_output=True, text=True,
                          check=True).stdout.strip()


def dirty() -> str:
    """The checkout's uncommitted changes to tracked files ("" when none): an A/B run says so."""
    return subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True,
                          text=True, check=True).stdout.strip()


def export_rev(rev: str, dest: str) -> str:
    """The tree of git revision ``rev`` in ``dest`` (``git archive``): the "before" code of an A/B run."""
    import io
    import tarfile

    archive = subprocess.run(["git", "archive", "--format=tar", rev], cwd=REPO, capture_output=True,
                             check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tf:
        tf.extractall(dest, filter="data")
    return dest

