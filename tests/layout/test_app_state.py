"""No service takes the FastAPI app's state object (issue #47, item 1): what a process builds
once (its Databases, Admission, Ledger, event Hubs, dispatcher, authenticator) is made in
gateway/app.py and handed on typed; only the HTTP layer (gateway/api, gateway/ui) and the two
FastAPI dependencies that open a request's transaction and find its caller read it."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HTTP = ("gateway/api/", "gateway/ui/", "gateway/app.py", "gateway/cli.py")
# FastAPI dependencies: each reads one object app.py built, for the request in hand.
DEPENDENCIES = {"gateway/kit/db.py": 1, "gateway/identity/dependency.py": 3}


def test_only_the_http_layer_reads_the_apps_state():
    found: dict[str, int] = {}
    for path in sorted((REPO / "gateway").rglob("*.py")):
        rel = str(path.relative_to(REPO))
        if rel.startswith(HTTP):
            continue
        hits = len(re.findall(r"\bapp\.state\b|\bapp_state\b", path.read_text()))
        if hits:
            found[rel] = hits
    assert found == DEPENDENCIES
