"""The OpenAPI docs page at ``/docs``: Swagger UI 5 (which reads the OpenAPI 3.1 that
FastAPI writes; 4.x cannot) from the installed ``fastapi-offline`` package, so that, like
the dashboard, it works with no internet. Its start-up script is ``web/docs.js``: the
pages' Content-Security-Policy runs no inline script."""

from __future__ import annotations

from html import escape
from importlib.resources import files
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse, HTMLResponse

__all__ = ["DOCS_ASSETS", "install_docs", "swagger_ui_dir"]

# URL path -> (file in fastapi_offline's static directory, media type)
DOCS_ASSETS = {
    "/vendor/swagger-ui/swagger-ui-bundle.js": ("swagger-ui-bundle.js", "text/javascript"),
    "/vendor/swagger-ui/swagger-ui.css": ("swagger-ui.css", "text/css"),
    "/vendor/swagger-ui/favicon.png": ("favicon.png", "image/png"),
}
START_SCRIPT = "/docs.js"  # web/docs.js, served with the dashboard

_PAGE = """<!doctype html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <meta name="viewport" content="width=device-width, initial-scale=1">
  <title>{title}</title>
  <link rel="stylesheet" href="{css}">
  <link rel="icon" href="{icon}">
</head>
<body>
  <div id="swagger-ui" data-openapi-url="{openapi_url}"></div>
  <script src="{js}"></script>
  <script src="{start}"></script>
</body>
</html>
"""


def swagger_ui_dir() -> Path:
    return Path(str(files("fastapi_offline"))) / "static"


def install_docs(app: FastAPI) -> None:
    """``/docs`` and the Swagger UI files it loads; for an app made with ``docs_url=None``
    and ``redoc_url=None`` (FastAPI's pages load them from a CDN)."""
    js, css, icon = DOCS_ASSETS
    page = _PAGE.format(
        title=escape(f"{app.title} API"),
        css=css,
        icon=icon,
        openapi_url=escape(app.openapi_url or "/openapi.json"),
        js=js,
        start=START_SCRIPT,
    )

    @app.get("/docs", include_in_schema=False)
    def docs() -> HTMLResponse:
        return HTMLResponse(page)

    for path, (name, media_type) in DOCS_ASSETS.items():
        file = swagger_ui_dir() / name

        def asset(file: Path = file, media_type: str = media_type) -> FileResponse:
            return FileResponse(file, media_type=media_type)

        app.add_api_route(path, asset, methods=["GET"], include_in_schema=False)
