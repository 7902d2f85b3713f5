from tests.ledger.dbfixtures import (  # noqa: F401
    db_url,
    engine,
    factory,
    ledger_pg_database,
    pg_url,
    sqlite_template,
)
