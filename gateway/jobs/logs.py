"""A job's output, per worker, streamed from where the pool leaves it (docs/logs.md).

Slurm jobs write one file per worker on the shared filesystem the gateway mounts
(``Backend.output_file``); the gateway reads it in chunks of at most CHUNK_BYTES, so a stream holds at
most one chunk in memory whatever the file's size, and ``follow`` polls the file for new
bytes until the job has ended and the file has stopped growing.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable

import anyio

from adapters.base import Backend, Unsupported
from gateway.jobs.models import Job
from gateway.kit.errors import Conflict, GatewayError, Invalid

# 1 MiB per read: one worker-thread hop per MiB (64 KiB halved the throughput, bench/bench_logs.py).
CHUNK_BYTES = 1024 * 1024
# A tail larger than this is cut to its last MAX_TAIL_BYTES: `tail` never reads a whole file.
MAX_TAIL_BYTES = 8 * 1024 * 1024
FOLLOW_POLL_S = 0.25
FINAL_STATES = frozenset({"succeeded", "failed", "cancelled"})


class OutputUnavailable(GatewayError):
    status, title, slug = 501, "Output not available", "output-unavailable"


def job_pool(job: Job) -> str | None:
    """The pool a job was routed to (one place, so pools-as-data can re-point it)."""
    return job.backend


def output_path(backends: dict[str, Backend], job: Job, worker: int) -> str:
    """The file holding ``worker``'s output, or a problem saying why there is none."""
    if not 0 <= worker < job.workers:
        raise Invalid("query.worker", f"this job has workers 0 to {job.workers - 1}")
    pool = job_pool(job)
    if pool is None:
        raise Conflict(f"the job has no output yet: it is {job.state} and not routed to a pool")
    backend = backends.get(pool)
    if backend is None:
        raise OutputUnavailable(f"pool {pool!r} is not configured on this gateway")
    try:
        return backend.output_file(job.id, worker)
    except Unsupported as exc:
        raise OutputUnavailable(f"pool {pool!r}: {exc.message}") from None


def tail_offset(path: str, lines: int) -> int:
    """Byte offset where the last ``lines`` lines of the file start (reads backwards, in chunks)."""
    with open(path, "rb") as f:
        end = f.seek(0, os.SEEK_END)
        if lines <= 0:
            return end
        pos, newlines = end, 0
        # A final newline ends the last line; it does not start another one.
        if end:
            f.seek(end - 1)
            if f.read(1) == b"\n":
                newlines = -1
        while pos > 0 and end - pos < MAX_TAIL_BYTES:
            step = min(CHUNK_BYTES, pos)
            pos -= step
            f.seek(pos)
            block = f.read(step)
            count = block.count(b"\n")
            if newlines + count >= lines:
                # the start of the (lines)th line from the end lies in this block
                need = lines - newlines
                idx = len(block)
                for _ in range(need):
                    idx = block.rindex(b"\n", 0, idx)
                return pos + idx + 1
            newlines += count
        return max(pos, end - MAX_TAIL_BYTES)


def _read(path: str, offset: int) -> bytes:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(CHUNK_BYTES)
    except FileNotFoundError:
        return b""


async def stream(path: str, *, tail: int | None, follow: bool,
                 job_final: Callable[[], bool], poll_s: float = FOLLOW_POLL_S) -> AsyncIterator[bytes]:
    """The file's bytes (from its last ``tail`` lines), then, with ``follow``, new bytes as they come.

    File reads run in worker threads: the event loop never blocks on the filesystem.
    ``job_final`` (blocking, run in a thread) says whether the job has ended; following
    stops once it has and one more read found nothing new.
    """
    offset = 0
    if tail is not None and await anyio.to_thread.run_sync(os.path.exists, path):
        offset = await anyio.to_thread.run_sync(tail_offset, path, tail)
    ended = False
    while True:
        chunk = await anyio.to_thread.run_sync(_read, path, offset)
        if chunk:
            offset += len(chunk)
            yield chunk
            continue
        if not follow or ended:
            return
        ended = await anyio.to_thread.run_sync(job_final)
        if not ended:
            await anyio.sleep(poll_s)
