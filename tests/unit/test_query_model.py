"""kit/query.py reads query parameters as FastAPI's own declaration would (issue #46).

GET /v1/jobs validates its query parameters in one pydantic call instead of FastAPI's one per
parameter. Two real FastAPI routes side by side, the list's parameters declared FastAPI's way
(as the route was before) and read by ``read_query``: the same answers, the same 422 fields and
messages, the same OpenAPI parameters.
"""

from __future__ import annotations

from typing import Annotated

import pytest
from fastapi import FastAPI, Query, Request
from fastapi.testclient import TestClient

from gateway.api.jobs import JOB_SET_RE, JobListQuery
from gateway.domain.states import JobState
from gateway.jobs.schemas import POOL_CHOICE_RE
from gateway.kit.errors import install_error_handlers
from gateway.kit.names import ACCOUNT_NAME_RE
from gateway.kit.query import openapi_parameters, read_query


def _app() -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/declared")
    def declared(
        state: Annotated[list[JobState] | None, Query(description="Only these states (repeatable).")] = None,
        account: Annotated[str | None, Query(pattern=ACCOUNT_NAME_RE)] = None,
        pool: Annotated[str | None, Query(pattern=POOL_CHOICE_RE, max_length=63,
                                          description="Pool asked for or routed to.")] = None,
        backend: Annotated[str | None, Query(pattern=POOL_CHOICE_RE, max_length=63, deprecated=True,
                                             description="Deprecated alias of `pool`.")] = None,
        cursor: Annotated[str | None, Query(max_length=128)] = None,
        limit: Annotated[int, Query(ge=1, le=500)] = 50,
        job_set: Annotated[str | None, Query(pattern=JOB_SET_RE,
                                             description="Only the tasks of this array or sweep.")] = None,
    ) -> dict:
        return {"state": [s.value for s in state] if state is not None else None, "account": account,
                "pool": pool, "backend": backend, "cursor": cursor, "limit": limit, "job_set": job_set}

    @app.get("/model", openapi_extra={"parameters": openapi_parameters(JobListQuery)})
    def model(request: Request) -> dict:
        q = read_query(request, JobListQuery)
        return {"state": [s.value for s in q.state] if q.state is not None else None, "account": q.account,
                "pool": q.pool, "backend": q.backend, "cursor": q.cursor, "limit": q.limit, "job_set": q.job_set}

    return app


QUERIES = [
    "", "limit=7", "state=running&state=pending", "state=running", "account=team-a&pool=auto",
    "backend=slurm-a", "cursor=abc&limit=500", "job_set=0192f0c4-7d3e-7a51-8c3e-5b1f0d9a2c44",
    "limit=1&limit=3",  # a repeated scalar: the last value
    "unknown=1&limit=2",  # unknown parameters are ignored
    # bad input: a 422 naming each field
    "limit=0", "limit=501", "limit=abc", "limit=", "state=nope", "state=running&state=nope",
    "account=Team_A", "account=", "pool=" + "a" * 64, "cursor=" + "x" * 129, "job_set=0192",
    "limit=0&account=BAD&state=x",
]


@pytest.mark.parametrize("query", QUERIES)
def test_same_answers_as_fastapis_declaration(query):
    client = TestClient(_app())
    declared = client.get(f"/declared?{query}")
    model = client.get(f"/model?{query}")
    assert model.status_code == declared.status_code
    expected = declared.json()
    if declared.status_code == 422:
        expected["instance"] = "/model"  # the problem names the path asked
        assert model.headers["content-type"] == "application/problem+json"
        assert model.json()["errors"], query
    assert model.json() == expected


def test_a_bad_value_is_named_and_explained():
    answer = TestClient(_app()).get("/model?limit=0&state=nope")
    assert answer.status_code == 422
    fields = {e["field"]: e["message"] for e in answer.json()["errors"]}
    assert fields.keys() == {"query.limit", "query.state.0"}
    assert "greater than or equal to 1" in fields["query.limit"]


def test_same_openapi_parameters():
    spec = _app().openapi()
    assert spec["paths"]["/model"]["get"]["parameters"] == spec["paths"]["/declared"]["get"]["parameters"]
