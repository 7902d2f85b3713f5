"""TypeScript and Go clients generated from docs/openapi.json, exercised against a real gateway.

``generate.sh`` builds both (``tsc --strict``, ``go vet``) with the pinned generators that
``tools.sh`` installs; the smoke programs (``ts/smoke.ts``, ``go/main.go``) then run the job
flow and the admin calls against ``isthmus serve`` on SQLite and on Postgres, using only
the generated code. The Python client is tests/e2e/test_generated_client.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.conftest import REPO, missing_system

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="session")
def clients(tmp_path_factory) -> Path:
    if os.geteuid() != 0:  # as root, tools.sh installs what is missing
        for tool in ("npm", "node", "java", "mvn", "go"):
            if shutil.which(tool) is None:
                missing_system(f"{tool} is not installed (tests/clients/tools.sh installs it as root)")
    out = tmp_path_factory.mktemp("clients")
    proc = subprocess.run(["bash", str(HERE / "generate.sh"), str(out)], capture_output=True, text=True,
                          timeout=900, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-6000:]
    return out


def smoke(cmd: list[str], cwd: Path, gateway) -> str:
    env = {**os.environ, "ISTHMUS_URL": gateway.url, "ISTHMUS_TOKEN": gateway.token("alice", ("team-a",)),
           "ISTHMUS_ADMIN_TOKEN": gateway.token("root", ("team-a",), admin=True),
           "ISTHMUS_SMOKE_ID": uuid.uuid4().hex[:8]}
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_typescript_client_smoke(clients, running_gateway):
    assert "ts smoke: ok" in smoke(["node", "dist/smoke.js"], clients / "ts", running_gateway)


def test_go_client_smoke(clients, running_gateway):
    assert "go smoke: ok" in smoke(["./smoke"], clients / "go", running_gateway)


def test_problem_always_carries_detail_and_instance(gw):
    """Even errors raised by the framework (unknown path, wrong method) are complete Problems."""
    for method, path in (("GET", "/v1/no-such-thing"), ("DELETE", "/v1/jobs"), ("GET", "/v1/admin/accounts/team-a")):
        r = gw.client.request(method, path, headers=gw.headers())
        assert r.status_code >= 400 and r.headers["content-type"].startswith("application/problem+json")
        body = r.json()
        assert isinstance(body["detail"], str) and body["detail"], body
        assert body["instance"] == path and body["type"] and body["title"] and body["status"] == r.status_code


def test_usage_csv_operation_and_the_old_query_agree(gw):
    admin = gw.headers("root", ("team-a",), admin=True)
    r = gw.client.post("/v1/admin/ledger/adjustments", headers=admin,
                       json={"account": "team-b", "kind": "credit", "gpu_hours": 1_000_000, "reason": "csv"})
    assert r.status_code == 201 and r.json()["gpu_seconds"] == -3_600_000_000
    new = gw.client.get("/v1/admin/usage.csv", params={"account": "team-b"}, headers=admin)
    old = gw.client.get("/v1/admin/usage", params={"account": "team-b", "format": "csv"}, headers=admin)
    assert new.status_code == old.status_code == 200
    assert new.headers["content-type"].startswith("text/csv") and new.text == old.text
    assert new.text.splitlines()[1].startswith("team-b,,") and ",-3600000000," in new.text
    bad = gw.client.get("/v1/admin/usage.csv", params={"period": "week"}, headers=admin)
    assert bad.status_code == 422 and bad.json()["errors"][0]["field"] == "query.period"
