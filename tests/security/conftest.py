from tests.ledger.dbfixtures import db_url, engine, factory, pg_url, sqlite_template  # noqa: F401
