"""Only the composition root reads the process-wide settings (issue #28, "settings leak").

A module that calls ``get_settings()`` reads the environment's settings behind its caller's
back: a gateway built with injected settings (tests, benchmarks, ``create_app(settings)``)
then runs part of its work with other values (the fair-share half-life leak). Components are
handed their settings, or their group of them, by their caller. Read from the source with
``ast``: a call through any name or attribute counts, lazy imports inside functions too.
"""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
# The composition root builds the app and the worker from the environment; the definition
# itself; Alembic's env.py is the entry point of `alembic` run by hand (isthmus migrate and
# the tests pass their URL in the config instead).
ALLOWED = {"gateway/app.py", "gateway/cli.py", "gateway/kit/settings.py", "migrations/env.py"}


def _readers() -> list[str]:
    found = []
    for pkg in ("gateway", "adapters", "migrations"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel in ALLOWED:
                continue
            for node in ast.walk(ast.parse(path.read_text(), filename=rel)):
                if isinstance(node, ast.Call):
                    name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                    if name == "get_settings":
                        found.append(f"{rel}:{node.lineno}")
                elif isinstance(node, ast.ImportFrom) and any(a.name == "get_settings" for a in node.names):
                    found.append(f"{rel}:{node.lineno} (import)")
    return found


def test_no_module_reads_the_global_settings_outside_the_composition_root():
    assert _readers() == [], "pass settings (or their group) in from gateway/app.py or gateway/cli.py instead"
