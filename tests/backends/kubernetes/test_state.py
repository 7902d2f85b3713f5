"""The Job/Workload/pod -> gateway state mapping, on hand-built objects (no cluster)."""

from adapters.base import BackendState
from adapters.kubernetes.render import job_name, label_value
from adapters.kubernetes.state import derive_status

T0, T1, T2 = "2026-01-01T00:00:00Z", "2026-01-01T00:00:05Z", "2026-01-01T00:01:00Z"


def job(conds=(), suspend=False, ann=None, status=None):
    return {"metadata": {"name": "isthmus-x", "namespace": "ns", "uid": "u",
                         "annotations": {"isthmus.io/gateway-job-id": "g", "isthmus.io/workers": "2",
                                         "isthmus.io/gpus-per-worker": "8", **(ann or {})}},
            "spec": {"suspend": suspend, "parallelism": 2},
            "status": {"conditions": [dict(c) for c in conds], **(status or {})}}


def wl(*conds):
    return {"metadata": {"name": "w"}, "status": {"conditions": [dict(c) for c in conds]}}


def c(kind, status="True", reason="", message="", t=T0):
    return {"type": kind, "status": status, "reason": reason, "message": message, "lastTransitionTime": t}


def pod(phase="Running", node="n1", code=None, start=T1):
    st = {"phase": phase, "startTime": start}
    if code is not None:
        st["containerStatuses"] = [{"state": {"terminated": {"exitCode": code}}}]
    return {"metadata": {}, "spec": {"nodeName": node}, "status": st}


def test_no_workload_yet_is_queued():
    assert derive_status(job(suspend=True), None, []).state is BackendState.QUEUED


def test_pending_workload_is_queued_with_kueue_message():
    s = derive_status(job(suspend=True), wl(c("QuotaReserved", "False", "Pending", "insufficient quota")), [])
    assert s.state is BackendState.QUEUED and "insufficient quota" in s.reason and s.allocated_gpus == 0


def test_admitted_partial_pods_is_starting_full_is_running():
    w = wl(c("QuotaReserved"), c("Admitted"))
    assert derive_status(job(), w, [pod()]).state is BackendState.STARTING
    s = derive_status(job(), w, [pod(node="n1"), pod(node="n2")])
    assert s.state is BackendState.RUNNING and s.nodes == ("n1", "n2") and s.allocated_gpus == 16


def test_eviction_newer_than_reservation_is_requeued():
    w = wl(c("QuotaReserved", t=T0), c("Evicted", reason="Preempted", message="preempted by x", t=T1))
    s = derive_status(job(), w, [pod(), pod()])
    assert s.state is BackendState.REQUEUED and "Preempted" in s.reason
    w = wl(c("QuotaReserved", "False", "Pending", "waiting"), c("Evicted", reason="Preempted", t=T1))
    assert derive_status(job(suspend=True), w, []).state is BackendState.REQUEUED


def test_readmitted_after_eviction_is_starting():
    w = wl(c("QuotaReserved", t=T2), c("Evicted", reason="Preempted", t=T1))
    assert derive_status(job(), w, []).state is BackendState.STARTING


def test_complete_and_failed_and_cancelled():
    s = derive_status(job([c("Complete", t=T2)], status={"completionTime": T2}), wl(c("Finished", reason="Succeeded")),
                      [pod("Succeeded", code=0), pod("Succeeded", code=0)])
    assert s.state is BackendState.SUCCEEDED and s.exit_code == 0 and s.started_at <= s.ended_at
    s = derive_status(job([c("Failed", reason="BackoffLimitExceeded", message="Job has reached the specified backoff limit", t=T2)]),
                      None, [pod("Failed", code=3), pod("Running")])
    assert s.state is BackendState.FAILED and s.exit_code == 3 and "backoff" in s.reason
    s = derive_status(job(ann={"isthmus.io/cancelled-at": "2026-01-01T00:00:09+00:00"}), None, [])
    assert s.state is BackendState.CANCELLED and s.ended_at is not None


def test_job_names_are_deterministic_and_valid():
    assert job_name("Abc_1") == job_name("Abc_1") != job_name("abc-1")
    assert len(job_name("x" * 200)) <= 63
    assert label_value("ok-1") == "ok-1" and label_value("not ok!").startswith("h-")


def test_worker_finished_before_its_peers_is_still_running():
    w = wl(c("QuotaReserved"), c("Admitted"))
    s = derive_status(job(), w, [pod("Succeeded", node="n1", code=0), pod("Running", node="n2")])
    assert s.state is BackendState.RUNNING and s.allocated_gpus == 16


def test_a_gang_that_ended_between_two_looks_still_says_where_it_ran():
    # A real container can start and end between two polls: the ended job keeps its nodes.
    s = derive_status(job([c("Complete", t=T2)], status={"completionTime": T2}), wl(c("Finished", reason="Succeeded")),
                      [pod("Succeeded", node="n2", code=0), pod("Succeeded", node="n1", code=0)])
    assert s.nodes == ("n1", "n2")
    s = derive_status(job([c("Failed", t=T2)]), None, [pod("Failed", node="n3", code=1), pod("Pending", node="n4")])
    assert s.nodes == ("n3",)
    s = derive_status(job(), wl(c("Finished", reason="Succeeded", t=T2)), [pod("Succeeded", node="n5", code=0)])
    assert s.nodes == ("n5",)


def test_a_failure_says_whether_a_node_or_the_clock_ended_it():
    lost = pod("Failed", code=137)
    lost["status"]["conditions"] = [{"type": "DisruptionTarget", "status": "True", "reason": "DeletionByPodGC"}]
    s = derive_status(job([c("Failed", reason="BackoffLimitExceeded", t=T2)]), None, [lost, pod("Running")])
    assert s.state is BackendState.FAILED and s.failure == "node_failure"
    s = derive_status(job([c("Failed", reason="DeadlineExceeded", t=T2)]), None, [pod("Failed", code=143)])
    assert s.failure == "time_limit"
    s = derive_status(job([c("Failed", reason="BackoffLimitExceeded", t=T2)]), None, [pod("Failed", code=3)])
    assert s.failure == "" and s.exit_code == 3
    # The pod of a deleted node is gone by the time anyone looks: the Job's own condition,
    # from the DisruptionTarget rule of the pod failure policy the adapter renders, says it.
    gone = c("Failed", reason="PodFailurePolicy", t=T2)
    gone["message"] = "Pod ns/p-0-x has condition DisruptionTarget matching FailJob rule at index 0"
    s = derive_status(job([gone]), None, [])
    assert s.state is BackendState.FAILED and s.failure == "node_failure"
    other = c("Failed", reason="PodFailurePolicy", t=T2)
    other["message"] = "Container worker for pod ns/p-0-x failed with exit code 3 matching FailJob rule at index 1"
    assert derive_status(job([other]), None, []).failure == ""
