"""Query parameters read as one model, for the hottest reads (issue #46).

FastAPI validates each declared query parameter on its own, and on every request it inspects
each one's type again (``solve_dependencies``, ``request_params_to_args``): for the eight
parameters of ``GET /v1/jobs`` that was about a third of the server's work for a list of 50.
A route that reads its parameters with :func:`read_query` validates them in ONE call of a
pydantic model built once, and declares them in OpenAPI with :func:`openapi_parameters`, so
the spec, the 422 problem+json naming ``query.<name>`` and the values are what FastAPI's own
declaration gave (tests/api/test_query_model.py compares them with a FastAPI route).

Rules kept from FastAPI: a repeated parameter that is not a list takes its last value;
unknown parameters are ignored; a list parameter takes every value given.
"""

from __future__ import annotations

import typing
from typing import Any, TypeVar

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, ValidationError

M = TypeVar("M", bound="QueryModel")


class QueryModel(BaseModel):
    """Base of a route's query parameters. Mark a deprecated one with
    ``Field(json_schema_extra={"deprecated": True})`` (pydantic's own ``deprecated=`` warns on
    every read of the attribute)."""

    model_config = ConfigDict(extra="ignore", frozen=True)


def _is_list(annotation: Any) -> bool:
    if typing.get_origin(annotation) is list:
        return True
    return any(typing.get_origin(a) is list for a in typing.get_args(annotation))


_LISTS: dict[type, frozenset[str]] = {}


def _lists_of(model: type[QueryModel]) -> frozenset[str]:
    names = _LISTS.get(model)
    if names is None:
        names = _LISTS[model] = frozenset(
            name for name, field in model.model_fields.items() if _is_list(field.annotation))
    return names


def read_query(request: Request, model: type[M]) -> M:
    """The request's query parameters as ``model``; a 422 naming ``query.<field>`` if one is bad."""
    params = request.query_params
    lists = _lists_of(model)
    data = {name: (params.getlist(name) if name in lists else value) for name, value in params.items()}
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise RequestValidationError(
            [{**error, "loc": ("query", *error["loc"])} for error in exc.errors(include_url=False)]) from None


def openapi_parameters(model: type[QueryModel]) -> list[dict[str, Any]]:
    """The OpenAPI ``parameters`` FastAPI writes for the same fields declared with ``Query()``;
    pass as ``openapi_extra={"parameters": ...}``."""
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    out = []
    for name, field in model.model_fields.items():
        prop = dict(schema["properties"][name])
        if prop.get("default", ...) is None:
            del prop["default"]  # FastAPI does not write a default of null
        param: dict[str, Any] = {}
        if prop.get("deprecated"):
            param["deprecated"] = True
        if field.description:
            param["description"] = field.description
        param.update({"in": "query", "name": name, "required": field.is_required(), "schema": prop})
        out.append(param)
    return out
