"""The role every route needs: the one place it is declared.

An operation of the OpenAPI document that is missing here makes ``create_app`` refuse
to start (:func:`undeclared`), and fails the role-matrix test built from that document.
``None``: anyone, always (the probe). Paths outside this table (the documentation, the
dashboard's files) hold no data and are open.
"""

from __future__ import annotations

from typing import Any

from starlette.routing import compile_path

from scalewatch.store.identities import Role

__all__ = ["ROUTE_ROLES", "TICKET_PATHS", "needed", "undeclared"]

VIEWER, OPERATOR, ADMIN, WRITER = Role.VIEWER, Role.OPERATOR, Role.ADMIN, Role.WRITER

ROUTE_ROLES: dict[tuple[str, str], Role | None] = {
    ("GET", "/api/runs"): VIEWER,
    ("GET", "/api/runs/{run}"): VIEWER,
    ("GET", "/api/runs/{run}/steps"): VIEWER,
    ("GET", "/api/runs/{run}/overflows"): VIEWER,
    ("GET", "/api/runs/{run}/overflows/{step}"): VIEWER,
    ("GET", "/api/runs/{run}/params"): VIEWER,
    ("GET", "/api/runs/{run}/scale-loads"): VIEWER,
    ("GET", "/api/runs/{run}/spikes"): VIEWER,
    ("GET", "/api/alerts"): VIEWER,
    ("GET", "/api/runs/{run}/alerts"): VIEWER,
    ("GET", "/api/runs/{run}/control"): VIEWER,
    ("POST", "/api/runs/{run}/control"): OPERATOR,
    ("GET", "/api/control/rules"): VIEWER,
    ("GET", "/api/runs/{run}/autopilot"): VIEWER,
    ("PUT", "/api/runs/{run}/autopilot"): OPERATOR,
    ("DELETE", "/api/runs/{run}/autopilot"): OPERATOR,
    ("GET", "/api/runs/{run}/export"): VIEWER,
    ("GET", "/api/runs/{run}/stream"): VIEWER,
    ("GET", "/metrics"): VIEWER,
    ("GET", "/healthz"): None,
    ("GET", "/api/whoami"): VIEWER,
    ("POST", "/api/tickets"): VIEWER,
    ("GET", "/api/tokens"): ADMIN,
    ("POST", "/api/tokens"): ADMIN,
    ("DELETE", "/api/tokens/{name}"): ADMIN,
    # A job's token: its own runs alone (the route checks whose run it is).
    ("POST", "/api/ingest/runs"): WRITER,
    ("POST", "/api/ingest/runs/{run}/batches"): WRITER,
}

# Routes that a short-lived ticket in the query may open (app.tickets): the browser cannot
# send a header with an EventSource, nor with a download link.
TICKET_PATHS = frozenset({"/api/runs/{run}/stream", "/api/runs/{run}/export"})


_PATTERNS = [
    (method, compile_path(path)[0], path, role) for (method, path), role in ROUTE_ROLES.items()
]


def needed(method: str, path: str) -> tuple[str, Role | None] | None:
    """The route template a request of ``method`` to ``path`` goes to, and the role it
    needs; None for a path of no route here (the router answers: a file of the dashboard,
    the documentation, a 404, a 405).

    >>> needed("POST", "/api/runs/7/control")
    ('/api/runs/{run}/control', <Role.OPERATOR: 'operator'>)
    """
    for want, pattern, template, role in _PATTERNS:
        if want == method and pattern.match(path):
            return template, role
    return None


def undeclared(openapi: dict[str, Any]) -> list[str]:
    """``"METHOD /path"`` of each operation of the OpenAPI document that is not in
    ``ROUTE_ROLES``."""
    return [
        f"{method.upper()} {path}"
        for path, operations in openapi.get("paths", {}).items()
        for method in operations
        if (method.upper(), path) not in ROUTE_ROLES
    ]
