"""Shared fixtures: every core test runs against SQLite AND a real Postgres.

Postgres is the test stack's own throw-away cluster from ``stack/postgres.sh`` (``make test``
starts it; its URL is in ``.stack/postgres/env``). Every test session creates the databases
it uses and drops them at the end: nothing depends on a database an earlier run or a manual
step left behind. Each test module gets its own database, a copy of a template migrated once
per session, and its own app; no module sees another's rows (docs/testing.md). Without the
server the Postgres cases are skipped with the reason, except under ``ISTHMUS_REQUIRE_STACK=1``
(``make test`` and CI), where a missing system is a failure.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import sqlite3
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from adapters.envfile import read_env_file  # noqa: F401  (used by the suites)
from stack.databases import recreate_database, server_url, temporary_database

REPO = Path(__file__).resolve().parent.parent
pytest_plugins = ["tests.lanes"]  # which shared systems each test holds; settled clusters (tests/lanes.py)


def stack_postgres_url() -> str:
    """The test Postgres server's maintenance URL (stack/databases.py)."""
    return server_url()


PG_ADMIN_URL = stack_postgres_url()
REQUIRE_STACK = os.environ.get("ISTHMUS_REQUIRE_STACK") == "1"


def wait_for(predicate, timeout_s: float, what: str, diag=lambda: ""):
    """``predicate()``'s first truthy value, asked every second for at most ``timeout_s``; else
    fail naming ``what``, with ``diag()`` (logs, pods) to tell why."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(1)
    raise AssertionError(f"timed out waiting for {what}\n{diag()}")


def missing_system(reason: str) -> None:
    """Skip locally, fail when the full stack is required (make test, CI)."""
    if REQUIRE_STACK:
        pytest.fail(f"required test system missing: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def dev_key_path(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("devkey") / "dev-issuer.pem"


@contextlib.contextmanager
def postgres_database(*, migrated: bool = False, template: str | None = None,
                      prefix: str = "isthmus_test") -> Iterator[str]:
    """A fresh database on the test Postgres (migrated to head, or a copy of ``template``, if asked), dropped after."""
    with contextlib.ExitStack() as stack:
        try:
            url = stack.enter_context(temporary_database(PG_ADMIN_URL, prefix=prefix, migrated=migrated,
                                                         template=template))
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


class Databases:
    """This session's migrated templates, one per dialect, and the databases copied from them.

    The schema is migrated once per session per dialect (about 0.8 s on Postgres); every
    database a module or a test gets is a copy of that template: ``CREATE DATABASE ...
    TEMPLATE`` on Postgres (about 0.1 s), a file copy on SQLite (under 1 ms). Each is
    dropped by whoever asked for it; the templates at the end of the session.
    """

    def __init__(self, directory: Path):
        self.directory = directory
        self.templates: dict[str, str] = {}
        self.made: set[str] = set()  # the database_url of each running module (fresh_database)
        self.served: set[str] = set()  # ... and those a module_gateway's app is using
        self.exits = contextlib.ExitStack()

    def template(self, dialect: str) -> str:
        if dialect not in self.templates:
            if dialect == "sqlite":
                from gateway.cli import run_migrations

                url = f"sqlite:///{self.directory / 'template.db'}"
                run_migrations(url)
            else:
                url = self.exits.enter_context(postgres_database(migrated=True, prefix="isthmus_template"))
            self.templates[dialect] = url
        return self.templates[dialect]

    @contextlib.contextmanager
    def create(self, dialect: str) -> Iterator[str]:
        """A new database, a copy of the migrated template, dropped on exit."""
        template = self.template(dialect)
        with postgres_database(template=template) if dialect == "postgres" else self._sqlite_copy(template) as url:
            yield url

    @contextlib.contextmanager
    def _sqlite_copy(self, template: str) -> Iterator[str]:
        path = self.directory / f"isthmus-{uuid.uuid4().hex[:8]}.db"
        shutil.copyfile(_sqlite_path(template), path)
        try:
            yield f"sqlite:///{path}"
        finally:
            for suffix in ("", "-wal", "-shm"):
                Path(f"{path}{suffix}").unlink(missing_ok=True)

    def recreate(self, url: str) -> None:
        """Make the database at ``url`` (one of ours; nobody may be using it) a fresh copy of its template."""
        if url.startswith("sqlite"):
            path = _sqlite_path(url)
            for suffix in ("", "-wal", "-shm"):  # a new file, not the old one overwritten
                Path(f"{path}{suffix}").unlink(missing_ok=True)
            shutil.copyfile(_sqlite_path(self.template("sqlite")), path)
        else:
            recreate_database(PG_ADMIN_URL, url, template=self.template("postgres"))


def _sqlite_path(url: str) -> str:
    return url.removeprefix("sqlite:///")


_DATABASES: list[Databases] = []  # this session's, for plain helpers such as tests/dispatch's wired_gateway


def fresh_database(url: str) -> None:
    """Make ``url`` a fresh copy of the migrated template if it is a ``database_url`` of this session.

    Any other database (a ``pg_url``, a file in the test's ``tmp_path``) is the test's own and
    fresh already. Nobody may be connected to it (on SQLite the file is replaced).
    """
    if _DATABASES and url in _DATABASES[0].made:
        if url in _DATABASES[0].served:
            raise RuntimeError("this module's gw app is using its database_url: give this gateway a database "
                               "of its own (databases.create)")
        _DATABASES[0].recreate(url)


@pytest.fixture(scope="session")
def databases(tmp_path_factory) -> Iterator[Databases]:
    dbs = Databases(tmp_path_factory.mktemp("databases"))
    _DATABASES.append(dbs)
    with dbs.exits:
        yield dbs
    _DATABASES.remove(dbs)


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def database_url(request, databases) -> Iterator[str]:
    """This module's own database (a copy of the migrated template), dropped after the module.

    No row a test in another module writes can reach it, and no row written here outlives
    the module (docs/testing.md, "One database per module").
    """
    with databases.create(request.param) as url:
        databases.made.add(url)
        try:
            yield url
        finally:
            databases.made.discard(url)


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


class StartupSnapshot:
    """The rows of a database right after its gateway started (dev accounts, pools), to go back to.

    Taken once per module, restored before each of its tests: every table of the module's
    database (read from the database itself, so none can be forgotten) is emptied and
    refilled from the snapshot in one transaction, with foreign keys not in the way
    (children before parents on Postgres; foreign keys off on SQLite). It touches
    only this module's database: a failure here is this module's, never another's.
    """

    SCHEMA = "isthmus_startup"

    def __init__(self, url: str, directory: Path):
        self.url = url
        if url.startswith("sqlite"):
            self.copy = directory / f"startup-{uuid.uuid4().hex[:8]}.db"
            with contextlib.closing(sqlite3.connect(_sqlite_path(url), timeout=30)) as conn:
                conn.execute("VACUUM INTO ?", (str(self.copy),))
                self.tables = [r[0] for r in conn.execute(
                    "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' "
                    "AND name != 'alembic_version'")]
            return
        from sqlalchemy import MetaData, create_engine, text

        # One kept connection (a new one costs more than the restore); pre-ping: Postgres may restart.
        self.engine = create_engine(url, pool_size=1, max_overflow=0, pool_pre_ping=True)
        reflected = MetaData()
        reflected.reflect(self.engine)
        self.tables = [t.name for t in reflected.sorted_tables if t.name != "alembic_version"]  # parents first
        with self.engine.begin() as conn:
            conn.execute(text(f'DROP SCHEMA IF EXISTS "{self.SCHEMA}" CASCADE'))
            conn.execute(text(f'CREATE SCHEMA "{self.SCHEMA}"'))
            for t in self.tables:
                conn.execute(text(f'CREATE TABLE "{self.SCHEMA}"."{t}" AS TABLE public."{t}"'))
            self.filled = [t for t in self.tables
                           if conn.execute(text(f'SELECT EXISTS (SELECT 1 FROM "{self.SCHEMA}"."{t}")')).scalar()]

    def restore(self) -> None:
        if self.url.startswith("sqlite"):
            with contextlib.closing(sqlite3.connect(_sqlite_path(self.url), timeout=30,
                                                    isolation_level=None)) as conn:
                conn.execute("PRAGMA foreign_keys = OFF")
                conn.execute("ATTACH DATABASE ? AS startup", (str(self.copy),))
                conn.execute("BEGIN IMMEDIATE")
                for t in self.tables:
                    conn.execute(f'DELETE FROM main."{t}"')
                    conn.execute(f'INSERT INTO main."{t}" SELECT * FROM startup."{t}"')
                conn.execute("COMMIT")
            return
        # One round trip. DELETE, children first, not TRUNCATE (which costs ~160 ms for these
        # tables); a table's references to itself (account.parent_name) are checked at the end
        # of its statement. A test's stuck transaction makes this fail (lock_timeout), not hang.
        statements = ["SET LOCAL lock_timeout = '10s'", "SET LOCAL synchronous_commit = off",
                      *(f'DELETE FROM public."{t}"' for t in reversed(self.tables)),
                      *(f'INSERT INTO public."{t}" SELECT * FROM "{self.SCHEMA}"."{t}"' for t in self.filled)]
        with self.engine.begin() as conn:
            conn.exec_driver_sql("; ".join(statements))

    def close(self) -> None:
        if self.url.startswith("sqlite"):
            self.copy.unlink(missing_ok=True)
        else:
            self.engine.dispose()


@dataclasses.dataclass
class ModuleGateway:
    gateway: Gateway
    startup: StartupSnapshot


@pytest.fixture(scope="module")
def module_gateway(database_url, databases, dev_key_path, tmp_path_factory) -> Iterator[ModuleGateway]:
    """This module's gateway app on this module's database, started once for the module."""
    from fastapi.testclient import TestClient

    from gateway.app import create_app
    from gateway.identity.setup import build_dev_issuer
    from gateway.kit.settings import Settings

    settings = Settings(database_url=database_url, dev_mode=True, dev_key_path=dev_key_path,
                        dev_accounts="team-a,team-b")
    app = create_app(settings)
    with TestClient(app) as client:
        startup = StartupSnapshot(database_url, tmp_path_factory.mktemp("startup"))
        databases.served.add(database_url)
        try:
            yield ModuleGateway(Gateway(client=client, app=app, settings=settings,
                                        issuer=build_dev_issuer(settings)), startup)
        finally:
            databases.served.discard(database_url)
            startup.close()


@pytest.fixture
def gw(module_gateway) -> Iterator[Gateway]:
    """The module's gateway, its database as the gateway's start-up left it (team-a, team-b, pools)."""
    module_gateway.startup.restore()
    yield module_gateway.gateway


@pytest.fixture
def site(gw, monkeypatch):
    """Set site defaults (settings fields) on the running gateway for one test."""
    def set_(**kw):
        for k, v in kw.items():
            monkeypatch.setattr(gw.settings, k, v)
    return set_


@dataclasses.dataclass
class PostgresServer:
    """A Postgres server of a test's own (stack/postgres.sh with ISTHMUS_PG_STATE)."""

    url: str
    state: Path

    def run(self, action: str) -> None:
        import subprocess

        port = self.url.rsplit(":", 1)[1].split("/")[0]
        subprocess.run(["bash", str(REPO / "stack" / "postgres.sh"), action], check=True, capture_output=True,
                       env={**os.environ, "ISTHMUS_PG_STATE": str(self.state), "ISTHMUS_PG_PORT": port})


@pytest.fixture(scope="module")
def own_postgres_server() -> Iterator[PostgresServer]:
    """A throw-away Postgres server for a module that restarts or stops its server.

    The stack's server is shared by every lane (tests/lanes.py): restarting it would cut
    the connections of the tests running beside this one. This one is the module's alone,
    on a free port, in /var/tmp (the postgres user must reach it), removed afterwards."""
    import subprocess

    from tests.jobs.live import free_port

    state = Path(f"/var/tmp/isthmus-pg-private-{uuid.uuid4().hex[:12]}")
    port = free_port()
    done = subprocess.run(["bash", str(REPO / "stack" / "postgres.sh"), "up"], capture_output=True, text=True,
                          env={**os.environ, "ISTHMUS_PG_STATE": str(state), "ISTHMUS_PG_PORT": str(port)})
    if done.returncode != 0:
        shutil.rmtree(state, ignore_errors=True)
        missing_system(f"could not start a private Postgres server: {done.stderr[-500:]}")
    server = PostgresServer(done.stdout.strip().splitlines()[-1], state)
    try:
        yield server
    finally:
        with contextlib.suppress(Exception):
            server.run("down")
        shutil.rmtree(state, ignore_errors=True)
