"""slurmrestd transport: JWT auth, OpenAPI version negotiation, per-version bodies."""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from typing import Any

import httpx

from adapters.base import (
    BackendForbidden,
    BackendUnavailable,
    JobNotFound,
    SubmissionRejected,
    Unsupported,
)
from adapters.slurm.errors import (
    AmbiguousSubmit,
    error_from,
    no_such_reservation,
    slurm_errors,
    stop,
)
from adapters.slurm.script import JobSpec, ReservationSpec
from adapters.slurm.token import TokenSource
from adapters.slurm.transport import Record, Transport

# Newest first. v0.0.39 (23.02) is left out: never tested here.
SUPPORTED_VERSIONS = ("v0.0.42", "v0.0.41", "v0.0.40", "v0.0.38")


_RESV_WRITE = re.compile(r"/slurm/v0\.0\.(4[3-9]|[5-9]\d)/reservation")


class RestTransport(Transport):
    name = "rest"

    def __init__(self, url: str, token: TokenSource, *, token_user: str = "slurm",
                 timeout_s: float = 10.0, connect_timeout_s: float = 3.0,
                 api_version: str | None = None, client: httpx.Client | None = None):
        self._token = token
        self._token_user = token_user
        self._client = client or httpx.Client(
            base_url=url.rstrip("/"),
            timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s),
        )
        self._forced_version = api_version
        self._version: str | None = None
        self._paths: dict[str, str] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ plumbing

    def _headers(self, user: str | None) -> dict[str, str]:
        try:
            token = self._token()
        except OSError as exc:
            raise BackendForbidden(f"cannot read the JWT key: {exc}", backend="slurm") from exc
        return {"X-SLURM-USER-NAME": user or self._token_user, "X-SLURM-USER-TOKEN": token}

    def _send(self, method: str, path: str, *, user: str | None = None,
              body: Any = None, submitting: bool = False) -> tuple[int, Any]:
        try:
            resp = self._client.request(method, path, headers=self._headers(user), json=body)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise BackendUnavailable(f"slurmrestd unreachable at {self._client.base_url}: {exc}", backend="slurm") from exc
        except (httpx.ReadTimeout, httpx.WriteTimeout, httpx.RemoteProtocolError,
                httpx.ReadError) as exc:
            cls = AmbiguousSubmit if submitting else BackendUnavailable
            raise cls(f"slurmrestd did not answer: {exc!r}", backend="slurm") from exc
        except httpx.HTTPError as exc:
            raise BackendUnavailable(f"slurmrestd request failed: {exc!r}", backend="slurm") from exc
        if resp.status_code in (401, 403):
            raise BackendForbidden(
                f"slurmrestd refused the credentials ({resp.status_code}): {resp.text[:200]}",
                backend="slurm")
        try:
            data = resp.json()
        except ValueError as exc:
            if resp.status_code >= 500 or resp.status_code == 404:
                raise BackendUnavailable(
                    f"slurmrestd answered {resp.status_code}: {resp.text[:200]}",
                    backend="slurm") from exc
            raise BackendUnavailable(f"slurmrestd sent non-JSON ({resp.status_code})",
                                     backend="slurm") from exc
        return resp.status_code, data

    @staticmethod
    def _errors(data: Any) -> list[tuple[str, int | None]]:
        return slurm_errors(data)

    def _raise_for(self, status: int, data: Any, *, submitting: bool = False) -> None:
        exc = error_from(data, submitting=submitting)
        if exc is not None:
            raise exc
        if status >= 400:
            raise BackendUnavailable(f"slurmrestd answered {status}", backend="slurm")

    # --------------------------------------------------------------- negotiation

    def negotiate(self) -> str:
        """Pick the newest API version both this adapter and slurmrestd speak."""
        with self._lock:
            if self._version:
                return self._version
            _, spec = self._send("GET", "/openapi/v3")
            paths = list((spec or {}).get("paths") or {})
            offered = [v for v in SUPPORTED_VERSIONS if any(p.startswith(f"/slurm/{v}/") for p in paths)]
            if self._forced_version:
                if self._forced_version not in offered:
                    raise SubmissionRejected(
                        f"slurmrestd does not offer {self._forced_version} (offers {offered})",
                        backend="slurm")
                chosen = self._forced_version
            elif offered:
                chosen = offered[0]
            else:
                raise BackendUnavailable(
                    f"slurmrestd offers none of {SUPPORTED_VERSIONS}", backend="slurm")
            for key in ("jobs", "job/submit", "nodes", "ping", "jobs/state", "reservations"):
                base = f"/slurm/{chosen}/{key}"
                if base in paths or base + "/" in paths or key != "jobs/state":
                    self._paths[key] = base + "/" if base + "/" in paths else base
            self._paths["job"] = f"/slurm/{chosen}/job/"
            # Reservations are written through the API from v0.0.43 (Slurm 25.11) on, which the
            # job paths need not speak: the newest such version offered, whatever was chosen.
            writers = sorted((p for p in paths if _RESV_WRITE.fullmatch(p)), reverse=True)
            if writers:
                self._paths["reservation"] = writers[0]
            self._version = chosen
            return chosen

    def describe(self) -> str:
        return f"rest {self.negotiate()}"

    # ------------------------------------------------------------------ requests

    def _job_desc(self, spec: JobSpec, environment: Mapping[str, str]) -> dict[str, Any]:
        v = self.negotiate()
        job: dict[str, Any] = {
            "name": spec.name,
            "comment": spec.comment,
            "partition": spec.partition,
            "tasks": spec.nodes,
            "tasks_per_node": 1,
            "cpus_per_task": spec.cpus_per_node,
            "current_working_directory": spec.work_dir,
            "standard_output": spec.output,
            "requeue": spec.requeue,
        }
        if spec.account:
            job["account"] = spec.account
        if spec.reservation:
            job["reservation"] = spec.reservation
        # v0.0.38 (22.05) has no switch request: there the gateway alone keeps the gang to one
        # leaf switch, starting it only when one has room (topology/tree then packs it there).
        if spec.switches_wait_s and v != "v0.0.38":
            job.update(required_switches=1, wait_for_switch=spec.switches_wait_s)
        if spec.segment:
            job["segment_size"] = spec.segment
        if spec.exclude:
            # v0.0.38: a comma-separated string; later: a list of names.
            job["excluded_nodes"] = ",".join(spec.exclude) if v == "v0.0.38" else list(spec.exclude)
        if v == "v0.0.38":
            job.update({
                "nodes": [spec.nodes, spec.nodes],
                "memory_per_node": spec.memory_mib_per_node,
                "time_limit": spec.time_limit_min,
                # 22.05 rejects its own documented "true"; it takes sbatch's spelling.
                "exclusive": "exclusive",
                "environment": dict(environment),
            })
            if spec.gres:
                job["gres"] = spec.gres
            return {"script": spec.script, "job": job}

        def num(n: int) -> dict[str, Any]:
            return {"set": True, "infinite": False, "number": n}

        job.update({
            "script": spec.script,
            "nodes": str(spec.nodes),
            "minimum_nodes": spec.nodes,
            "maximum_nodes": spec.nodes,
            "memory_per_node": num(spec.memory_mib_per_node),
            "time_limit": num(spec.time_limit_min),
            "environment": [f"{k}={val}" for k, val in environment.items()],
            "shared": ["none"],
        })
        if v in ("v0.0.40", "v0.0.41"):
            job["exclusive"] = ["true"]
        if spec.gres:
            job["tres_per_node"] = "gres/" + spec.gres
        return {"job": job}

    def submit(self, spec: JobSpec, environment: Mapping[str, str]) -> str:
        body = self._job_desc(spec, environment)
        status, data = self._send("POST", self._paths["job/submit"], user=spec.user, body=body,
                                  submitting=True)
        self._raise_for(status, data, submitting=True)
        job_id = (data or {}).get("job_id")
        if job_id is None:
            raise AmbiguousSubmit(f"slurmrestd answered {status} without a job id",
                                  backend="slurm")
        return str(job_id)

    def jobs(self) -> list[Record]:
        self.negotiate()
        status, data = self._send("GET", self._paths["jobs"])
        self._raise_for(status, data)
        return list(data.get("jobs") or [])

    # Above this many unseen jobs one full listing is cheaper than one GET per job.
    FETCH_ONE_BY_ONE_MAX = 16

    def comments(self, known: Mapping[str, str]) -> dict[str, str]:
        self.negotiate()
        if "jobs/state" not in self._paths:  # v0.0.38: only the full listing exists
            return super().comments(known)
        # 23.02+: /jobs/state lists ids and states only (~5 ms for 300 jobs where the
        # full listing takes ~200 ms); fetch the comment only of jobs not seen before.
        status, data = self._send("GET", self._paths["jobs/state"])
        self._raise_for(status, data)
        ids = [str(r.get("job_id")) for r in data.get("jobs") or []]
        unseen = [i for i in ids if i not in known]
        if len(unseen) > self.FETCH_ONE_BY_ONE_MAX:
            return super().comments(known)
        out = {i: known[i] for i in ids if i in known}
        for i in unseen:
            rec = self.job(i)
            if rec is not None:
                out[i] = str(rec.get("comment") or "")
        return out

    def job(self, job_id: str) -> Record | None:
        self.negotiate()
        status, data = self._send("GET", self._paths["job"] + str(job_id))
        try:
            self._raise_for(status, data)
        except JobNotFound:
            return None
        for rec in data.get("jobs") or []:
            if str(rec.get("job_id")) == str(job_id):
                return rec
        return None

    def cancel(self, job_id: str) -> None:
        self.negotiate()
        stop(lambda: self._raise_for(*self._send("DELETE", self._paths["job"] + str(job_id))))

    def signal(self, job_id: str, signal: str) -> None:
        version = self.negotiate()
        # v0.0.41 and later take flags=BATCH_JOB (scancel --batch); v0.0.38-0.0.40 know only
        # the signal, which then goes to every step of the job, the batch step included.
        query = f"?signal=SIG{signal}" + ("&flags=BATCH_JOB" if version >= "v0.0.41" else "")
        stop(lambda: self._raise_for(*self._send("DELETE", self._paths["job"] + str(job_id) + query)))

    def nodes(self) -> list[Record]:
        self.negotiate()
        status, data = self._send("GET", self._paths["nodes"])
        self._raise_for(status, data)
        return list(data.get("nodes") or [])

    def reservations(self) -> list[Record]:
        # v0.0.38 dumps times as plain numbers, v0.0.40+ as {"set", "infinite", "number"}.
        self.negotiate()
        status, data = self._send("GET", self._paths["reservations"])
        self._raise_for(status, data)
        return list(data.get("reservations") or [])

    def writes_reservations(self) -> bool:
        self.negotiate()
        return "reservation" in self._paths

    def create_reservation(self, spec: ReservationSpec) -> str:
        """``POST .../reservation`` (v0.0.43+)."""
        if not self.writes_reservations():
            raise Unsupported(f"slurmrestd {self.negotiate()} cannot write reservations (v0.0.43 and later can)",
                              backend="slurm")
        body = {"name": spec.name, "partition": spec.partition, "accounts": list(spec.accounts),
                "node_count": spec.node_count, "start_time": int(spec.start.timestamp()),
                "end_time": int(spec.end.timestamp())}
        status, data = self._send("POST", self._paths["reservation"], body=body)
        self._raise_for(status, data)
        return f"slurmrestd (POST {self._paths['reservation']})"

    def delete_reservation(self, name: str) -> None:
        if not self.writes_reservations():
            raise Unsupported(f"slurmrestd {self.negotiate()} cannot write reservations", backend="slurm")
        status, data = self._send("DELETE", f"{self._paths['reservation']}/{name}")
        if status == 404 or any(no_such_reservation(text or "") for text, _ in self._errors(data)):
            return
        self._raise_for(status, data)

    def close(self) -> None:
        self._client.close()
