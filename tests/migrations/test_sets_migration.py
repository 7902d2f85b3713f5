"""0008sets with tasks in the tables (issue #27 finding 3), on SQLite and Postgres.

A set recorded by the gateway at head keeps its spec once and each task only its values;
downgrading gives every task its full spec back (what the API showed), and upgrading again
leaves those tasks read as they are.
"""

from __future__ import annotations

import json

from alembic import command
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text

from gateway.app import create_app
from gateway.identity.setup import build_dev_issuer
from gateway.kit.settings import Settings
from tests.migrations.test_migrations import _config, empty_db  # noqa: F401  (fixture)

SWEEP = {"name": "s", "account": "team-a", "command": ["x", "--lr={{ lr }}", "{{ index }}"],
         "env": {"A": "q\"{{ lr }}\n"}, "gpus_per_worker": 1, "sweep": {"lr": [0.1, "a\tb"]}}


def _specs(url: str) -> dict[str, dict]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return {i: json.loads(s) if isinstance(s, str) else s for i, s in conn.execute(text("SELECT id, spec FROM job"))}
    finally:
        engine.dispose()


def test_downgrade_gives_tasks_their_full_spec_back(empty_db, tmp_path):
    cfg = _config(empty_db)
    command.upgrade(cfg, "head")
    settings = Settings(database_url=empty_db, dev_mode=True, dev_key_path=tmp_path / "k.pem", dev_accounts="team-a")

    def tasks() -> list[dict]:
        with TestClient(create_app(settings)) as client:
            headers = {"Authorization": f"Bearer {build_dev_issuer(settings).mint(user='alice', groups=['team-a'])}"}
            if not set_id:
                r = client.post("/v1/job-sets", json=SWEEP, headers=headers)
                assert r.status_code == 202, r.text
                set_id.append(r.json()["id"])
            return client.get(f"/v1/job-sets/{set_id[0]}/tasks", headers=headers).json()["items"]

    set_id: list[str] = []
    shown = tasks()
    assert all("command" not in spec for spec in _specs(empty_db).values())  # stored once
    command.downgrade(cfg, "0008width")  # just before 0008sets
    stored = _specs(empty_db)
    for t in shown:
        spec = stored[t["id"]]
        assert (spec["command"], spec["env"], spec["parameters"]) == (t["command"], t["env"], t["parameters"])
    command.upgrade(cfg, "head")
    assert tasks() == shown
