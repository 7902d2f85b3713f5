"""A job's output, per worker, streamed from where the pool leaves it (docs/logs.md).

Slurm jobs write one file per worker on the shared filesystem the gateway mounts
(``Backend.output_file``); the gateway reads it in chunks of at most CHUNK_BYTES, so a stream holds at
most one chunk in memory whatever the file's size, and ``follow`` polls the file for new
bytes until the job has ended and the file has stopped growing.

Kubernetes pools serve output themselves (``Backend.stream_output``, the pod log API) but
delete it with the pods. When such a job ends (or is cancelled) the dispatcher keeps the
last ``output_keep_mib`` MiB of each worker in a file under ``output_keep_dir``
(:func:`keep_output`); once the job has ended the gateway serves that file like a Slurm one.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import stat
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import anyio

from adapters.base import (
    Backend,
    BackendError,
    BackendUnavailable,
    Feature,
    JobNotFound,
    Unsupported,
    features_of,
)
from gateway.kit.errors import BackendUnavailable as GatewayUnavailable
from gateway.kit.errors import Conflict, GatewayError, Invalid
from gateway.kit.streams import Permit, StreamLimiter
from gateway.models.jobs import Job

# 1 MiB per read: one worker-thread hop per MiB (64 KiB halved the throughput, bench/bench_logs.py).
CHUNK_BYTES = 1024 * 1024
# A tail larger than this is cut to its last MAX_TAIL_BYTES: `tail` never reads a whole file.
MAX_TAIL_BYTES = 8 * 1024 * 1024
# A follow reads the file again after FOLLOW_POLL_S, doubling the wait while nothing new
# comes, up to FOLLOW_MAX_POLL_S (new output resets it); it asks the database whether the
# job has ended at most once per FOLLOW_JOB_CHECK_S. An idle follow used to query the
# database four times a second for as long as it stayed open (#27, finding 4).
FOLLOW_POLL_S = 0.25
FOLLOW_MAX_POLL_S = 2.0
FOLLOW_JOB_CHECK_S = 5.0
FINAL_STATES = frozenset({"succeeded", "failed", "cancelled"})


class OutputUnavailable(GatewayError):
    status, title, slug = 501, "Output not available", "output-unavailable"


class OutputRefused(GatewayError):
    """The file where a worker's output should be is not one the gateway reads (docs/security.md, 45.1-45.2)."""

    status, title, slug = 409, "Output not readable", "output-refused"


# Never follow a link, never block on a FIFO or a device, never become a controlling tty.
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY


def open_output_file(path: str) -> int:
    """A descriptor of ``path`` for reading, if it is a plain file of its own; else OutputRefused.

    A job's output sits where the job's own user can replace it. The gateway reads it with
    its own rights, so it reads it only as what it should be: a regular file (not a link,
    which the open refuses; not a FIFO, which would block a thread; not a device) with one
    name (a hard link to another user's file has two). FileNotFoundError passes through.
    """
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except FileNotFoundError:
        raise
    except OSError as exc:
        what = "a symbolic link" if exc.errno == errno.ELOOP else os.strerror(exc.errno or 0).lower()
        raise OutputRefused(f"the output file is {what}: the gateway reads only a plain file") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        os.close(fd)
        what = "not a regular file (a FIFO, a socket or a device)" if not stat.S_ISREG(st.st_mode) \
            else f"a file with {st.st_nlink} names (a hard link)"
        raise OutputRefused(f"the output file is {what}: the gateway reads only a plain file of its own")
    return fd


log = logging.getLogger("isthmus.logs")
_KEPT_NAME = re.compile(r"[0-9A-Za-z][0-9A-Za-z_-]{0,127}")


def pool_backend(backends: dict[str, Backend], job: Job, worker: int) -> Backend:
    """The backend of the job's pool, or a problem saying why its output cannot be read."""
    if not 0 <= worker < job.workers:
        raise Invalid("query.worker", f"this job has workers 0 to {job.workers - 1}")
    pool = job.pool
    if pool is None:
        raise Conflict(f"the job has no output yet: it is {job.state} and not routed to a pool")
    backend = backends.get(pool)
    if backend is None:
        raise OutputUnavailable(f"pool {pool!r} is not configured on this gateway")
    return backend


