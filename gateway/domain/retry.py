"""When an attempt at a job that failed is run again (docs/recovery.md): one rule, pure.

A job runs as one or more attempts. When one fails, the reconciler asks :func:`verdict`
whether to run it again. The policy is the job's ``retry`` (the spec), else the site's
default: up to ``ISTHMUS_RETRY_MAX_ATTEMPTS`` attempts on infrastructure failures only (a
node failed, booted wrong or was lost under the gang: the backend says so), and every
preempted attempt. A job's own non-zero exit is retried only when its spec asks (``on:
[exit_code]``, optionally only some codes). A time limit, a cancel and anything the backend
does not attribute to its nodes are never retried.

A preemption (the gateway reclaiming borrowed GPUs, or the backend preempting or evicting
the job) is not the job's failure: it is retried whenever ``preempted`` is in ``on`` and is
not counted in ``max_attempts``; a job that is preempted again and again is not failed for it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

NODE_FAILURE = "node_failure"  # adapters.base.NODE_FAILURE: the backend's word for it
EXIT_CODE = "exit_code"
PREEMPTED = "preempted"
DEFAULT_ON = frozenset({NODE_FAILURE, PREEMPTED})


@dataclasses.dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int
    on: frozenset[str] = DEFAULT_ON
    exit_codes: frozenset[int] | None = None  # with EXIT_CODE: only these; None: any non-zero

    def words(self) -> str:
        what = " or ".join(sorted(self.on)).replace("_", " ")
        return f"up to {self.max_attempts} attempts on {what}"


def policy_of(spec: Mapping[str, Any], default_max_attempts: int) -> RetryPolicy:
    """The job's policy: its spec's ``retry``, else the site's default."""
    retry = spec.get("retry")
    if not retry:
        return RetryPolicy(max_attempts=default_max_attempts)
    codes = retry.get("exit_codes")
    return RetryPolicy(max_attempts=int(retry["max_attempts"]), on=frozenset(retry.get("on") or DEFAULT_ON),
                       exit_codes=frozenset(int(c) for c in codes) if codes is not None else None)


def verdict(policy: RetryPolicy, *, attempt: int, failure: str, exit_code: int | None) -> str | None:
    """Why the attempt that ended is run again (``node_failure``, ``preempted`` or
    ``exit_code``), or None when it is not: the job fails.

    ``attempt`` counts the attempts that ended by a failure, this one included (preempted
    attempts are not counted: see the module docstring).
    """
    if failure == PREEMPTED:
        return PREEMPTED if PREEMPTED in policy.on else None
    if attempt >= policy.max_attempts:
        return None
    if failure == NODE_FAILURE:
        return NODE_FAILURE if NODE_FAILURE in policy.on else None
    if failure:
        return None  # a failure the policy has no word for
    if EXIT_CODE in policy.on and exit_code:
        if policy.exit_codes is None or exit_code in policy.exit_codes:
            return EXIT_CODE
    return None
