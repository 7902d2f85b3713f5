"""The HTTP layer (gateway/api/, the /ui pages) runs no SQL of its own: every query lives in
the packages below it (their service and repository modules), so a rule about what a read
returns, or which rows a caller may see, has one place. Checked from the source with ast."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HTTP_MODULES = sorted((REPO / "gateway" / "api").glob("*.py")) + [REPO / "gateway" / "ui" / "router.py"]
QUERY_CALLS = {"execute", "scalars", "scalar", "query", "add", "delete", "merge"}


def sql_in(source: str) -> list[str]:
    """Where a module builds or runs SQL itself: a sqlalchemy import other than the Session
    type, a session call that runs or stages a statement, or ``x.get(Model, key)``."""
    tree = ast.parse(source)
    models: set[str] = set()
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module.startswith("sqlalchemy") and {a.name for a in node.names} - {"Session"}:
                found.append(f"line {node.lineno}: from {node.module} import ...")
            if node.module.startswith("gateway.models"):
                models |= {a.asname or a.name for a in node.names}
        elif isinstance(node, ast.Import) and any(a.name.startswith("sqlalchemy") for a in node.names):
            found.append(f"line {node.lineno}: import sqlalchemy")
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            name = node.func.attr
            if name in QUERY_CALLS and isinstance(node.func.value, ast.Name) and node.func.value.id in {"session", "s"}:
                found.append(f"line {node.lineno}: {node.func.value.id}.{name}(...)")
            if name == "get" and node.args and isinstance(node.args[0], ast.Name) and node.args[0].id in models:
                found.append(f"line {node.lineno}: .get({node.args[0].id}, ...)")
    return found


def test_the_checker_finds_sql():
    assert sql_in("from sqlalchemy import select\n")
    assert sql_in("def f(session):\n    session.execute(1)\n")
    assert sql_in("from gateway.models.jobs import Job\ndef f(s):\n    return s.get(Job, 'x')\n")
    assert not sql_in("from sqlalchemy.orm import Session\nfrom gateway.models.jobs import Job\n"
                      "def f(d: dict):\n    return d.get('x')\n")


@pytest.mark.parametrize("path", HTTP_MODULES, ids=lambda p: str(p.relative_to(REPO)))
def test_http_modules_run_no_sql(path):
    assert sql_in(path.read_text()) == [], f"{path.relative_to(REPO)} queries the database itself; " \
        "move the query into the package's service or repository module"
