"""Property-based API testing from the app's own OpenAPI document.

Hundreds of generated requests (valid and invalid) against the real app and database:
no 5xx, and every response matches the documented schema, status codes and content type.
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

# x 24 operations x 2 databases. A budget: 30 took 250 s of the suite (issue #44); the API's
# rules each have their own tests, this checks that the spec and the app agree.
EXAMPLES_PER_OPERATION = 12

# FastAPI emits OpenAPI 3.1; schemathesis 3.x supports it behind this switch.
schemathesis.experimental.OPEN_API_3_1.enable()


@pytest.fixture
def api_schema(gw):
    schema = schemathesis.from_asgi("/openapi.json", gw.app)
    # Authenticated as an admin so every operation is reachable; tenancy has its own tests.
    # Server-sent events never end, and the in-process ASGI call waits for the end of the
    # response: that stream is tested over a real socket (tests/jobs/test_events_stream.py).
    schema = schema.exclude(operation_id="streamJobEvents")
    schema.__isthmus_headers = gw.headers("root", ("team-a",), admin=True)
    return schema


schema = schemathesis.from_pytest_fixture("api_schema")


@schema.parametrize()
@settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                 HealthCheck.function_scoped_fixture])
def test_api_conforms_to_its_spec(case, api_schema):
    # The token goes on the case itself, so schemathesis's own auth checks (which replay
    # the request without it / with a broken one) see a 401 as they should.
    case.headers = {**(case.headers or {}), **api_schema.__isthmus_headers}
    response = case.call_asgi()
    assert response.status_code < 500, response.text
    case.validate_response(response)
