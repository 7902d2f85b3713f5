"""The HTTP layer (every module under gateway/api/ and gateway/ui/) runs no SQL of its own and
writes nothing itself: every query and every write lives in the packages below it (their
service and repository modules), so a rule about what a read returns, which rows a caller
may see, or when a write is committed, has one place (issue #46, items 3 and 6). The
transaction's boundary stays where it is: the request dependency (``get_session``) or the
dashboard's ``with transaction(...)`` opens it and commits it; nothing in between does.
Checked from the source with ast."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HTTP_MODULES = sorted(p for d in ("api", "ui") for p in (REPO / "gateway" / d).rglob("*.py"))

# What a session (or a sessionmaker) is asked that runs SQL, stages a write or moves the
# transaction. ``get`` is only SQL with a model as its first argument (``s.get(Job, id)``):
# ``request.session.get("sid")`` is the /ui cookie's dict.
SESSION_CALLS = {"add", "add_all", "delete", "merge", "flush", "commit", "rollback", "refresh", "execute",
                 "scalars", "scalar", "query", "begin", "begin_nested"}
# A receiver that is a session by its name: session, s, db, sess, db_session, request.state.session,
# self.db, sessionmaker(), get_session(), ... (a module imported under such a name is not).
SESSIONISH = re.compile(r"^(s|db|sess|session|sessions|sessionmaker|async_sessionmaker|get_session"
                        r"|\w+_(session|sess|db)|(db|session)_\w+)$", re.IGNORECASE)


def _tail(node: ast.AST) -> str | None:
    """The last name of a receiver: ``request.state.session`` -> session, ``make()`` -> make."""
    while isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _is_session_type(annotation: ast.AST | None) -> bool:
    return annotation is not None and re.search(r"\b(Async)?Session\b", ast.unparse(annotation)) is not None


def sql_in(source: str) -> list[str]:
    """Where a module builds or runs SQL, or moves a transaction, itself: a sqlalchemy import
    other than the Session type; a call of SESSION_CALLS on a session; ``x.get(Model, key)``."""
    tree = ast.parse(source)
    models: set[str] = set()
    modules: set[str] = set()  # names bound by an import: a module called ``db`` is not a session
    sessions: set[str] = set()  # names that hold a session whatever they are called
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module.startswith("sqlalchemy") and {a.name for a in node.names} - {"Session"}:
                found.append(f"line {node.lineno}: from {node.module} import ...")
            if node.module.startswith("gateway.models"):
                models |= {a.asname or a.name for a in node.names}
            modules |= {a.asname or a.name for a in node.names}
        elif isinstance(node, ast.Import):
            if any(a.name.startswith("sqlalchemy") for a in node.names):
                found.append(f"line {node.lineno}: import sqlalchemy")
            modules |= {a.asname or a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.arg) and _is_session_type(node.annotation):
            sessions.add(node.arg)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and _is_session_type(node.annotation):
            sessions.add(node.target.id)

    def is_session(receiver: ast.AST) -> bool:
        if isinstance(receiver, ast.Name) and receiver.id in sessions:
            return True
        name = _tail(receiver)
        if name is None or (isinstance(receiver, ast.Name) and name in modules and name not in sessions):
            return False
        return bool(SESSIONISH.match(name))

    # Names bound to a session: ``with transaction(factory) as t``, ``t = Session(engine)``,
    # ``t = sessionmaker()``, ``t = session`` (until no new name is found).
    changed = True
    while changed:
        changed = False
        bound: list[tuple[ast.AST, ast.AST]] = []
        for node in ast.walk(tree):
            if isinstance(node, (ast.With, ast.AsyncWith)):
                bound += [(i.optional_vars, i.context_expr) for i in node.items if i.optional_vars is not None]
            elif isinstance(node, ast.Assign):
                bound += [(t, node.value) for t in node.targets]
            elif isinstance(node, ast.NamedExpr):
                bound.append((node.target, node.value))
        for target, value in bound:
            if not isinstance(target, ast.Name) or target.id in sessions:
                continue
            made = isinstance(value, ast.Call) and _tail(value) in {"transaction", "Session", "AsyncSession"}
            if made or is_session(value):
                sessions.add(target.id)
                changed = True

    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        name, receiver = node.func.attr, node.func.value
        where = f"line {node.lineno}: {ast.unparse(receiver)}.{name}(...)"
        if name in SESSION_CALLS and is_session(receiver):
            found.append(where)
        elif name == "get" and node.args:
            first = node.args[0]
            imported_model = isinstance(first, ast.Name) and first.id in models
            model_like = isinstance(first, (ast.Name, ast.Attribute)) and (_tail(first) or "")[:1].isupper()
            if imported_model or (model_like and is_session(receiver)):
                found.append(where)
    return found


# Each form the checker must find, one per line of the list (issue #46, item 6).
FLAGGED = {
    "sqlalchemy import": "from sqlalchemy import select\n",
    "import sqlalchemy": "import sqlalchemy as sa\n",
    "session.execute": "def f(session):\n    session.execute(1)\n",
    "s.get(Model)": "from gateway.models.jobs import Job\ndef f(s):\n    return s.get(Job, 'x')\n",
    "any.get(Model)": "from gateway.models.jobs import Job\ndef f(repo):\n    return repo.get(Job, 'x')\n",
    "db.get(models.Model)": "def f(db):\n    return db.get(models.Pool, 'x')\n",
    **{f"session.{c}": f"def f(session, x):\n    session.{c}(x)\n" for c in sorted(SESSION_CALLS)},
    **{f"s.{c}": f"def f(s, x):\n    s.{c}(x)\n" for c in sorted(SESSION_CALLS)},
    **{f"db.{c}": f"def f(db, x):\n    db.{c}(x)\n" for c in sorted(SESSION_CALLS)},
    "request.state.session.commit": "def f(request):\n    request.state.session.commit()\n",
    "request.state.db.add": "def f(request, row):\n    request.state.db.add(row)\n",
    "self.session.flush": "class C:\n    def f(self):\n        self.session.flush()\n",
    "db_session.rollback": "def f(db_session):\n    db_session.rollback()\n",
    "a parameter typed Session": "from sqlalchemy.orm import Session\ndef f(tx: Session, row):\n    tx.add(row)\n",
    "Session in Depends": "def f(tx: Annotated[Session, Depends(get_session)], row):\n    tx.merge(row)\n",
    "with transaction(...) as t": "def f(request, row):\n    with transaction(request.app.state.sessionmaker) as t:\n"
                                  "        t.add(row)\n",
    "with factory() as t": "def f(request):\n    with request.app.state.sessionmaker() as t:\n        t.commit()\n",
    "an alias of a session": "def f(session, row):\n    tx = session\n    tx.refresh(row)\n",
    "sessionmaker.begin": "def f(request):\n    with request.app.state.sessionmaker.begin() as t:\n        pass\n",
    "a call's session": "def f(request):\n    get_session(request).commit()\n",
    "Session(engine)": "def f(engine, row):\n    t = Session(engine)\n    t.add(row)\n",
}

ALLOWED = {
    "the Session type": "from sqlalchemy.orm import Session\ndef f(session: Session):\n    return service.get(session, 'x')\n",
    "a dict's get": "from gateway.models.jobs import Job\ndef f(d: dict):\n    return d.get('x')\n",
    "the /ui cookie": "def f(request):\n    request.session.get('sid')\n    request.session.clear()\n"
                      "    request.session.pop('next', '/ui/')\n",
    "a service's verbs": "from gateway.pools import service\ndef f(session):\n    service.delete(session, name='x')\n"
                         "    service.get(session, 'x')\n",
    "a module named like a session": "from gateway.identity import ui_sessions as sessions\n"
                                     "def f(session):\n    sessions.delete(session, sid='x')\n",
    "the dashboard's transaction": "def f(request):\n    with transaction(request.app.state.sessionmaker) as session:\n"
                                   "        return repo.list(session)\n",
    "a list's append": "def f(items, x):\n    items.append(x)\n",
}


@pytest.mark.parametrize("source", FLAGGED.values(), ids=FLAGGED.keys())
def test_the_checker_finds_sql(source):
    assert sql_in(source), source


@pytest.mark.parametrize("source", ALLOWED.values(), ids=ALLOWED.keys())
def test_the_checker_allows_calls_through_services(source):
    assert sql_in(source) == [], source


def test_the_checker_reads_every_http_module():
    names = {str(p.relative_to(REPO)) for p in HTTP_MODULES}
    assert {"gateway/api/pools.py", "gateway/ui/router.py", "gateway/ui/session.py", "gateway/ui/__init__.py"} <= names


@pytest.mark.parametrize("path", HTTP_MODULES, ids=lambda p: str(p.relative_to(REPO)))
def test_http_modules_run_no_sql(path):
    assert sql_in(path.read_text()) == [], f"{path.relative_to(REPO)} queries or writes the database itself, or " \
        "moves the transaction; move it into the package's service or repository module"
