"""One writer per table (issue #46): each table's rows are created and removed by ONE module
of gateway/, so a rule about what a row holds when it is born or dies has one place.

Checked from the source with ast. A module *creates or removes* a table's rows when it:

* adds a new model object to a session (``session.add(Model(...))``, or a name bound to
  ``Model(...)`` in the same function and then added);
* calls ``insert`` / ``delete`` on the model or its table (``insert(Model)``,
  ``Model.__table__.insert()``, a module-level alias of the table, ``.on_conflict_*``
  statements included), or hands the table to a bulk insert (any call named ``*insert*``);
* holds SQL text that inserts into or deletes from the table (``INSERT INTO job``).

Changes to existing rows are not counted here: a job's columns move through the state
machine and the dispatch round's writer (docs/architecture.md, "One writer per table").
``session.delete(obj)`` of a loaded object cannot be typed from the source; the account row's
only one is in gateway/admin/lifecycle.py, beside its creation.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SQL = re.compile(r"\b(INSERT\s+INTO|DELETE\s+FROM)\s+\"?(\w+)", re.IGNORECASE)


def model_tables() -> dict[str, str]:
    """ORM class name -> table name, read from gateway/models."""
    out = {}
    for path in (REPO / "gateway" / "models").glob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef):
                for stmt in node.body:
                    if (isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Constant)
                            and any(isinstance(t, ast.Name) and t.id == "__tablename__" for t in stmt.targets)):
                        out[node.name] = stmt.value.value
    return out


def _strings(node: ast.AST):
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node.value
    elif isinstance(node, ast.JoinedStr):
        for part in node.values:
            if isinstance(part, ast.Constant) and isinstance(part.value, str):
                yield part.value


def writes_in(source: str, classes: dict[str, str]) -> set[str]:
    """The tables whose rows ``source`` creates or removes."""
    tree = ast.parse(source)
    tables = set(classes.values())
    found: set[str] = set()

    def table_of(node: ast.AST, aliases: dict[str, str]) -> str | None:
        if isinstance(node, ast.Name):
            return classes.get(node.id) or aliases.get(node.id)
        if isinstance(node, ast.Attribute) and node.attr == "__table__" and isinstance(node.value, ast.Name):
            return classes.get(node.value.id)
        return None

    aliases: dict[str, str] = {}  # module-level names bound to a table (X = Model.__table__)
    for node in tree.body:
        if isinstance(node, ast.Assign) and (t := table_of(node.value, {})) is not None:
            aliases.update({target.id: t for target in node.targets if isinstance(target, ast.Name)})

    for scope in [tree, *(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))]:
        born: dict[str, str] = {}  # names bound to Model(...) in this scope
        for node in ast.walk(scope):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) \
                    and isinstance(node.value.func, ast.Name) and node.value.func.id in classes:
                born.update({t.id: classes[node.value.func.id] for t in node.targets if isinstance(t, ast.Name)})
        for node in ast.walk(scope):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
            if name in ("add", "add_all") and isinstance(func, ast.Attribute):
                for arg in node.args:
                    items = arg.elts if isinstance(arg, (ast.List, ast.Tuple)) else [arg]
                    for item in items:
                        if isinstance(item, ast.Call) and isinstance(item.func, ast.Name) and item.func.id in classes:
                            found.add(classes[item.func.id])
                        elif isinstance(item, ast.Name) and item.id in born:
                            found.add(born[item.id])
            if name in ("insert", "delete") and node.args and (t := table_of(node.args[0], aliases)):
                found.add(t)
            if name in ("insert", "delete") and isinstance(func, ast.Attribute) \
                    and (t := table_of(func.value, aliases)):
                found.add(t)
            if name and "insert" in name and name != "insert":  # a bulk helper handed the table
                found |= {t for arg in node.args if (t := table_of(arg, aliases))}
    for node in ast.walk(tree):
        for text in _strings(node):
            found |= {m.group(2) for m in SQL.finditer(text) if m.group(2) in tables}
    return found


@functools.cache
def writers() -> dict[str, list[str]]:
    classes = model_tables()
    out: dict[str, list[str]] = {}
    for path in sorted((REPO / "gateway").rglob("*.py")):
        if "models" in path.relative_to(REPO).parts:
            continue
        for table in writes_in(path.read_text(), classes):
            out.setdefault(table, []).append(str(path.relative_to(REPO)))
    return out


def test_the_checker_finds_each_form_of_write():
    classes = {"Job": "job", "JobEvent": "job_event"}
    assert writes_in("def f(s):\n    s.add(Job(id=1))\n", classes) == {"job"}
    assert writes_in("def f(s):\n    j = Job(id=1)\n    s.add(j)\n", classes) == {"job"}
    assert writes_in("def f(s):\n    s.add_all([JobEvent()])\n", classes) == {"job_event"}
    assert writes_in("def f(s):\n    s.execute(insert(Job).values(a=1))\n", classes) == {"job"}
    assert writes_in("def f(s):\n    s.execute(delete(JobEvent))\n", classes) == {"job_event"}
    assert writes_in("T = Job.__table__\ndef f(c):\n    c.execute(T.insert(), [])\n", classes) == {"job"}
    assert writes_in("T = JobEvent.__table__\ndef f(c):\n    bulk.insert_rows(c, T, [])\n", classes) == {"job_event"}
    assert writes_in("def f(c):\n    bulk_insert(c, Job.__table__, {}, (), [])\n", classes) == {"job"}
    assert writes_in("Q = 'INSERT INTO job_event (a) VALUES (1)'\n", classes) == {"job_event"}
    assert writes_in("def f(x):\n    return f'''DELETE FROM job WHERE id = {x}'''\n", classes) == {"job"}
    # Reads, updates and transient objects are not creations or removals.
    assert writes_in("def f(s):\n    return Job(id=1)\n", classes) == set()
    assert writes_in("def f(s):\n    s.execute(update(Job).values(a=1))\n", classes) == set()
    assert writes_in("T = Job.__table__\nC = T.c\ndef f(s):\n    s.execute(select(T))\n", classes) == set()


def test_each_table_has_one_module_that_creates_and_removes_its_rows():
    shared = {table: mods for table, mods in writers().items() if len(mods) > 1}
    assert shared == {}, ("rows of these tables are created or removed by more than one module; give each "
                          f"table one writer and call it: {shared}")


def test_the_writers_are_where_the_docs_say():
    found = writers()
    assert found["job"] == ["gateway/jobs/store.py"]
    assert found["job_event"] == ["gateway/jobs/journal.py"]
    assert found["idempotency_key"] == ["gateway/jobs/store.py"]
    assert found["account"] == ["gateway/admin/lifecycle.py"]
    assert found["account_balance"] == ["gateway/ledger/chains.py"]
    assert found["ledger_entry"] == ["gateway/ledger/booking.py"]