def kept_path(keep_dir: str | os.PathLike, job_id: str, worker: int) -> Path:
    """Where the gateway keeps one worker's output after its pool deleted it."""
    if not _KEPT_NAME.fullmatch(job_id):
        raise ValueError(f"not a job id: {job_id!r}")
    return Path(keep_dir) / job_id / f"worker-{int(worker)}.out"


def _last_bytes(chunks: Iterator[bytes], keep: int) -> bytes:
    """The last ``keep`` bytes of a stream; holds at most ``keep`` + one chunk."""
    buf = bytearray()
    for chunk in chunks:
        buf += chunk
        if len(buf) > keep:
            del buf[: len(buf) - keep]
    return bytes(buf)


def keep_output(backend: Backend, job_id: str, backend_job_id: str, workers: int, keep_dir: str | os.PathLike,
                keep_bytes: int) -> int:
    """Copy the last ``keep_bytes`` of each worker's output from the pool to ``keep_dir``.

    Blocking (run it in a thread). A worker whose output the pool no longer has keeps what
    an earlier call kept (the cancel path keeps output before the pods are deleted, the end
    of the job once more). Returns how many workers were kept; never raises for a backend
    error (it is logged): keeping output must not stop the dispatcher.
    """
    if not features_of(backend).has(Feature.OUTPUT_STREAM):
        return 0
    kept = 0
    for worker in range(workers):
        dest = kept_path(keep_dir, job_id, worker)
        try:
            data = _last_bytes(backend.stream_output(backend_job_id, worker), keep_bytes)
        except JobNotFound:
            continue
        except BackendUnavailable as exc:  # the next worker would wait as long: give up
            log.warning("could not keep the output of job %s: %s", job_id, exc)
            break
        except BackendError as exc:
            log.warning("could not keep the output of worker %s of job %s: %s", worker, job_id, exc)
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, dest)  # readers see the old copy or the new one, never half of one
        kept += 1
    return kept


async def _relay(chunks: Iterator[bytes], what: str) -> AsyncIterator[bytes]:
    """A blocking iterator of chunks as an async one; each read runs in a worker thread."""
    try:
        while True:
            chunk = await anyio.to_thread.run_sync(next, chunks, None)
            if chunk is None:
                return
            yield chunk
    except BackendError as exc:  # the response has started: end it, do not raise into the server
        log.warning("output stream of %s ended: %s", what, exc)
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            await anyio.to_thread.run_sync(close)


def open_output(backends: dict[str, Backend], job: Job, worker: int, *, keep_dir: str | os.PathLike,
                tail: int | None, follow: bool, job_final: Callable[[], bool]) -> AsyncIterator[bytes]:
    """The stream of one worker's output, wherever its pool leaves it (blocking: call it in a thread).

    Raises the problem the caller answers with when there is none: 409 (no output yet, or
    none left), 501 (the pool's output cannot be read), 503 (the pool is unreachable).
    """
    backend = pool_backend(backends, job, worker)
    final = job.state in FINAL_STATES
    if not features_of(backend).has(Feature.OUTPUT_STREAM):
        path = output_path(backends, job, worker)
        try:
            os.close(open_output_file(path))  # refused now, with a problem, not half-way into a 200
        except FileNotFoundError:
            if not follow:
                raise Conflict(f"worker {worker} has no output yet (the job is {job.state})" if not final
                               else f"worker {worker} left no output (the job {job.state})") from None
        return stream(path, tail=tail, follow=follow and not final, job_final=job_final)
    kept = kept_path(keep_dir, job.id, worker)
    if final and kept.exists():
        os.close(open_output_file(str(kept)))
        return stream(str(kept), tail=tail, follow=False, job_final=job_final)
    if job.backend_job_id is None:
        raise Conflict(f"worker {worker} has no output yet (the job is {job.state})")
    try:
        chunks = backend.stream_output(job.backend_job_id, worker, tail_lines=tail, follow=follow and not final)
    except JobNotFound:
        raise Conflict(f"worker {worker} has no output yet (the job is {job.state})" if not final
                       else f"worker {worker} left no output (the job {job.state})") from None
    except Unsupported as exc:
        raise OutputUnavailable(f"pool {job.pool!r}: {exc.message}") from None
    except BackendError as exc:
        raise GatewayUnavailable(f"pool {job.pool!r}: {exc.message}") from exc
    return _relay(chunks, f"job {job.id} worker {worker}")


