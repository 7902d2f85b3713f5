"""What a waiting reason means: the one comparison of two "why is my job not running" texts.

A dispatch round writes a pending job's reason, and a ``waiting`` event, only when the reason
changes in meaning (gateway/jobs/claims.py ``Claims.note_waiting``; issue #47). Two texts mean
the same when they differ only in what each dispatch worker sees for itself, round by round:

- counters and times: free GPUs and idle nodes, queue depths, the fair-share position, a
  planned start, "retry in 12 s";
- an unavailable pool's error text: ``"pool: unavailable (<error>)"`` is its cause and pool, and
  the error's words vary with the attempt and the process (connection refused or timed out,
  a urllib3 object's address in it);
- the order of pools and of a parenthesised list (each worker ranks pools by its own snapshot).

Everything else is meaning: the cause (waiting for capacity, held, quota, reclaiming), which
pools, their states (unavailable, drained, cannot run this job and why), the names of limits,
accounts, reservations and jobs. Names with digits (``a100``, ``team-1``) are kept whole.
"""

from __future__ import annotations

import re

_POSITION = re.compile(r" \(fair-share position \d+\)$")
# An ISO time (a planned start), then a number standing alone (not part of a name: a100, team-1, v0.0.41).
_TIME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?")
_NUMBER = re.compile(r"(?<![\w.-])\d+(?:\.\d+)?(?![\w-])")
_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")
_UNAVAILABLE = ": unavailable ("
# The cause before a list of per-pool notes (routing.route, decide._plan_round), kept in front.
_CAUSE = re.compile(r"^(?:waiting for capacity|quota|held): ")


def meaning(reason: str | None) -> str:
    """The reason with what does not change its meaning taken out: equal for the same situation."""
    text = _POSITION.sub("", reason or "")
    text = _drop_unavailable_details(text)
    text = _TIME.sub("<time>", text)
    text = _ADDRESS.sub("<address>", text)
    text = _NUMBER.sub("#", text)
    cause = _CAUSE.match(text)
    head, text = (cause.group(0), text[cause.end():]) if cause else ("", text)
    return head + "; ".join(sorted(_sorted_lists(part) for part in _split(text, "; ")))


def same_meaning(old: str | None, new: str | None) -> bool:
    """Whether a job whose reason is ``old`` learns nothing from ``new`` (no write, no event)."""
    return old == new or meaning(old) == meaning(new)


def _drop_unavailable_details(text: str) -> str:
    """``"pool: unavailable (<anything, nested or not>)"`` -> ``"pool: unavailable"``."""
    out, at = [], 0
    while (found := text.find(_UNAVAILABLE, at)) >= 0:
        out.append(text[at:found] + ": unavailable")
        depth, i = 1, found + len(_UNAVAILABLE)
        while i < len(text) and depth:
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            i += 1
        if depth:  # unbalanced (a truncated error text): its detail runs to the next note
            nxt = text.find("; ", found + len(_UNAVAILABLE))
            i = len(text) if nxt < 0 else nxt
        at = i
    out.append(text[at:])
    return "".join(out)


def _split(text: str, sep: str) -> list[str]:
    """``text`` split at ``sep`` outside parentheses."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(text):
        ch = text[i]
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth <= 0 and text.startswith(sep, i):
            parts.append(text[start:i])
            start = i = i + len(sep)
            continue
        i += 1
    parts.append(text[start:])
    return parts


def _sorted_lists(text: str) -> str:
    """Each innermost ``(a, b, c)`` with its items in order: a list of pools or jobs, whoever ranked it."""
    return re.sub(r"\(([^()]*, [^()]*)\)", lambda m: "(" + ", ".join(sorted(m.group(1).split(", "))) + ")", text)
