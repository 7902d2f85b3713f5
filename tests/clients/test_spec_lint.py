"""Spec lint: rules that keep docs/openapi.json usable by generated clients (issue #17).

Each rule is one item of the issue; the TypeScript and Go clients built from the spec
(test_clients.py) are the end-to-end proof, these rules say exactly what must not return.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import REPO

SPEC = json.loads((REPO / "docs" / "openapi.json").read_text())
SCHEMAS = SPEC["components"]["schemas"]
PROBLEM = {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}}


def operations() -> Iterator[tuple[str, dict[str, Any]]]:
    for path, ops in SPEC["paths"].items():
        for method, op in ops.items():
            yield f"{op['operationId']} ({method.upper()} {path})", op


def walk(node: Any, where: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    if isinstance(node, dict):
        yield where, node
        for key, value in node.items():
            yield from walk(value, f"{where}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from walk(value, f"{where}/{i}")


def resolve(node: dict[str, Any]) -> dict[str, Any]:
    ref = node.get("$ref")
    return SCHEMAS[ref.rsplit("/", 1)[1]] if ref else node


def test_every_error_response_is_problem_json():
    """Item 1: no operation declares FastAPI's HTTPValidationError or a JSON error body."""
    bad = []
    for name, op in operations():
        for code, resp in op["responses"].items():
            if code[0] in "45" and not (op["operationId"] == "readyz" and code == "503"):
                if resp.get("content") != PROBLEM:
                    bad.append(f"{name} {code}: {sorted(resp.get('content', {}))}")
        if op["operationId"] != "healthz" and op["operationId"] != "readyz":
            if "422" not in op["responses"] and (op.get("parameters") or op.get("requestBody")):
                bad.append(f"{name}: takes input but declares no 422")
    assert not bad, bad
    assert "HTTPValidationError" not in SCHEMAS and "ValidationError" not in SCHEMAS


@pytest.mark.parametrize("kind, fmt", [("integer", "int64"), ("number", "double")])
def test_integers_are_int64_and_numbers_double(kind, fmt):
    """Items 2 and 3: without a format, Go generates int32 / float32."""
    bad = [where for where, node in walk(SPEC) if node.get("type") == kind and node.get("format") != fmt]
    assert not bad, bad


def test_no_union_of_number_and_integer():
    """Item 5: `number | integer` leaves the integer branch unused in Go."""
    for where, node in walk(SPEC):
        types = {resolve(b).get("type") for b in node.get("anyOf", []) + node.get("oneOf", [])}
        assert not {"number", "integer"} <= types, where


OUTPUT_ENUMS = {
    # Pools are data (a string checked against GET /v1/pools), not an enum: no entry for pool names.
    ("JobOut", "pool_kind"): "PoolKind", ("JobOut", "state"): "JobState",
    ("PoolOut", "state"): "PoolState", ("AdminPoolOut", "state"): "PoolState",
    ("LedgerEntryOut", "kind"): "LedgerEntryKind", ("MemberOut", "role"): "MemberRole",
    ("UsageReport", "period"): "UsagePeriod", ("QuotaOut", "budget_period"): "BudgetPeriod",
    ("ReadyOut", "status"): "ReadyStatus",
}


@pytest.mark.parametrize("schema, prop", sorted(OUTPUT_ENUMS))
def test_outputs_use_the_named_enum_of_the_input(schema, prop):
    """Item 4: a value read from a response goes back into a request without a cast."""
    node = SCHEMAS[schema]["properties"][prop]
    refs = [b.get("$ref") for b in node.get("anyOf", [node])]
    assert f"#/components/schemas/{OUTPUT_ENUMS[schema, prop]}" in refs, node


def test_enum_parameters_are_named_schemas():
    """Item 4: filters take the same enum types the responses carry."""
    bad = []
    for name, op in operations():
        for param in op.get("parameters", []):
            for _where, node in walk(param["schema"]):
                if "enum" in node:
                    bad.append(f"{name} {param['name']}")
    assert not bad, bad


def test_inputs_typed_as_accepted():
    """Item 5: time_limit and memory_per_worker accept integers as well as strings."""
    for prop in ("time_limit", "memory_per_worker"):
        node = SCHEMAS["JobSpec"]["properties"][prop]
        assert {b.get("type") for b in node["anyOf"]} >= {"string", "integer"}, prop


def test_every_success_response_has_one_typed_body():
    """Item 5: readyz had an empty schema; usage CSV was typed as the JSON model."""
    bad = []
    for name, op in operations():
        for code, resp in op["responses"].items():
            if code.startswith("2") and code != "204":
                content = resp.get("content", {})
                schemas = [c.get("schema") for c in content.values()]
                if len(content) != 1 or not schemas[0] or schemas[0] == {}:
                    bad.append(f"{name} {code}: {content}")
                elif "text/csv" in content and schemas[0].get("type") != "string":
                    bad.append(f"{name} {code}: CSV not a string")
    assert not bad, bad
    assert set(SPEC["paths"]["/v1/admin/usage.csv"]["get"]["responses"]["200"]["content"]) == {"text/csv"}


def test_problem_fields_are_required_and_not_null():
    """Item 5: a nullable `detail` makes Go print pointers in error strings."""
    problem = SCHEMAS["Problem"]
    assert set(problem["required"]) >= {"type", "title", "status", "detail", "instance"}
    for name, prop in problem["properties"].items():
        assert "anyOf" not in prop and prop.get("type") != "null", name


def test_servers_entry():
    """Item 5: generated clients take their default base URL from `servers`."""
    assert SPEC.get("servers") and SPEC["servers"][0]["url"].startswith("http")


def test_no_additional_properties_false():
    """Item 5: openapi-generator warns "Failed to get the schema name" on these."""
    assert not [where for where, node in walk(SPEC) if node.get("additionalProperties") is False]
