"""The test stack's Postgres server, for tests and benchmarks alike (stack/postgres.sh).

Every database a test session or a benchmark uses is made here and dropped after it, so
nothing depends on a database an earlier run or a manual step left behind (docs/testing.md).
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_URL = "postgresql+psycopg://isthmus:isthmus@127.0.0.1:55432/isthmus"


def server_url(env_var: str = "ISTHMUS_TEST_POSTGRES_URL") -> str:
    """``env_var`` if set, else the URL stack/postgres.sh wrote to .stack/postgres/env, else its default."""
    if url := os.environ.get(env_var):
        return url
    env = REPO / ".stack" / "postgres" / "env"
    if env.exists():
        from adapters.envfile import read_env_file

        if url := read_env_file(env).get("ISTHMUS_TEST_POSTGRES_URL"):
            return url
    return DEFAULT_URL


@contextlib.contextmanager
def temporary_database(server: str, *, prefix: str, migrated: bool = False,
                       template: str | None = None) -> Iterator[str]:
    """A new database on ``server`` (migrated to head if asked), dropped on exit.

    With ``template`` (the URL of a database on the same server that nobody is connected
    to), the new database is a copy of it: ``CREATE DATABASE ... TEMPLATE``, which copies
    a migrated schema in about a tenth of the time migrating takes (docs/testing.md).
    Raises whatever connecting raises when the server is not there; callers decide whether
    that skips or fails. No connection pool: a test may restart Postgres in between.
    """
    from sqlalchemy import create_engine, text
    from sqlalchemy.pool import NullPool

    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    admin = create_engine(server, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    try:
        with admin.connect() as conn:
            conn.execute(text(_create_statement(name, template)))
    except Exception:
        admin.dispose()
        raise
    url = server.rsplit("/", 1)[0] + "/" + name
    try:
        if migrated:
            from gateway.cli import run_migrations

            run_migrations(url)
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def database_name(url: str) -> str:
    return url.rsplit("/", 1)[1].split("?", 1)[0]


def _create_statement(name: str, template: str | None) -> str:
    # WAL_LOG (Postgres 15's default) copies a small database without the checkpoint
    # FILE_COPY needs: 85 ms against 200 ms for the migrated schema on the test machine.
    return f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{database_name(template)}"' if template else "")


def recreate_database(server: str, url: str, *, template: str) -> None:
    """Drop the database at ``url`` (ending its sessions) and make it again as a copy of ``template``."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.pool import NullPool

    name = database_name(url)
    admin = create_engine(server, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    try:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            conn.execute(text(_create_statement(name, template)))
    finally:
        admin.dispose()
