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
