"""Strings that are not Unicode: lone UTF-16 surrogates (issue #45, finding 4; docs/security.md 45.4).

JSON lets a client write ``"\\udfff"``, and Python decodes it into a str that no UTF-8 encoder
takes: stored, it made every list page holding the row answer 500, and in a group-commit
batch it rolled back the whole batch. Every request body is checked once, before any route
sees it (gateway/identity/bodylimit.py), and refused with a 422 naming the field; a row stored
before that check still renders (:class:`JSONResponse`, the app's default response class).
"""

from __future__ import annotations

import json
import re
from typing import Any

from fastapi.responses import JSONResponse as _JSONResponse

# A JSON escape in the surrogate range, in the raw body: only then is the body parsed to look.
# (A valid pair, e.g. an emoji as Python's json.dumps writes it, is parsed too: telling a lone
# escape from a pair in the raw bytes needs the parity of the backslashes before it, and a
# mistake there would let a lone one through; the parse is ~20 us: bench/bench_unicode_gate.py.)
_ESCAPED_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_LONE = re.compile("[\ud800-\udfff]")


def has_lone_surrogate(text: str) -> bool:
    """Whether ``text`` holds a surrogate code point (a pair in JSON decodes to one character, never to these)."""
    return _LONE.search(text) is not None


def lone_surrogate_field(body: bytes) -> str | None:
    """The path (``body.env.A``, ``body.tasks.0.name``) of the first string or key of a JSON
    body that holds a lone surrogate, or None. A body that is not JSON is the app's to refuse."""
    if not _ESCAPED_SURROGATE.search(body):  # one scan, faster than bytes.find of b"\\u" here
        return None
    try:
        doc = json.loads(body)
    except ValueError:
        return None
    return _walk(doc, "body")


def _walk(value: Any, path: str) -> str | None:
    if isinstance(value, str):
        return path if has_lone_surrogate(value) else None
    if isinstance(value, dict):
        for key, item in value.items():
            here = f"{path}.{key}"
            if has_lone_surrogate(key):
                return here
            if (found := _walk(item, here)) is not None:
                return found
    elif isinstance(value, list):
        for i, item in enumerate(value):
            if (found := _walk(item, f"{path}.{i}")) is not None:
                return found
    return None


class JSONResponse(_JSONResponse):
    """FastAPI's JSON response, which still renders a string a UTF-8 encoder refuses.

    Such a string can only be a row stored before bodies were checked: it is sent as JSON's
    own escape (``\\udfff``), valid JSON text, instead of failing the whole answer with a 500.
    The usual path costs nothing more."""

    def render(self, content: Any) -> bytes:
        try:
            return super().render(content)
        except UnicodeEncodeError:
            return json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode("ascii")
