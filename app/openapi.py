"""The OpenAPI document, as FastAPI writes it, less what the wire cannot carry: an optional
query or header parameter (``int | None``) is absent, never ``null``, yet FastAPI writes
its schema as ``anyOf: [integer, null]``, and a client sending ``?after=null`` is refused.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

__all__ = ["install_openapi", "without_null_parameters"]


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


def install_openapi(app: FastAPI) -> None:
    """Serve :func:`without_null_parameters` of FastAPI's document at ``/openapi.json``."""
    write = app.openapi

    def openapi() -> dict[str, Any]:
        return without_null_parameters(write())  # in place, on FastAPI's cached document

    app.openapi = openapi  # type: ignore[method-assign]
