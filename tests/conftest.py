"""Shared fixtures: every core test runs against SQLite AND a real Postgres.

Postgres is the test stack's own throw-away cluster from ``stack/postgres.sh`` (``make test``
starts it; its URL is in ``.stack/postgres/env``). Every test session creates the databases
it uses and drops them at the end: nothing depends on a database an earlier run or a manual
step left behind. Without the server the Postgres cases are skipped with the reason, except
under ``ISTHMUS_REQUIRE_STACK=1`` (``make test`` and CI), where a missing system is a failure.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from adapters.envfile import read_env_file  # noqa: F401  (used by the suites)
from stack.databases import server_url, temporary_database

REPO = Path(__file__).resolve().parent.parent


def stack_postgres_url() -> str:
    """The test Postgres server's maintenance URL (stack/databases.py)."""
    return server_url()


PG_ADMIN_URL = stack_postgres_url()
REQUIRE_STACK = os.environ.get("ISTHMUS_REQUIRE_STACK") == "1"


def missing_system(reason: str) -> None:
    """Skip locally, fail when the full stack is required (make test, CI)."""
    if REQUIRE_STACK:
        pytest.fail(f"required test system missing: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def dev_key_path(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("devkey") / "dev-issuer.pem"


@contextlib.contextmanager
def postgres_database(*, migrated: bool = False) -> Iterator[str]:
    """A fresh database on the test Postgres (migrated to head if asked), dropped after."""
    with contextlib.ExitStack() as stack:
        try:
            url = stack.enter_context(temporary_database(PG_ADMIN_URL, prefix="isthmus_test", migrated=migrated))
        except Exception as exc:  # noqa: BLE001
            missing_system(f"Postgres not reachable at {PG_ADMIN_URL.split('@')[-1]} ({type(exc).__name__}); "
                           "run `bash stack/postgres.sh up`")
        yield url


def pytest_collection_modifyitems(config, items):
    """Cluster tests run on Postgres only, unless marked ``both_databases``.

    A test that needs a real pool (marked ``slurm`` or ``kubernetes``) exercises the pool and
    the dispatcher; the registry's two dialects are covered by every other test, which runs
    on both. Running each cluster test twice cost CI about a quarter of its time
    (docs/testing.md). The end-to-end suites (tests/dispatch/test_slurm_e2e.py,
    test_kube_e2e.py) keep SQLite, the embedded default, on real pools.
    ``ISTHMUS_TEST_FULL_MATRIX=1`` runs every cluster test on both.
    """
    if os.environ.get("ISTHMUS_TEST_FULL_MATRIX") == "1":
        return
    keep, dropped = [], []
    for item in items:
        callspec = getattr(item, "callspec", None)
        on_sqlite = callspec is not None and callspec.params.get("database_url") == "sqlite"
        cluster = item.get_closest_marker("slurm") or item.get_closest_marker("kubernetes")
        if on_sqlite and cluster and not item.get_closest_marker("both_databases"):
            dropped.append(item)
        else:
            keep.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


@pytest.fixture(scope="session", params=["sqlite", "postgres"])
def database_url(request, tmp_path_factory) -> Iterator[str]:
    from gateway.cli import run_migrations

    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('sqlite') / 'isthmus.db'}"
        run_migrations(url)
        yield url
    else:
        with postgres_database(migrated=True) as url:
            yield url


@dataclasses.dataclass
class Gateway:
    """A running gateway app (in-process) plus helpers to act as its users."""

    client: object
    app: object
    settings: object
    issuer: object

    def token(self, user: str = "alice", groups: tuple[str, ...] = ("team-a",), admin: bool = False, **kw) -> str:
        return self.issuer.mint(user=user, groups=list(groups), admin=admin, **kw)

    def headers(self, user: str = "alice", groups: tuple[str, ...] = ("team-a",), admin: bool = False) -> dict:
        return {"Authorization": f"Bearer {self.token(user, groups, admin)}"}

    def session(self):
        return self.app.state.sessionmaker()


@pytest.fixture(scope="session")
def gateway_session(database_url, dev_key_path) -> Iterator[Gateway]:
    from fastapi.testclient import TestClient

    from gateway.app import create_app
    from gateway.identity.setup import build_dev_issuer
    from gateway.kit.settings import Settings

    settings = Settings(database_url=database_url, dev_mode=True, dev_key_path=dev_key_path,
                        dev_accounts="team-a,team-b")
    app = create_app(settings)
    with TestClient(app) as client:
        yield Gateway(client=client, app=app, settings=settings, issuer=build_dev_issuer(settings))


def _clean(app) -> None:
    from gateway.accounts.models import Account
    from gateway.models import metadata

    from sqlalchemy import inspect

    existing = set(inspect(app.state.engine).get_table_names())
    with app.state.engine.begin() as conn:
        for table in reversed(metadata.sorted_tables):
            # Accounts and pools are the gateway's configuration (pools: reconciled at start-up).
            if table.name not in (Account.__tablename__, "pool") and table.name in existing:
                conn.execute(table.delete())
        # parent_name is ON DELETE RESTRICT, which SQLite checks row by row: a child deleted
        # after its parent in the same statement fails it (schemathesis makes such pairs at
        # random). Detach first, then delete; team-a and team-b go back to being roots.
        keep = ["team-a", "team-b"]
        accounts = Account.__table__
        conn.execute(accounts.update().where(accounts.c.name.notin_(keep) | accounts.c.parent_name.notin_(keep))
                     .values(parent_name=None))
        conn.execute(accounts.delete().where(accounts.c.name.notin_(keep)))


@pytest.fixture
def gw(gateway_session) -> Iterator[Gateway]:
    _clean(gateway_session.app)
    yield gateway_session
