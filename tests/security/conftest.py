from tests.ledger.dbfixtures import db_url, engine, factory, ledger_pg_database, pg_url, sqlite_template  # noqa: F401
