"""The clients suite reuses the real ``isthmus serve`` process of tests/e2e (SQLite and Postgres)."""

from tests.e2e.conftest import running_gateway  # noqa: F401  (a fixture)
