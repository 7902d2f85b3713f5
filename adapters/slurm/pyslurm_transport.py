"""pyslurm transport: libslurm through pyslurm, no slurmrestd and no Slurm commands.

pyslurm builds only against the Slurm major.minor it was released for, and its only
current line is 25.11.x, so this transport needs Slurm 25.11's libslurm on the gateway
host (``pip install isthmus[pyslurm]`` against it; see docs/slurm.md) and a 25.11
slurmctld. It refuses any other controller version with the reason.

Concurrency rules:

* pyslurm holds the GIL inside libslurm, so a slurmctld that does not answer would
  freeze the whole gateway. Every call therefore runs in a child process
  (:mod:`adapters.slurm.pyslurm_worker`, one per transport, started lazily) and is
  bounded by ``timeout_s``: at the deadline the child is killed and the call raises
  BackendUnavailable (AmbiguousSubmit for a submit, so the backend looks the job up
  before anyone retries). The next call starts a fresh child.
* One request is in flight per child; a lock serialises callers. ``workers`` > 1
  starts that many children and spreads calls over them.
* Jobs run as the mapped POSIX user: the gateway (root or SlurmUser, as for the CLI
  transport's runuser) puts the user's uid and primary gid into the job description;
  slurmctld accepts that only from root/SlurmUser and otherwise answers
  "Access/permission denied" (BackendForbidden).
"""

from __future__ import annotations

import json
import os
import pwd
import queue
import select
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from adapters.base import (
    BackendForbidden,
    BackendUnavailable,
    SubmissionRejected,
    Unsupported,
)
from adapters.slurm.errors import AmbiguousSubmit, classify, stop
from adapters.slurm.script import JobSpec, slurm_duration
from adapters.slurm.transport import Record, Transport

WORKER = Path(__file__).with_name("pyslurm_worker.py")
SUPPORTED_SLURM = "25.11"
REASON = ("pyslurm is unavailable: each pyslurm release builds only against its own Slurm "
          "major.minor (the package index carries 25.11.x); install it against Slurm "
          f"{SUPPORTED_SLURM} with `pip install isthmus[pyslurm]` (docs/slurm.md) or use "
          "transport 'rest' or 'cli'")


# What an older slurmctld answers to libslurm 25.11 (seen from 22.05 and 24.11). A
# slurmctld that is down answers "Unable to contact slurm controller" instead.
_OLDER_CONTROLLER_TEXT = ("zero bytes were transmitted", "protocol authentication error",
                          "protocol version", "incompatible")


def _major_minor(version: str) -> tuple[int, int]:
    parts = (version.split(".") + ["0", "0"])[:2]
    try:
        return int(parts[0]), int(parts[1])
    except ValueError:
        return 0, 0


