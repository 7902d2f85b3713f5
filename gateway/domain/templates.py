"""The sweep template syntax: ``{{ name }}`` in ``command`` items and ``env`` values.

Plain string substitution, never a shell: each argv item stays one argv item whatever
the value holds. ``{{ index }}`` is the task's index in its set (also in the
``ISTHMUS_ARRAY_INDEX`` variable). A name that is neither ``index`` nor a sweep
parameter is refused at submit (422 naming the field).
"""

from __future__ import annotations

import re
from typing import Any

PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]{0,62})\s*\}\}")
BUILTINS = ("index",)


def format_value(value: Any) -> str:
    """How a sweep value is written into a string: JSON-like for booleans, repr-free numbers."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def names_in(text: str) -> list[str]:
    return PLACEHOLDER.findall(text)


def unknown_names(command: list[str], env: dict[str, str], known: set[str]) -> tuple[str, str] | None:
    """The first (field, name) whose placeholder names no parameter, or None."""
    for i, arg in enumerate(command):
        for name in names_in(arg):
            if name not in known:
                return f"body.command[{i}]", name
    for key, value in env.items():
        for name in names_in(value):
            if name not in known:
                return f"body.env.{key}", name
    return None


def render(text: str, values: dict[str, str]) -> str:
    if "{{" not in text:
        return text
    return PLACEHOLDER.sub(lambda m: values[m.group(1)], text)


# Only these keys of a task's spec differ between the tasks of one set.
RENDERED = frozenset(("command", "env", "parameters"))


class Template:
    """A set's stored spec and task count: renders any of its tasks."""

    __slots__ = ("count", "spec")

    def __init__(self, spec: dict[str, Any], count: int) -> None:
        self.spec, self.count = spec, count

    def render(self, own: dict[str, Any], index: int) -> dict[str, Any]:
        """The task's full spec from its own values (``job.spec``) and its index."""
        values = {**(own.get("parameters") or {}), "index": str(index)}
        command, env = render_task(self.spec["command"], self.spec.get("env") or {}, values, self.count)
        spec = {**self.spec, "command": command, "env": env}
        if "parameters" in own:
            spec["parameters"] = own["parameters"]
        return spec


def render_task(command: list[str], env: dict[str, str], values: dict[str, str], count: int
                ) -> tuple[list[str], dict[str, str]]:
    """A task's command and env: the templates with its values, and the array variables."""
    command = [render(arg, values) for arg in command]
    env = {k: render(v, values) for k, v in env.items()}
    # Set after the user's env (whose ISTHMUS_ keys the schema refuses), so these are the gateway's.
    env["ISTHMUS_ARRAY_INDEX"] = values["index"]
    env["ISTHMUS_ARRAY_COUNT"] = str(count)
    return command, env
