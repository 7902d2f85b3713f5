"""Map Slurm's error numbers and messages to the contract's typed errors."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from adapters.base import (
    BackendError,
    BackendForbidden,
    BackendUnavailable,
    JobNotFound,
    SubmissionRejected,
)

SLURM_PROTOCOL_AUTHENTICATION_ERROR = 1007
ESLURM_INVALID_JOB_ID = 2017
ESLURM_ALREADY_DONE = 2021

_UNAVAILABLE_TEXT = (
    "unable to contact slurm controller", "socket timed out", "connection refused",
    "zero bytes were transmitted", "communication connection failure",
    "communication send failure", "communication receive failure", "connect failure",
    "slurm controller is not responding", "unable to connect",
    "munge", "resource temporarily unavailable",
)
_FORBIDDEN_TEXT = (
    "access/permission denied", "invalid user", "user not found", "authentication",
    "unable to find user", "user id missing", "permission denied", "invalid uid",
)
_NOT_FOUND_TEXT = ("invalid job id",)
_DONE_TEXT = ("already completing or completed", "job/step already")


class AmbiguousSubmit(BackendUnavailable):
    """The submission was sent but its answer was lost; the job may exist."""


class AlreadyDone(BackendUnavailable):
    """Slurm says the job is already completing or completed (a cancel or signal came late).

    A BackendUnavailable, as this answer was before it had a type of its own, for any call but
    a stop; :func:`stop` takes it for success."""


def stop(call: Callable[[], object]) -> None:
    """Cancel or signal a job with ``call``, by the rule every transport (REST, CLI, pyslurm)
    follows: a job Slurm says is finished, or does not know (gone after MinJobAge, never
    submitted), is stopped already, so that is success. Any other error is raised."""
    try:
        call()
    except (JobNotFound, AlreadyDone):
        return


def is_done(message: str, number: int | None = None) -> bool:
    return number == ESLURM_ALREADY_DONE or any(t in message.lower() for t in _DONE_TEXT)


_NO_RESERVATION_TEXT = ("invalid reservation", "reservation is invalid", "reservation not found")


def no_such_reservation(message: str) -> bool:
    """Slurm's words for a reservation name it does not have (deleting one twice is fine)."""
    return any(t in message.lower() for t in _NO_RESERVATION_TEXT)


def classify(message: str, number: int | None = None, *, submitting: bool = False) -> BackendError:
    """The typed error for one Slurm error. ``message`` is Slurm's own text, kept."""
    text = message.lower()
    if number == ESLURM_INVALID_JOB_ID or any(t in text for t in _NOT_FOUND_TEXT):
        return JobNotFound(message, backend="slurm")
    if is_done(message, number) and not submitting:
        return AlreadyDone(message, backend="slurm")
    if number == SLURM_PROTOCOL_AUTHENTICATION_ERROR:
        return BackendForbidden(f"slurmctld rejected the credentials: {message}", backend="slurm")
    if number == -1 and text.startswith("unspecified error") and not submitting:
        # Slurm 22.05 reports both "slurmctld unreachable" and "token rejected" as -1.
        return BackendUnavailable(
            f"{message} (slurmctld unreachable, or it rejected the token; see its log)",
            backend="slurm")
    if number is not None and (1000 <= number < 2000 or 5000 <= number < 6000):
        return BackendUnavailable(message, backend="slurm")
    if any(t in text for t in _FORBIDDEN_TEXT):
        return BackendForbidden(message, backend="slurm")
    if any(t in text for t in _UNAVAILABLE_TEXT):
        return BackendUnavailable(message, backend="slurm")
    if submitting:
        return SubmissionRejected(message, backend="slurm")
    return BackendUnavailable(message, backend="slurm")


def slurm_errors(data: Any) -> list[tuple[str, int | None]]:
    """``(text, number)`` for each entry of a Slurm JSON ``errors`` list."""
    out = []
    for err in (data or {}).get("errors") or [] if isinstance(data, dict) else []:
        num = err.get("error_number", err.get("error_code", err.get("errno")))
        text = "; ".join(str(t) for t in (err.get("error"), err.get("description")) if t)
        if num in (0, None) and not text:
            continue
        out.append((text or "unknown slurm error", num))
    return out


def error_from(data: Any, *, submitting: bool = False) -> BackendError | None:
    """The typed error for a Slurm JSON answer, or None when it carries no error.

    The most specific entry decides; Slurm often adds a generic one next to it.
    """
    classified = [classify(t, n, submitting=submitting) for t, n in slurm_errors(data)]
    for kind in (JobNotFound, AlreadyDone, BackendForbidden, SubmissionRejected):
        for exc in classified:
            if type(exc) is kind:
                return exc
    return classified[0] if classified else None
