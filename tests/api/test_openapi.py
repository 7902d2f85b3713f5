"""The OpenAPI document is a product: current, complete, and good enough to generate a client."""

from __future__ import annotations

import json

from gateway.cli import openapi_json
from tests.conftest import REPO

SPEC_FILE = REPO / "docs" / "openapi.json"


def test_docs_openapi_json_is_current():
    assert SPEC_FILE.read_text() == openapi_json(), (
        "docs/openapi.json differs from what the app serves; run `make openapi`")


def test_every_operation_is_documented():
    spec = json.loads(openapi_json())
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            where = f"{method.upper()} {path}"
            assert op.get("operationId"), where
            assert op.get("tags"), where
            assert op.get("summary"), where
            if path.startswith("/v1/"):
                assert "401" in op["responses"], where
                for code, resp in op["responses"].items():
                    if (code.startswith(("4", "5")) and code != "422") or code in ("401", "403", "404", "409"):
                        assert "application/problem+json" in resp.get("content", {}), f"{where} {code}"
    assert spec["components"]["securitySchemes"]


def test_every_operation_documents_the_outage_answer():
    """A database outage answers 503 with Retry-After on every route (issue #47; tests/recovery/
    test_database_outage.py): generated clients must know both."""
    spec = json.loads(openapi_json())
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            if not path.startswith("/v1/"):
                continue
            where = f"{method.upper()} {path}"
            assert "503" in op["responses"], where
            assert "Retry-After" in op["responses"]["503"].get("headers", {}), where
