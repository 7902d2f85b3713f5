"""The database URL an operator is handed works as it is (issue #47: the Helm chart's Secret).

Database operators (CloudNativePG's ``uri`` key) and managed services give a plain
``postgresql://`` URI; Heroku-style tools ``postgres://``. The gateway ships one driver,
psycopg 3, and reads both as ``postgresql+psycopg://``. Another driver named in the scheme is
refused at start with what to write, naming the setting and never echoing the URL (it holds
the password).
"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gateway.kit.settings import Settings
from tests.conftest import postgres_database


@pytest.mark.parametrize(("given", "read"), [
    ("postgresql://isthmus:pw@db:5432/isthmus", "postgresql+psycopg://isthmus:pw@db:5432/isthmus"),
    ("postgres://isthmus:pw@db/isthmus", "postgresql+psycopg://isthmus:pw@db/isthmus"),
    ("postgresql+psycopg://isthmus:pw@db/isthmus", "postgresql+psycopg://isthmus:pw@db/isthmus"),
    ("sqlite:///./isthmus.db", "sqlite:///./isthmus.db"),
])
def test_a_plain_uri_means_the_shipped_driver(given, read):
    assert Settings(database_url=given).database_url == read


@pytest.mark.parametrize("url", ["postgresql+psycopg2://isthmus:s3cret-pw@db/isthmus",
                                 "postgres+asyncpg://isthmus:s3cret-pw@db/isthmus"])
def test_another_driver_is_refused_without_echoing_the_password(url):
    with pytest.raises(ValidationError) as caught:
        Settings(database_url=url)
    text = str(caught.value)
    assert "database_url" in text and "postgresql+psycopg://" in text
    assert "s3cret-pw" not in text


@pytest.mark.postgres
def test_the_gateway_serves_on_a_plain_uri():
    """A real start on the test Postgres, given the URI the way an operator's Secret holds it."""
    from fastapi.testclient import TestClient

    from gateway.app import create_app

    with postgres_database(migrated=True) as url:
        plain = url.replace("postgresql+psycopg://", "postgresql://", 1)
        assert plain.startswith("postgresql://")
        app = create_app(Settings(database_url=plain, dev_mode=True, dispatch_in_serve=False))
        with TestClient(app) as client:
            assert client.get("/readyz").status_code == 200
            from gateway.identity.setup import build_dev_issuer

            token = build_dev_issuer(app.state.settings).mint(user="alice", groups=["team-a"])
            r = client.post("/v1/jobs", json={"name": "plain-uri", "account": "team-a", "command": ["true"]},
                            headers={"Authorization": f"Bearer {token}"})
            assert r.status_code == 202, r.text
            listed = client.get("/v1/jobs", headers={"Authorization": f"Bearer {token}"}).json()["items"]
            assert [j["id"] for j in listed] == [r.json()["id"]]
