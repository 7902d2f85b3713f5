"""Job + Workload + pods -> gateway state (pure functions, unit-testable without a cluster)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from adapters.base import NODE_FAILURE, TIME_LIMIT, BackendState, JobStatus

from .render import ANN_CANCELLED_AT, ANN_GATEWAY_ID, ANN_GPUS_PER_WORKER, ANN_WORKERS

Obj = Mapping[str, Any]


def parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    return datetime.fromisoformat(value)


def conditions(obj: Obj | None) -> dict[str, Obj]:
    if not obj:
        return {}
    return {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or []}


def _true(conds: Mapping[str, Obj], kind: str) -> Obj | None:
    c = conds.get(kind)
    return c if c is not None and c.get("status") == "True" else None


def _msg(c: Obj | None, default: str = "") -> str:
    if not c:
        return default
    reason, message = c.get("reason") or "", c.get("message") or ""
    return f"{reason}: {message}" if reason and message else (message or reason or default)


def backend_job_id(job: Obj) -> str:
    return f"{job['metadata']['namespace']}/{job['metadata']['name']}"


def exit_code_of(pods: Sequence[Obj]) -> int | None:
    """The first non-zero container exit code among the pods (the failing worker)."""
    codes = []
    for pod in pods:
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            term = (cs.get("state") or {}).get("terminated") or (cs.get("lastState") or {}).get("terminated")
            if term and term.get("exitCode") is not None:
                codes.append(int(term["exitCode"]))
    nonzero = [c for c in codes if c != 0]
    return nonzero[0] if nonzero else (0 if codes else None)


def failure_of(pods: Sequence[Obj], failed: Obj | None = None) -> str:
    """``NODE_FAILURE`` when a worker was taken down by its node, not by its own doing: the
    pod carries the ``DisruptionTarget`` condition (node lost and its pods garbage-collected,
    a taint eviction, the kubelet's node-pressure or shutdown termination, an API eviction),
    or, once such a pod is gone, the Job's failure condition ``failed`` says that its pod
    failure policy's DisruptionTarget rule failed it (render.py)."""
    if failed is not None and failed.get("reason") == "PodFailurePolicy" \
            and "DisruptionTarget" in str(failed.get("message") or ""):
        return NODE_FAILURE
    for pod in pods:
        for cond in (pod.get("status") or {}).get("conditions") or []:
            if cond.get("type") == "DisruptionTarget" and cond.get("status") == "True":
                return NODE_FAILURE
    return ""


def derive_status(job: Obj, workload: Obj | None, pods: Sequence[Obj]) -> JobStatus:
    meta = job["metadata"]
    ann = meta.get("annotations") or {}
    spec, jstatus = job.get("spec") or {}, job.get("status") or {}
    workers = int(ann.get(ANN_WORKERS) or spec.get("parallelism") or 1)
    gpus = workers * int(ann.get(ANN_GPUS_PER_WORKER) or 0)
    jc, wc = conditions(job), conditions(workload)
    live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    running = [p for p in live if (p.get("status") or {}).get("phase") == "Running"]
    nodes = tuple(sorted({p["spec"].get("nodeName") for p in running if p["spec"].get("nodeName")}))
    # Where the gang ran, for an ended job: a short one can start and end between two looks.
    ran_on = tuple(sorted({p["spec"].get("nodeName") for p in pods if p["spec"].get("nodeName")
                           and (p.get("status") or {}).get("phase") in ("Running", "Succeeded", "Failed")}))
    pod_starts = [parse_time((p.get("status") or {}).get("startTime")) for p in pods]
    pod_starts = [t for t in pod_starts if t]
    # The gang started when its last worker started; fall back to the Job's own start.
    started_at = (max(pod_starts) if len(pod_starts) >= workers else None) or parse_time(jstatus.get("startTime"))
    raw = " ".join(
        [f"job:{','.join(['suspended' if spec.get('suspend') else 'unsuspended'] + [k for k in jc if _true(jc, k)])}"]
        + ([f"workload:{','.join(k for k in wc if _true(wc, k)) or 'Pending'}"] if workload else ["workload:none"])
    )
    # A gang Kueue evicted held its GPUs until the Workload's quota reservation was released:
    # that is when the requeue took them (while still reserved, they are held now).
    quota = wc.get("QuotaReserved")
    was_evicted = any(k in wc for k in ("Evicted", "Preempted", "Requeued"))
    requeued_at = (parse_time(quota.get("lastTransitionTime"))
                   if was_evicted and quota is not None and quota.get("status") == "False" else None)
    base = dict(backend_job_id=backend_job_id(job), gateway_job_id=ann.get(ANN_GATEWAY_ID), raw_state=raw)

    if ann.get(ANN_CANCELLED_AT):
        ended = parse_time(ann[ANN_CANCELLED_AT])
        return JobStatus(**base, state=BackendState.CANCELLED, reason="cancelled through the gateway",
                         started_at=started_at if started_at and ended and started_at <= ended else None,
                         ended_at=ended)
    if c := _true(jc, "Complete"):
        ended = parse_time(jstatus.get("completionTime")) or parse_time(c.get("lastTransitionTime"))
        return JobStatus(**base, state=BackendState.SUCCEEDED, reason=_msg(c, "Complete"), exit_code=0,
                         started_at=min(started_at, ended) if started_at and ended else started_at or ended,
                         ended_at=ended, nodes=ran_on)
    if c := (_true(jc, "Failed") or _true(jc, "FailureTarget")):
        ended = parse_time(c.get("lastTransitionTime"))
        return JobStatus(**base, state=BackendState.FAILED, reason=_msg(c, "Failed"), exit_code=exit_code_of(pods),
                         started_at=started_at, ended_at=ended, nodes=ran_on,
                         failure=TIME_LIMIT if c.get("reason") == "DeadlineExceeded" else failure_of(pods, c))
    if workload is None:
        return JobStatus(**base, state=BackendState.QUEUED, reason="waiting for Kueue to create the Workload")
    if c := _true(wc, "Finished"):
        ok = c.get("reason") == "Succeeded"
        return JobStatus(**base, state=BackendState.SUCCEEDED if ok else BackendState.FAILED, reason=_msg(c),
                         exit_code=0 if ok else exit_code_of(pods), started_at=started_at,
                         ended_at=parse_time(c.get("lastTransitionTime")), nodes=ran_on)
    reserved = _true(wc, "QuotaReserved")
    evicted = _true(wc, "Evicted") or _true(wc, "Preempted")
    # An eviction newer than the current reservation wins: the gang is being taken down.
    if evicted and (not reserved or (evicted.get("lastTransitionTime") or "") >= (reserved.get("lastTransitionTime") or "")):
        return JobStatus(**base, state=BackendState.REQUEUED, reason=_msg(evicted, "evicted by Kueue"),
                         requeued_at=requeued_at)
    if reserved:
        # Workers that already finished count: the whole gang did start (a step back to
        # STARTING while the peers of an early finisher still run would be wrong).
        started = [p for p in live if (p.get("status") or {}).get("phase") in ("Running", "Succeeded", "Failed")]
        all_running = (len(started) >= workers and running) or _true(wc, "PodsReady") is not None
        if all_running and not spec.get("suspend"):
            return JobStatus(**base, state=BackendState.RUNNING, reason=_msg(_true(wc, "Admitted") or reserved),
                             started_at=started_at, nodes=nodes, allocated_gpus=gpus)
        return JobStatus(**base, state=BackendState.STARTING,
                         reason=f"admitted by Kueue; {len(running)}/{workers} workers running",
                         nodes=nodes, allocated_gpus=gpus)
    pending = wc.get("QuotaReserved")
    requeued = _true(wc, "Requeued")
    return JobStatus(**base, state=BackendState.QUEUED,
                     reason=_msg(pending, "") or _msg(requeued, "") or "waiting for quota in the ClusterQueue",
                     requeued_at=requeued_at)
