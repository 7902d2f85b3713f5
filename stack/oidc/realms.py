"""Create the test realms through Keycloak's admin REST API when they are missing.

Run by up.sh with the system python3 (standard library only):
    BASE_URL=... ADMIN_PASSWORD=... python3 realms.py realm-a.json [realm-b.json ...]
An existing realm is left as it is (tests may have rotated its keys); ``up.sh --reset``
starts from a fresh database instead.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

BASE = os.environ["BASE_URL"]


def call(method: str, path: str, *, token: str | None = None, body=None, form=None, timeout: float = 30):
    headers = {}
    data = None
    if token:
        headers["Authorization"] = f"Bearer {token}"
    if form is not None:
        data = urllib.parse.urlencode(form).encode()
        headers["Content-Type"] = "application/x-www-form-urlencoded"
    elif body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    req = urllib.request.Request(BASE + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
            return resp.status, (json.loads(raw) if raw else None)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")[:500]


def admin_token() -> str:
    last = None
    for _ in range(30):  # the bootstrap admin appears a moment after the first start
        status, body = call("POST", "/realms/master/protocol/openid-connect/token", form={
            "grant_type": "password", "client_id": "admin-cli", "username": "admin",
            "password": os.environ["ADMIN_PASSWORD"]})
        if status == 200:
            return body["access_token"]
        last = (status, body)
        time.sleep(1)
    sys.exit(f"stack/oidc: cannot get an admin token: {last}")


def main(paths: list[str]) -> None:
    token = admin_token()
    for path in paths:
        with open(path) as fh:
            rep = json.load(fh)
        name = rep["realm"]
        status, _ = call("GET", f"/admin/realms/{name}", token=token)
        if status == 200:
            print(f"stack/oidc: realm {name} present", file=sys.stderr)
            continue
        t0 = time.monotonic()
        status, body = call("POST", "/admin/realms", token=token, body=rep, timeout=120)
        if status not in (201, 409):
            sys.exit(f"stack/oidc: creating realm {name} failed: {status} {body}")
        print(f"stack/oidc: realm {name} imported in {time.monotonic() - t0:.1f} s", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1:])