class _Child:
    """One worker process and its pipes. Not thread-safe: the pool hands it to one caller."""

    def __init__(self, slurm_conf: str | None, start_timeout_s: float, env: Mapping[str, str],
                 python: str):
        # -P: the worker's own directory must not shadow the standard library (token.py).
        argv = [python, "-P", str(WORKER)] + ([slurm_conf] if slurm_conf else [])
        try:
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, env=dict(env), text=True,
                                         bufsize=1, close_fds=True)
        except OSError as exc:
            raise BackendUnavailable(f"cannot start the pyslurm worker: {exc}", backend="slurm") from exc
        self._stderr: list[str] = []
        threading.Thread(target=self._drain_stderr, daemon=True,
                         name=f"pyslurm-stderr-{self.proc.pid}").start()
        hello = self.read(start_timeout_s, what="start-up")
        if "error" in hello:
            err = hello["error"]
            self.kill()
            if err.get("kind") == "unsupported":
                raise Unsupported(REASON, backend="slurm", detail=err.get("message"))
            raise BackendUnavailable(err.get("message") or "pyslurm worker failed", backend="slurm")
        self.info: dict[str, Any] = hello["ok"]

    def _drain_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._stderr.append(line.rstrip())
            del self._stderr[:-20]   # libslurm's last words, for the error message

    def last_words(self) -> str:
        return "; ".join(self._stderr[-3:])

    def alive(self) -> bool:
        return self.proc.poll() is None

    def read(self, timeout_s: float, *, what: str) -> dict[str, Any]:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        if not ready:
            self.kill()
            raise TimeoutError(f"pyslurm {what} did not answer within {timeout_s:g}s")
        line = self.proc.stdout.readline()
        if not line:
            self.kill()
            time.sleep(0.05)   # let the stderr thread catch libslurm's fatal() line
            raise ConnectionError(f"pyslurm worker exited during {what}"
                                  + (f": {self.last_words()}" if self.last_words() else ""))
        return json.loads(line)

    def call(self, request: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
        except OSError as exc:
            self.kill()
            raise ConnectionError(f"pyslurm worker is gone: {exc}") from exc
        return self.read(timeout_s, what=request["op"])

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # pragma: no cover - kill -9 does not hang
            pass
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                if pipe:
                    pipe.close()
            except OSError:
                pass


class PyslurmTransport(Transport):
    """Submit, query and cancel through libslurm (pyslurm) in bounded child processes."""

    name = "pyslurm"

    def __init__(self, *, slurm_conf: str | None = None, timeout_s: float = 30.0,
                 workers: int = 1, path: str = "/usr/local/bin:/usr/bin:/bin",
                 python: str | None = None):
        """``python``: the interpreter of the child (default: the gateway's own), e.g. a
        separate venv that holds pyslurm."""
        if workers < 1:
            raise ValueError("workers must be at least 1")
        self._python = python or sys.executable
        self._conf = slurm_conf
        self._timeout_s = timeout_s
        # The child gets a clean environment: pyslurm exports every SLURM_* variable of
        # its own environment into each job, so only SLURM_CONF may be there.
        self._env = {"PATH": path, "LANG": "C.UTF-8"}
        if slurm_conf:
            self._env["SLURM_CONF"] = slurm_conf
        for key in ("LD_LIBRARY_PATH", "PYTHONPATH"):
            if os.environ.get(key):
                self._env[key] = os.environ[key]
        self._idle: queue.Queue[_Child | None] = queue.Queue()
        for _ in range(workers):
            self._idle.put(None)   # a slot; the child starts on first use
        self._closed = False
        self._controller: str | None = None
        # Start one child now: a missing pyslurm or an unreadable slurm.conf is a
        # configuration error the operator should see at start-up, not at first submit.
        child = self._take()
        self.versions = dict(child.info)
        self._give(child)

    # ------------------------------------------------------------------ children

    def _take(self) -> _Child:
        try:
            child = self._idle.get(timeout=self._timeout_s)
        except queue.Empty as exc:
            raise BackendUnavailable(f"every pyslurm worker is busy for {self._timeout_s:g}s",
                                     backend="slurm") from exc
        if child is not None and child.alive():
            return child
        try:
            return _Child(self._conf, self._timeout_s, self._env, self._python)
        except TimeoutError as exc:
            self._idle.put(None)
            raise BackendUnavailable(str(exc), backend="slurm") from exc
        except ConnectionError as exc:
            self._idle.put(None)
            raise BackendUnavailable(str(exc), backend="slurm") from exc
        except BaseException:
            self._idle.put(None)
            raise

    def _give(self, child: _Child | None) -> None:
        self._idle.put(child if child is not None and child.alive() else None)

    def _call(self, op: str, *, submitting: bool = False, **args: Any) -> Any:
        if self._closed:
            raise BackendUnavailable("the pyslurm transport is closed", backend="slurm")
        if self._controller is None and op != "version":
            self.controller_version()
        child = self._take()
        try:
            answer = child.call({"op": op, **args}, self._timeout_s)
        except (TimeoutError, ConnectionError) as exc:
            self._give(None)
            cls = AmbiguousSubmit if submitting else BackendUnavailable
            raise cls(str(exc), backend="slurm") from exc
        except BaseException:
            child.kill()
            self._give(None)
            raise
        self._give(child)
        if "error" in answer:
            err = answer["error"]
            message = err.get("message") or "unknown pyslurm error"
            if err.get("kind") == "invalid":
                raise SubmissionRejected(message, backend="slurm")
            raise classify(message, err.get("errno"), submitting=submitting)
        return answer["ok"]

    def controller_version(self) -> str:
        """slurmctld's version; Unsupported when it is older than pyslurm's libslurm.

        Checked before the first request: an older slurmctld does not understand
        libslurm 25.11's protocol, and the errors it sends back would read like an
        outage. A newer one is fine within Slurm's own rule (slurmctld serves clients
        up to two major releases older).
        """
        try:
            version = str(self._call("version"))
        except (BackendUnavailable, BackendForbidden) as exc:
            # An older slurmctld cannot even read the request, so it cannot say its
            # version: it drops the connection (22.05) or fails the auth header (24.11).
            if any(t in exc.message.lower() for t in _OLDER_CONTROLLER_TEXT):
                raise Unsupported(
                    f"slurmctld did not understand libslurm {SUPPORTED_SLURM} (it answered "
                    f"{exc.message!r}), so it is probably older than {SUPPORTED_SLURM}; pyslurm "
                    f"cannot talk to it. Use transport 'rest' or 'cli' for it",
                    backend="slurm") from exc
            raise
        if _major_minor(version) < _major_minor(SUPPORTED_SLURM):
            raise Unsupported(f"pyslurm {self.versions.get('pyslurm', '?')} (libslurm "
                              f"{SUPPORTED_SLURM}) cannot talk to an older slurmctld; this one "
                              f"runs {version}. Use transport 'rest' or 'cli' for it",
                              backend="slurm")
        self._controller = version
        return version

    # ------------------------------------------------------------------ requests

    def submit(self, spec: JobSpec, environment: Mapping[str, str]) -> str:
        try:
            user = pwd.getpwnam(spec.user)
        except KeyError as exc:
            raise SubmissionRejected(f"user {spec.user!r} does not exist on the gateway host",
                                     backend="slurm") from exc
        job_env = dict(environment)
        if self._conf:
            job_env.setdefault("SLURM_CONF", self._conf)
        job_id = self._call(
            "submit", submitting=True,
            name=spec.name, comment=spec.comment, partition=spec.partition,
            account=spec.account, uid=user.pw_uid, gid=user.pw_gid, nodes=spec.nodes,
            gres=spec.gres, cpus_per_node=spec.cpus_per_node, requeue=spec.requeue,
            memory_mib_per_node=spec.memory_mib_per_node, time_limit_min=spec.time_limit_min,
            work_dir=spec.work_dir, output=spec.output, script=spec.script,
            environment=job_env, reservation=spec.reservation, segment=spec.segment,
            switches_wait_s=spec.switches_wait_s, exclude=list(spec.exclude),
            switches_time=slurm_duration(spec.switches_wait_s) if spec.switches_wait_s else None)
        if not isinstance(job_id, int) or job_id <= 0:
            raise AmbiguousSubmit(f"libslurm returned job id {job_id!r}", backend="slurm")
        return str(job_id)

    def jobs(self) -> list[Record]:
        return list(self._call("jobs"))

    def job(self, job_id: str) -> Record | None:
        if not str(job_id).isdigit():
            return None
        return self._call("job", job_id=int(job_id))

    def comments(self, known: Mapping[str, str]) -> dict[str, str]:
        return dict(self._call("comments"))

    def cancel(self, job_id: str) -> None:
        stop(lambda: self._call("cancel", job_id=int(job_id)))

    def signal(self, job_id: str, signal: str) -> None:
        stop(lambda: self._call("signal", job_id=int(job_id), signal=signal))

    def nodes(self) -> list[Record]:
        return list(self._call("nodes"))

    def reservations(self) -> list[Record]:
        # pyslurm.Reservations (pyslurm 25.5+, which replaced the old pyslurm.reservation),
        # so no Slurm command is needed here.
        return list(self._call("reservations"))

    def describe(self) -> str:
        return f"pyslurm {self.versions.get('pyslurm', '?')}"

    def close(self) -> None:
        self._closed = True
        while True:
            try:
                child = self._idle.get_nowait()
            except queue.Empty:
                return
            if child is not None:
                child.kill()
