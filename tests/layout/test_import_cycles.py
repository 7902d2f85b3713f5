"""No import cycles between the gateway's modules (issue #13, item 6).

The import graph is read from the source with ``ast``: every ``import`` counts, the lazy
ones inside functions too (a lazy import is how a cycle hides), except those under
``if TYPE_CHECKING:``, which never run. ``from pkg import submodule`` depends on the
submodule, not on the package's ``__init__``.
"""

from __future__ import annotations

import ast
import importlib
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = ("gateway", "adapters")


def _modules() -> dict[str, pathlib.Path]:
    out: dict[str, pathlib.Path] = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


MODULES = _modules()


def _imports(name: str, path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for n in ast.walk(node))
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
            subs = {f"{base}.{alias.name}" for alias in node.names}
            found.update(subs & MODULES.keys())
            if not subs <= MODULES.keys():  # names from the module itself (or its __init__)
                found.add(base)
    return {m for m in found if m in MODULES and m != name}


def import_graph() -> dict[str, set[str]]:
    return {name: _imports(name, path) for name, path in MODULES.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def test_the_checker_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_import_cycle():
    assert cycles(import_graph()) == []


@pytest.mark.parametrize(("lower", "upper"), [
    ("gateway.accounts.service", "gateway.ledger"),  # the ledger reads the account tree
    ("adapters.kubernetes.watch", "adapters.kubernetes.backend"),  # the backend opens the feed
    ("gateway.identity.oidc", "gateway.identity.setup"),  # setup builds the OIDC issuers
])
def test_named_pairs_depend_one_way(lower, upper):
    """The three cycles issue #13 names: each now goes one way only."""
    graph = import_graph()
    reach: set[str] = set()
    todo = [lower]
    while todo:
        for dep in graph[todo.pop()]:
            if dep not in reach:
                reach.add(dep)
                todo.append(dep)
    assert not {m for m in reach if m == upper or m.startswith(upper + ".")}, f"{lower} reaches {upper}"


def test_kit_is_the_bottom_layer():
    """gateway.kit imports nothing from the rest of the gateway (issue #28): settings, errors,
    the database and names are what every package builds on, so none of them may depend on
    one. (Every other package's place: test_packages_import_only_downward.)"""
    graph = import_graph()
    upward = sorted((m, d) for m, deps in graph.items() if m.startswith("gateway.kit")
                    for d in deps if d.startswith("gateway.") and not d.startswith("gateway.kit"))
    assert upward == []


# The gateway's package layers, bottom to top (issue #28; docs/architecture.md, "The
# packages"). A package is a directory of gateway/ or a module directly in it ("gateway" is
# gateway/__init__.py). A package imports only from layers below its own: never from above,
# never from another package of its own layer. Every import counts, the ones inside
# functions too (_imports), so a lazy import cannot hide an upward edge.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("gateway", "kit"),  # engine, errors, settings, names, time: what everything builds on
    ("domain", "cli_login"),  # the pure decision core; the CLI's login (client side)
    ("models", "cli_client"),  # every table and the reader of a job's stored spec; the CLI's HTTP client
    ("audit",),  # the audit log's one writer: every privileged change below the HTTP layer records through it
    ("identity", "pools", "cli_user"),  # who calls; pools as data and their health; the CLI's user commands
    ("accounts",),  # the account tree, members, quotas
    ("ledger",),  # reservations, charges, budgets, fair share (reads the tree and the pools)
    ("jobs",),  # the registry, its transitions, admission (asks the ledger), dependencies
    ("flows",),  # job sets (create their tasks through jobs)
    ("dispatch", "webhooks", "metrics", "admin"),  # the services that read and drive the jobs
    ("api", "ui"),  # HTTP: the API's routers and the dashboard
    ("app",),  # the app factory
    ("cli",),  # the isthmus command (serves the app, runs workers, the admin CLI)
)
LAYER_OF = {pkg: i for i, layer in enumerate(LAYERS) for pkg in layer}


def package_of(module: str) -> str | None:
    """gateway.jobs.service -> jobs, gateway.app -> app, gateway -> gateway; None outside gateway."""
    parts = module.split(".")
    if parts[0] != "gateway":
        return None
    return parts[1] if len(parts) > 1 else "gateway"


def package_graph(graph: dict[str, set[str]]) -> dict[tuple[str, str], list[str]]:
    """(importing package, imported package) -> the module edges that make it."""
    edges: dict[tuple[str, str], list[str]] = {}
    for module, deps in graph.items():
        a = package_of(module)
        for dep in deps:
            b = package_of(dep)
            if a and b and a != b:
                edges.setdefault((a, b), []).append(f"{module} -> {dep}")
    return edges


def not_downward(edges: dict[tuple[str, str], list[str]]) -> list[str]:
    """The module edges that import from the same layer or one above (unknown packages count as above)."""
    return sorted(e for (a, b), made in edges.items()
                  if LAYER_OF.get(b, len(LAYERS)) >= LAYER_OF.get(a, -1) for e in made)


def test_the_layer_checker_refuses_upward_and_sideways_imports():
    graph = {"gateway.kit.db": {"gateway.jobs.models"}, "gateway.jobs.service": {"gateway.kit.db"},
             "gateway.dispatch.claim": {"gateway.webhooks.send"}, "gateway.api.jobs": {"gateway.newpkg.x"}}
    assert not_downward(package_graph(graph)) == [
        "gateway.api.jobs -> gateway.newpkg.x", "gateway.dispatch.claim -> gateway.webhooks.send",
        "gateway.kit.db -> gateway.jobs.models"]
    assert package_of("gateway") == "gateway" and package_of("gateway.cli") == "cli" and package_of("adapters.base") is None


def test_every_package_has_a_layer():
    packages = {package_of(m) for m in MODULES} - {None}
    assert packages == set(LAYER_OF), "add the new package to LAYERS (and docs/architecture.md), or drop the gone one"


def test_no_package_import_cycle():
    edges = package_graph(import_graph())
    graph: dict[str, set[str]] = {p: set() for p in LAYER_OF}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    assert cycles(graph) == []


def test_packages_import_only_downward():
    assert not_downward(package_graph(import_graph())) == []


_ONCE_CYCLIC = ("gateway.dispatch", "gateway.accounts", "gateway.ledger", "gateway.identity", "adapters.kubernetes",
                "gateway.jobs", "gateway.flows", "gateway.pools", "gateway.models", "gateway.domain", "gateway.api")


_FIRST_IMPORT = """
import importlib, sys
failed = []
for name in sys.argv[1:]:
    for loaded in [m for m in sys.modules if m.split(".")[0] in ("gateway", "adapters")]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except Exception as exc:
        failed.append(f"{name}: {type(exc).__name__}: {exc}")
print("\\n".join(failed))
sys.exit(1 if failed else 0)
"""


def test_each_module_imports_first():
    """Each module of the packages that had cycles imports with no gateway module loaded before it.

    (One interpreter; the gateway's and adapters' modules are dropped between two imports.)
    """
    names = sorted(m for m in MODULES if m.startswith(_ONCE_CYCLIC))
    run = subprocess.run([sys.executable, "-c", _FIRST_IMPORT, *names], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]


def test_the_graph_is_what_python_imports():
    """The static graph knows every module Python finds in the packages."""
    for pkg in PACKAGES:
        importlib.import_module(pkg)
    assert "gateway.dispatch.claim" in MODULES and "adapters.kubernetes.watch" in MODULES
