"""The static dashboard (``web/``) and the plotly.js it loads, both from installed packages."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path, PurePosixPath
from typing import Any

from fastapi import FastAPI, HTTPException
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles
from starlette.responses import Response
from starlette.routing import Match, Mount, Route
from starlette.types import Scope

__all__ = ["mount_dashboard", "plotly_js_path", "web_dir"]


def web_dir() -> Path:
    return Path(str(files("scalewatch.web")))


def plotly_js_path() -> Path:
    return Path(str(files("plotly"))) / "package_data" / "plotly.min.js"


# What a browser loads from web/ (a path without a suffix may name a directory's index).
SERVED_SUFFIXES = frozenset({"", ".html", ".js", ".css", ".png", ".svg", ".ico"})


class _WebFiles(StaticFiles):
    """``web/`` without the package's own files (``__init__.py``, ``__pycache__``)."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        name = PurePosixPath(path)
        if name.suffix not in SERVED_SUFFIXES or any(p.startswith("__") for p in name.parts):
            raise HTTPException(status_code=404)
        return await super().get_response(path, scope)


class _DashboardMount(Mount):
    """The dashboard at ``/``, leaving the API's paths to the API: a method an API route
    does not take is its 405 (with the methods it does take), not the static files'."""

    def __init__(self, api_paths: frozenset[str], **kwargs: Any) -> None:
        super().__init__("/", **kwargs)
        self.api_paths = api_paths

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        path = scope.get("path", "")
        if scope["type"] == "http" and (path.startswith("/api/") or path in self.api_paths):
            return Match.NONE, {}
        return super().matches(scope)


def mount_dashboard(app: FastAPI) -> None:
    """Serve ``/vendor/plotly.min.js`` and ``web/`` at ``/``; call after every other route."""
    plotly_js = plotly_js_path()

    @app.get("/vendor/plotly.min.js", include_in_schema=False)
    def plotly() -> FileResponse:
        return FileResponse(plotly_js, media_type="text/javascript")

    # The API's fixed paths: those in its schema, and the schema and docs pages themselves.
    paths = [*app.openapi()["paths"], *(r.path for r in app.routes if isinstance(r, Route))]
    api_paths = frozenset(path for path in paths if "{" not in path)
    # A file of the installed package may be a link to the checkout's (an editable install
    # in strict mode, as make venv lays it): served, as the wheel's own file would be; a
    # path that leaves web/ is refused as before (its absolute path, not its target, counts).
    web = _WebFiles(directory=web_dir(), html=True, follow_symlink=True)
    app.router.routes.append(_DashboardMount(api_paths, app=web, name="web"))
