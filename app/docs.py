"""The OpenAPI docs page at ``/docs``, served with Swagger UI from an installed package:
like the dashboard, it works with no internet."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse

__all__ = ["DOCS_ASSETS", "install_docs"]

# URL path -> (file in swagger_ui_bundle's directory, media type)
DOCS_ASSETS = {
    "/vendor/swagger-ui/swagger-ui-bundle.js": ("swagger-ui-bundle.js", "text/javascript"),
    "/vendor/swagger-ui/swagger-ui.css": ("swagger-ui.css", "text/css"),
    "/vendor/swagger-ui/favicon.png": ("favicon-32x32.png", "image/png"),
}


def install_docs(app: FastAPI) -> None:
    """``/docs`` and the three Swagger UI files it loads; for an app made with
    ``docs_url=None`` and ``redoc_url=None`` (FastAPI's pages load them from a CDN)."""
    from swagger_ui_bundle import swagger_ui_path

    openapi_url = app.openapi_url or "/openapi.json"
    js, css, icon = DOCS_ASSETS

    @app.get("/docs", include_in_schema=False)
    def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=openapi_url,
            title=f"{app.title} API",
            swagger_js_url=js,
            swagger_css_url=css,
            swagger_favicon_url=icon,
        )

    for path, (name, media_type) in DOCS_ASSETS.items():
        file = Path(swagger_ui_path) / name

        def asset(file: Path = file, media_type: str = media_type) -> FileResponse:
            return FileResponse(file, media_type=media_type)

        app.add_api_route(path, asset, methods=["GET"], include_in_schema=False)
