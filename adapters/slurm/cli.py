"""CLI transport: sbatch/squeue/scancel run as the target user, argv lists only."""

from __future__ import annotations

import json
import os
import pwd
import re
import shlex
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

from adapters.base import BackendUnavailable, JobNotFound
from adapters.slurm import parse
from adapters.slurm.errors import (
    AmbiguousSubmit,
    classify,
    error_from,
    no_such_reservation,
    stop,
)
from adapters.slurm.script import JobSpec, ReservationSpec, slurm_duration
from adapters.slurm.transport import Record, Transport

_SUBMIT_ERROR = re.compile(r"(?:sbatch: error: )?(?:Batch job submission failed: )?(.*)", re.DOTALL)


class CliTransport(Transport):
    """Runs Slurm's commands, optionally behind a prefix such as ``chroot <dir>``.

    Jobs are submitted as the mapped user via ``runuser -u <user> --`` (the gateway runs
    as root or a user allowed to run runuser). Queries and cancels run as
    ``admin_user`` (default: the gateway's own user), which must be root, SlurmUser or a
    Slurm operator to cancel other users' jobs.
    """

    name = "cli"

    def __init__(self, *, slurm_conf: str | None = None, prefix: Sequence[str] | str = (),
                 timeout_s: float = 30.0, admin_user: str | None = None,
                 path: str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"):
        self._prefix = shlex.split(prefix) if isinstance(prefix, str) else list(prefix)
        self._conf = slurm_conf
        self._timeout_s = timeout_s
        self._admin_user = admin_user
        self._path = path
        self._json_scontrol: bool | None = None

    def _env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        env = {"PATH": self._path, "LANG": "C.UTF-8"}
        if self._conf:
            env["SLURM_CONF"] = self._conf
        env.update(extra or {})
        return env

    def _argv(self, argv: Sequence[str], user: str | None) -> list[str]:
        me = pwd.getpwuid(os.geteuid()).pw_name
        if user and user != me:
            return [*self._prefix, "runuser", "-u", user, "--", *argv]
        return [*self._prefix, *argv]

    def _run(self, argv: Sequence[str], *, user: str | None = None, stdin: str | None = None,
             job_env: Mapping[str, str] | None = None, submitting: bool = False,
             env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        if job_env is not None:
            # sbatch exports its own environment to the job: give it exactly job_env
            # (each KEY=VALUE is one argv word, so nothing is shell-parsed).
            argv = ["env", "-i", *(f"{k}={v}" for k, v in job_env.items()), *argv]
        full = self._argv(argv, user)
        full[0] = shutil.which(full[0], path=self._path) or full[0]
        try:
            return subprocess.run(full, input=stdin, capture_output=True, text=True,
                                  env=self._env(env), timeout=self._timeout_s, check=False)
        except subprocess.TimeoutExpired as exc:
            cls = AmbiguousSubmit if submitting else BackendUnavailable
            raise cls(f"{argv[0]} timed out after {self._timeout_s}s", backend="slurm") from exc
        except OSError as exc:
            raise BackendUnavailable(f"cannot run {argv[0]}: {exc}", backend="slurm") from exc

    @staticmethod
    def _message(proc: subprocess.CompletedProcess[str]) -> str:
        text = (proc.stderr or proc.stdout or "").strip()
        lines = [ln for ln in text.splitlines() if ln.strip()]
        return lines[-1] if lines else f"exit status {proc.returncode}"

    def _json(self, argv: Sequence[str]) -> dict:
        proc = self._run(argv, user=self._admin_user)
        if proc.returncode != 0:
            raise classify(self._message(proc))
        try:
            data = json.loads(proc.stdout)
        except ValueError as exc:
            raise BackendUnavailable(f"{argv[0]} printed invalid JSON", backend="slurm") from exc
        # 22.05 exits 0 with the failure (e.g. slurmctld down) inside "errors".
        exc = error_from(data)
        if exc is not None:
            raise exc
        return data

    # ------------------------------------------------------------------ requests

    def submit(self, spec: JobSpec, environment: Mapping[str, str]) -> str:
        argv = [
            "sbatch", "--parsable",
            f"--job-name={spec.name}", f"--comment={spec.comment}",
            f"--partition={spec.partition}",
            f"--nodes={spec.nodes}", "--ntasks-per-node=1",
            f"--cpus-per-task={spec.cpus_per_node}", f"--mem={spec.memory_mib_per_node}",
            "--exclusive", f"--time={spec.time_limit_min}",
            "--requeue" if spec.requeue else "--no-requeue",
            f"--chdir={spec.work_dir}", f"--output={spec.output}",
        ]
        if spec.gres:
            argv.append(f"--gres={spec.gres}")
        if spec.account:
            argv.append(f"--account={spec.account}")
        if spec.reservation:
            argv.append(f"--reservation={spec.reservation}")
        if spec.exclude:
            argv.append(f"--exclude={','.join(spec.exclude)}")
        if spec.segment:
            argv.append(f"--segment={spec.segment}")
        if spec.switches_wait_s:
            argv.append(f"--switches=1@{slurm_duration(spec.switches_wait_s)}")
        # The script arrives on stdin; sbatch exports this (clean) environment to the job.
        job_env = dict(environment)
        if self._conf:
            job_env.setdefault("SLURM_CONF", self._conf)
        proc = self._run(argv, user=spec.user, stdin=spec.script, job_env=job_env,
                         submitting=True)
        if proc.returncode != 0:
            msg = self._message(proc)
            m = _SUBMIT_ERROR.match(msg)
            raise classify(m.group(1) if m else msg, submitting=True)
        job_id = proc.stdout.strip().split(";")[0]
        if not job_id.isdigit():
            raise AmbiguousSubmit(f"sbatch printed {proc.stdout!r}", backend="slurm")
        return job_id

    def jobs(self) -> list[Record]:
        # 22.05 ignores squeue filters with --json, so filter client-side everywhere.
        return list(self._json(["squeue", "--json", "--states=all"]).get("jobs") or [])

    def job(self, job_id: str) -> Record | None:
        if self._json_scontrol is not False:  # 23.02+: ask for this one job only
            proc = self._run(["scontrol", "--json", "show", "job", str(job_id)],
                             user=self._admin_user)
            if proc.returncode == 0 or "unrecognized option" not in (proc.stderr or ""):
                self._json_scontrol = True
                try:
                    data = json.loads(proc.stdout) if proc.stdout.strip() else {}
                except ValueError as exc:
                    raise BackendUnavailable("scontrol printed invalid JSON", backend="slurm") from exc
                err = error_from(data) or (None if proc.returncode == 0 else classify(self._message(proc)))
                if isinstance(err, JobNotFound):
                    return None
                if err is not None:
                    raise err
                for rec in data.get("jobs") or []:
                    if str(rec.get("job_id")) == str(job_id):
                        return rec
                return None
            self._json_scontrol = False  # 22.05: no scontrol --json
        return super().job(job_id)

    def comments(self, known: Mapping[str, str]) -> dict[str, str]:
        # Plain-text squeue is ~10x cheaper than --json and prints the whole comment.
        proc = self._run(["squeue", "--noheader", "--states=all", "--format=%i|%k"],
                         user=self._admin_user)
        if proc.returncode != 0:
            raise classify(self._message(proc))
        out = {}
        for line in proc.stdout.splitlines():
            job_id, _, comment = line.partition("|")
            if job_id.strip():
                out[job_id.strip()] = "" if comment == "(null)" else comment
        return out

    def _scancel(self, *argv: str) -> None:
        proc = self._run(["scancel", *argv], user=self._admin_user)
        if proc.returncode != 0:
            raise classify(self._message(proc))

    def cancel(self, job_id: str) -> None:
        stop(lambda: self._scancel(str(job_id)))

    def signal(self, job_id: str, signal: str) -> None:
        stop(lambda: self._scancel("--batch", f"--signal={signal}", str(job_id)))

    def _scontrol_json(self, *what: str) -> dict | None:
        """``scontrol --json show <what>`` (23.02+), or None on 22.05, which has no --json."""
        if self._json_scontrol is False:
            return None
        proc = self._run(["scontrol", "--json", "show", *what], user=self._admin_user)
        if proc.returncode != 0:
            if "unrecognized option" in (proc.stderr or ""):
                self._json_scontrol = False
                return None
            raise classify(self._message(proc))
        self._json_scontrol = True
        try:
            data = json.loads(proc.stdout)
        except ValueError as exc:
            raise BackendUnavailable("scontrol printed invalid JSON", backend="slurm") from exc
        err = error_from(data)
        if err is not None:
            raise err
        return data

    def nodes(self) -> list[Record]:
        data = self._scontrol_json("nodes")  # 23.02+; their sinfo --json groups by partition
        if data is not None:
            return list(data.get("nodes") or [])
        return list(self._json(["sinfo", "--json"]).get("nodes") or [])

    def writes_reservations(self) -> bool:
        return True

    def update_node(self, node: str, state: str, reason: str = "") -> None:
        argv = ["scontrol", "update", f"NodeName={node}", f"State={state}"]
        if reason:
            argv.append(f"Reason={reason}")
        proc = self._run(argv, user=self._admin_user)
        if proc.returncode != 0:
            raise classify(self._message(proc))

    def topology(self) -> str:
        """``scontrol show topology`` as printed (parse.topology_text reads it)."""
        proc = self._run(["scontrol", "show", "topology"], user=self._admin_user)
        if proc.returncode != 0:
            msg = self._message(proc)
            if "no topology" in msg.lower():
                return ""
            raise classify(msg)
        return proc.stdout

    def create_reservation(self, spec: ReservationSpec) -> str:
        """``scontrol create reservation``. Times are given in UTC, and scontrol told its zone is
        UTC (a chroot may have its own)."""
        def at(t: datetime) -> str:
            return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S")

        proc = self._run(["scontrol", "create", "reservation", f"ReservationName={spec.name}",
                          f"StartTime={at(spec.start)}", f"EndTime={at(spec.end)}", f"Accounts={','.join(spec.accounts)}",
                          f"NodeCnt={spec.node_count}", f"PartitionName={spec.partition}"],
                         user=self._admin_user, env={"TZ": "UTC"})
        if proc.returncode != 0:
            raise classify(self._message(proc))
        return "scontrol create reservation"

    def delete_reservation(self, name: str) -> None:
        proc = self._run(["scontrol", "delete", f"ReservationName={name}"], user=self._admin_user)
        if proc.returncode != 0:
            msg = self._message(proc)
            if no_such_reservation(msg):
                return
            raise classify(msg)

    def reservations(self) -> list[Record]:
        data = self._scontrol_json("reservations")
        if data is not None:
            return list(data.get("reservations") or [])
        # 22.05: text, one reservation a line. Its times are local to wherever scontrol runs
        # (a chroot may have its own zone): ask for epoch seconds, and for UTC should a
        # scontrol not honour that format.
        proc = self._run(["scontrol", "--oneliner", "show", "reservation"], user=self._admin_user,
                         env={"SLURM_TIME_FORMAT": "%s", "TZ": "UTC"})
        if proc.returncode != 0:
            raise classify(self._message(proc))
        return parse.reservation_text(proc.stdout, tz=UTC)  # "No reservations in the system": []
