"""gateway.domain is the pure decision core (issue #28): no database, no web framework, no
HTTP client, nothing from the gateway's other packages but ``gateway.kit``.

Checked twice: from the source (every import, the ones inside functions too), and by
importing every module of the package in a fresh interpreter and looking at what got loaded.
"""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOMAIN = ROOT / "gateway" / "domain"
FORBIDDEN = ("sqlalchemy", "fastapi", "starlette", "httpx")
ALLOWED_GATEWAY = ("gateway.domain", "gateway.kit")  # and ``gateway`` itself (its __version__)


def _modules() -> list[str]:
    return sorted("gateway.domain" + ("" if p.stem == "__init__" else "." + p.stem) for p in DOMAIN.glob("*.py"))


def _offending(name: str) -> bool:
    top = name.split(".")[0]
    if top in FORBIDDEN:
        return True
    return top == "gateway" and name != "gateway" and not any(name == a or name.startswith(a + ".") for a in ALLOWED_GATEWAY)


def _imports(path: pathlib.Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):  # function-level ones too
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: inside gateway.domain
                found.add("gateway.domain" + (f".{node.module}" if node.module else ""))
            else:
                found.add(node.module or "")
                found.update(f"{node.module}.{a.name}" for a in node.names if node.module == "gateway")
    return found


def test_the_checker_sees_what_it_must_refuse():
    assert _offending("sqlalchemy.orm") and _offending("fastapi") and _offending("gateway.models.jobs")
    assert _offending("gateway.kitchen") and not _offending("gateway.kit.timeutil")
    assert not _offending("gateway.domain.states") and not _offending("adapters.base")
    tree = "def f():\n    from sqlalchemy import select\n    import httpx\n"
    path = ROOT / "tests" / "unit" / "_probe.py"
    try:
        path.write_text(tree)
        assert {"sqlalchemy", "httpx"} <= _imports(path)
    finally:
        path.unlink()


def test_no_domain_module_imports_outside_the_core_in_its_source():
    bad = {f"{p.relative_to(ROOT)}: {name}" for p in DOMAIN.glob("*.py") for name in _imports(p) if _offending(name)}
    assert not bad, sorted(bad)


_LOADED = """
import importlib, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
print("\\n".join(sorted(sys.modules)))
"""


def test_importing_the_domain_loads_nothing_outside_the_core():
    modules = _modules()
    assert len(modules) >= 9, modules
    run = subprocess.run([sys.executable, "-c", _LOADED, *modules], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    loaded = run.stdout.split()
    assert set(modules) <= set(loaded)
    assert not [m for m in loaded if _offending(m)]


# What the core may not be handed (issue #46): a database session or connection, or a pool's
# adapter (whose methods reach a cluster). Adapter *data* (Capacity, Features) is fine.
_HANDLES = {"Session", "Connection", "Engine", "AsyncSession", "Backend", "Transport"}
_HANDLE_NAMES = {"session", "conn", "connection", "engine", "backend", "backends", "transport"}


def _handles_taken(source: str) -> list[str]:
    """Parameters and dataclass fields of ``source`` that take a session or a backend, by
    annotation or by name, and imports of those types."""
    tree = ast.parse(source)
    found = []

    def named(annotation: ast.AST | None) -> set[str]:
        if annotation is None:
            return set()
        text = ast.unparse(annotation)
        return {w for w in _HANDLES if w in text.replace("[", " ").replace("]", " ").replace("|", " ").replace(".", " ")
                .replace(",", " ").split()}

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and {a.name for a in node.names} & _HANDLES:
            found.append(f"line {node.lineno}: imports {sorted({a.name for a in node.names} & _HANDLES)}")
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            args = node.args
            for a in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
                if a is None:
                    continue
                if a.arg in _HANDLE_NAMES or named(a.annotation):
                    found.append(f"line {a.lineno}: parameter {a.arg}")
        if isinstance(node, ast.ClassDef):
            for stmt in node.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and (
                        stmt.target.id in _HANDLE_NAMES or named(stmt.annotation)):
                    found.append(f"line {stmt.lineno}: field {node.name}.{stmt.target.id}")
    return found


def test_the_handle_checker_finds_sessions_and_backends():
    assert _handles_taken("def f(session): pass\n")
    assert _handles_taken("def f(s: Session): pass\n")
    assert _handles_taken("def f(*, pool: Backend | None = None): pass\n")
    assert _handles_taken("class V:\n    backend: Backend | None\n")
    assert _handles_taken("from adapters.base import Backend, Capacity\n")
    assert not _handles_taken("from adapters.base import Capacity, Features\n"
                              "def f(cap: Capacity, features: Features | None, sessions_seen: int): pass\n")


def test_domain_functions_take_no_session_and_no_backend():
    """The round decides over data: capacity snapshots (PoolView.of_capacity, built by
    gateway/pools/service.py::snapshot, which asks the adapter), shapes, fair share, and the
    ledger's view of the account chains (gateway/domain/quota.py)."""
    bad = {str(p.relative_to(ROOT)): found for p in sorted(DOMAIN.glob("*.py")) if (found := _handles_taken(p.read_text()))}
    assert bad == {}, bad
