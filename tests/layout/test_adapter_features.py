"""Optional adapter features are found one way (issue #46, item 4), read from the source.

A pool's abilities come from its adapter through ``adapters.base.features_of``: no module of
``gateway/`` or ``adapters/`` decides by comparing a kind (or a pool's or backend's name) with
"slurm" or "kubernetes", probes a backend for a method or a class flag (``getattr``,
``hasattr``, ``unsupported_features``, ``supports()``, ``type(b).m is not Backend.m``), or tests
for an optional interface itself (``isinstance(b, WithWatch)``) or asks ``unsupported()``
outside adapters/base.py. Lazy imports and code inside functions count too.
"""

from __future__ import annotations

import ast
import pathlib

from adapters.base import ADAPTER_MODULES, INTERFACES

ROOT = pathlib.Path(__file__).resolve().parents[2]
BASE = "adapters/base.py"  # where features_of() and the interfaces are
KINDS = frozenset(ADAPTER_MODULES)
INTERFACE_NAMES = frozenset(i.__name__ for i in INTERFACES.values())
METHODS = frozenset(m for i in INTERFACES.values() for m in i.__abstractmethods__)
GONE = frozenset({"unsupported_features", "supports", "preempt_stops"})  # the old ways


def _strings(node: ast.AST) -> set[str]:
    """The string constants ``node`` is, or holds directly (a tuple, list or set of them)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return {e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    return set()


def problems(source: str, rel: str) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(source, filename=rel)):
        where = f"{rel}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(_strings(o) & KINDS for o in operands):
                out.append(f"{where}: compares with a pool kind's name")
            if any(isinstance(op, (ast.Is, ast.IsNot)) for op in node.ops) and any(
                    isinstance(o, ast.Attribute) and o.attr in METHODS for o in operands):
                out.append(f"{where}: checks whether an optional method is overridden")
        elif isinstance(node, ast.match_case) and _strings(getattr(node.pattern, "value", ast.Constant(None))) & KINDS:
            out.append(f"{where}: matches a pool kind's name")
        elif isinstance(node, ast.Attribute) and node.attr in GONE:
            out.append(f"{where}: .{node.attr}")
        elif isinstance(node, ast.Name) and node.id in GONE:
            out.append(f"{where}: {node.id}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            args = node.args[1:2]
            if node.func.id in ("getattr", "hasattr") and args and _strings(args[0]) & (METHODS | GONE):
                out.append(f"{where}: {node.func.id}() probes for a feature")
            if node.func.id in ("isinstance", "issubclass") and rel != BASE and any(
                    isinstance(n, ast.Name) and n.id in INTERFACE_NAMES for a in args for n in ast.walk(a)):
                out.append(f"{where}: tests for an optional interface itself")
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "unsupported"
                and rel != BASE):
            out.append(f"{where}: asks unsupported() instead of features_of()")
    return out


def test_the_checker_sees_every_old_way():
    bad = """
def f(view, backend, b):
    if view.kind == "slurm" or backend.name in ("kubernetes", "x"):
        pass
    match view.kind:
        case "slurm":
            pass
    getattr(backend, "unsupported_features", {})
    hasattr(b, "watch_events")
    b.supports(1)
    type(b).output_file is not Backend.output_file
    isinstance(b, WithWatch)
    b.unsupported()
    return b.preempt_stops
"""
    found = problems(bad, "gateway/x.py")
    assert len(found) == 10, found
    fine = """
def f(t, backend, features_of, Feature):
    if t.name == "cli" and features_of(backend).has(Feature.WATCH):
        return backend.watch_events(None)
    return {"slurm": 1}.get("kubernetes")
"""
    assert problems(fine, "gateway/x.py") == []


def test_no_module_decides_by_a_kind_name_or_probes_for_a_feature():
    found = [p for pkg in ("gateway", "adapters") for path in sorted((ROOT / pkg).rglob("*.py"))
             for p in problems(path.read_text(), path.relative_to(ROOT).as_posix())]
    assert found == [], "ask adapters.base.features_of(backend or kind) instead"
