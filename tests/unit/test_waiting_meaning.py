"""domain/waiting.py: when a waiting reason is new (a write and a ``waiting`` event) and when it
only says again what the job's reason says (issue #47, 6; docs/dispatch.md)."""

from __future__ import annotations

import pytest

from gateway.domain.waiting import meaning, same_meaning

REFUSED = "slurmrestd unreachable at http://127.0.0.1:6820: [Errno 111] Connection refused"
TIMED_OUT = "slurmrestd did not answer: ReadTimeout('timed out')"
URLLIB = ("reading ClusterQueue cq: Kubernetes API unreachable (MaxRetryError: HTTPSConnectionPool(host='10.0.0.1', "
          "port=6443): Max retries exceeded (Caused by NewConnectionError('<urllib3.connection.HTTPSConnection "
          "object at 0x7f3a2c1b5d10>: Failed to establish a new connection')))")


def capacity(*notes: str, position: int | None = None) -> str:
    text = "waiting for capacity: " + "; ".join(notes)
    return text if position is None else f"{text} (fair-share position {position})"


@pytest.mark.parametrize(("old", "new"), [
    pytest.param(capacity("busy: 0 of 64 GPUs free", f"down: unavailable ({REFUSED})", position=3),
                 capacity("busy: 8 of 64 GPUs free", f"down: unavailable ({TIMED_OUT})", position=7),
                 id="two-workers-views"),
    pytest.param(capacity(f"kube-a: unavailable ({URLLIB})"),
                 capacity(f"kube-a: unavailable ({URLLIB.replace('0x7f3a2c1b5d10', '0x7f00deadbeef')})"),
                 id="an-object-address"),
    pytest.param(capacity("a: 1 of 8 nodes idle (8 of 64 GPUs free)", "b: 0 of 16 GPUs free"),
                 capacity("b: 8 of 16 GPUs free", "a: 0 of 8 nodes idle (0 of 64 GPUs free)"),
                 id="pools-in-another-order"),
    pytest.param(capacity("reserved on a: planned start 2026-12-07T19:00:00+00:00, the earliest of the pools it "
                          "may use (a, b-1) as running jobs reach their time limits", position=1),
                 capacity("reserved on a: planned start 2026-12-07T19:03:12+00:00, the earliest of the pools it "
                          "may use (b-1, a) as running jobs reach their time limits", position=2),
                 id="a-planned-start-that-moves"),
    pytest.param("held: team-a has used 120.5 of its 100 GPU-hours this month",
                 "held: team-a has used 121.25 of its 100 GPU-hours this month", id="a-counter-in-a-hold"),
    pytest.param("waiting for capacity: x (fair-share position 3)", "waiting for capacity: x (fair-share position 4)",
                 id="the-position"),
])
def test_the_same_situation_in_other_words_is_not_a_new_reason(old, new):
    assert old != new and same_meaning(old, new) and meaning(old) == meaning(new)


@pytest.mark.parametrize(("old", "new"), [
    pytest.param("waiting for dispatch", capacity("a: 0 of 8 GPUs free"), id="first-round"),
    pytest.param(capacity("a: 0 of 8 GPUs free", f"b: unavailable ({REFUSED})"),
                 capacity("a: draining (takes no new jobs)", f"b: unavailable ({REFUSED})"), id="a-pool-drained"),
    pytest.param(capacity("a: 0 of 8 GPUs free", f"b: unavailable ({REFUSED})"),
                 capacity("a: 0 of 8 GPUs free", "b: 0 of 8 GPUs free"), id="a-pool-is-back"),
    pytest.param(capacity("a: 0 of 8 GPUs free"), capacity("a: 0 of 8 GPUs free", "b: 0 of 8 GPUs free"),
                 id="a-pool-added"),
    pytest.param(capacity("a100-x: 0 of 8 GPUs free"), capacity("a100-y: 0 of 8 GPUs free"), id="another-pool"),
    pytest.param(capacity("a: 0 of 8 GPUs free"), "quota: team-1's max_gpus reached on a", id="another-cause"),
    pytest.param("quota: team-1's max_gpus reached on a", "quota: team-2's max_gpus reached on a",
                 id="another-account"),
    pytest.param("reclaiming borrowed GPUs: waiting for the jobs it stops (j-1, j-2) to give them back",
                 "reclaiming borrowed GPUs: waiting for the jobs it stops (j-1, j-3) to give them back",
                 id="other-victims"),
])
def test_a_change_in_meaning_is_a_new_reason(old, new):
    assert not same_meaning(old, new)


def test_an_unbalanced_error_text_stays_within_its_note():
    cut = capacity("a: unavailable (slurmrestd answered 500: <html>(oops", "b: 0 of 8 GPUs free")
    assert meaning(cut) == "waiting for capacity: a: unavailable; b: # of # GPUs free"