def open_held(streams: StreamLimiter, subject: str, backends: dict[str, Backend], job: Job, worker: int, *,
              keep_dir: str | os.PathLike, tail: int | None, follow: bool,
              job_final: Callable[[], bool]) -> tuple[AsyncIterator[bytes], Permit]:
    """:func:`open_output` under one of the caller's stream permits, for the API and the dashboard.

    Every read holds one, a plain read as much as a follow: a read of a slow or hostile file
    holds a thread and a connection too (docs/security.md, 45.2). The caller hands the permit
    to its response (HeldStreamingResponse), which releases it when the stream ends; it is
    released here if opening fails."""
    permit = streams.acquire(subject)
    try:
        return open_output(backends, job, worker, keep_dir=keep_dir, tail=tail, follow=follow,
                           job_final=job_final), permit
    except BaseException:
        permit.release()
        raise


def output_path(backends: dict[str, Backend], job: Job, worker: int) -> str:
    """The file holding ``worker``'s output, or a problem saying why there is none."""
    backend = pool_backend(backends, job, worker)
    features = features_of(backend)
    if not features.has(Feature.OUTPUT_FILES):
        raise OutputUnavailable(f"pool {job.pool!r}: {features.why_not(Feature.OUTPUT_FILES)}")
    return backend.output_file(job.id, worker)


def tail_offset(path: str, lines: int) -> int:
    """Byte offset where the last ``lines`` lines of the file start (reads backwards, in chunks)."""
    with os.fdopen(open_output_file(path), "rb") as f:
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


def _read(path: str, offset: int) -> bytes | None:
    """At most CHUNK_BYTES from ``offset``; b"" when there is nothing (yet); None when the file
    was replaced by one the gateway does not read (the stream then ends)."""
    try:
        with os.fdopen(open_output_file(path), "rb") as f:
            f.seek(offset)
            return f.read(CHUNK_BYTES)
    except FileNotFoundError:
        return b""
    except OutputRefused as exc:
        log.warning("output stream of %s ended: %s", path, exc.detail)
        return None


async def stream(path: str, *, tail: int | None, follow: bool, job_final: Callable[[], bool],
                 poll_s: float = FOLLOW_POLL_S, max_poll_s: float = FOLLOW_MAX_POLL_S,
                 job_check_s: float = FOLLOW_JOB_CHECK_S) -> AsyncIterator[bytes]:
    """The file's bytes (from its last ``tail`` lines), then, with ``follow``, new bytes as they come.

    File reads run in worker threads: the event loop never blocks on the filesystem.
    ``job_final`` (blocking, run in a thread: a database query) says whether the job has
    ended; it is asked when the file first has nothing new, then at most once per
    ``job_check_s``. Following stops once the job has ended and one more read found nothing new.
    """
    offset = 0
    if tail is not None:
        try:
            offset = await anyio.to_thread.run_sync(tail_offset, path, tail)
        except FileNotFoundError:
            pass  # not written yet: from its start, once it is
        except OutputRefused:
            return
    ended = False
    wait = poll_s
    next_check = 0.0
    while True:
        chunk = await anyio.to_thread.run_sync(_read, path, offset)
        if chunk is None:
            return
        if chunk:
            offset += len(chunk)
            wait = poll_s
            yield chunk
            continue
        if not follow or ended:
            return
        if time.monotonic() >= next_check:
            ended = await anyio.to_thread.run_sync(job_final)
            next_check = time.monotonic() + job_check_s
            if ended:
                continue  # one more read: what the job wrote last
        await anyio.sleep(wait)
        wait = min(wait * 2, max_poll_s)
