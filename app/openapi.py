"""The OpenAPI document, as FastAPI writes it, with the role each operation needs and the
refusals it brings, less what the wire cannot carry: an optional query or header
parameter (``int | None``) is absent, never ``null``, yet FastAPI writes its schema as
``anyOf: [integer, null]``, and a client sending ``?after=null`` is refused.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from scalewatch.store.identities import Role

from .ingest import batch_schemas
from .middleware.roles import ROUTE_ROLES

__all__ = ["install_openapi", "with_roles", "without_null_parameters"]


def without_null_parameters(document: dict[str, Any]) -> dict[str, Any]:
    """``document`` with the ``null`` choice dropped from every parameter's schema.

    >>> doc = {"paths": {"/a": {"get": {"parameters": [{"name": "n", "schema": {"anyOf": [
    ...     {"type": "integer", "minimum": 0}, {"type": "null"}], "title": "N"}}]}}}}
    >>> without_null_parameters(doc)["paths"]["/a"]["get"]["parameters"][0]["schema"]
    {'title': 'N', 'type': 'integer', 'minimum': 0}
    """
    for operations in document.get("paths", {}).values():
        for operation in operations.values():
            for parameter in operation.get("parameters", []):
                schema = parameter.get("schema", {})
                choices = [c for c in schema.get("anyOf", []) if c.get("type") != "null"]
                if len(choices) == 1 and len(schema["anyOf"]) == 2:
                    del schema["anyOf"]
                    schema.update(choices[0])
    return document


REFUSALS: dict[str, dict[str, Any]] = {
    "401": {
        "description": "no token, or an unknown, revoked or expired one (the detail says which)",
    },
    "403": {"description": "the identity has not the role this needs"},
    "429": {
        "description": "too many wrong tokens from this client lately: refused, whatever"
        " the token, for the seconds in Retry-After",
        "headers": {"Retry-After": {"schema": {"type": "integer"}}},
    },
}


def with_roles(document: dict[str, Any]) -> dict[str, Any]:
    """``document`` with the role each operation needs (``scalewatch.app.middleware.roles``) in
    its description and ``x-role``, and the refusals that role brings among its responses."""
    error = {
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorMessage"}}}
    }
    for path, operations in document.get("paths", {}).items():
        for method, operation in operations.items():
            need = ROUTE_ROLES.get((method.upper(), path))
            if need is None:
                continue
            operation["x-role"] = need.value
            words = f"Needs the role **{need.value}**" + (
                " (open to anyone on a service bound to loopback, or started --public-read)."
                if need is Role.VIEWER
                else "."
            )
            said = operation.get("description", "")
            if words not in said:
                operation["description"] = f"{said}\n\n{words}".strip()
            responses = operation.setdefault("responses", {})
            for code, refusal in REFUSALS.items():
                responses.setdefault(code, {**refusal, **error})
    return document


def install_openapi(app: FastAPI) -> None:
    """Serve :func:`without_null_parameters` and :func:`with_roles` of FastAPI's document
    at ``/openapi.json``."""
    write = app.openapi

    def openapi() -> dict[str, Any]:
        document = with_roles(without_null_parameters(write()))  # in place, on FastAPI's cached one
        schemas = document.setdefault("components", {}).setdefault("schemas", {})
        for name, schema in batch_schemas().items():  # a body the route reads itself
            schemas.setdefault(name, schema)
        return document

    app.openapi = openapi  # type: ignore[method-assign]
