"""The static dashboard (``web/``) and the plotly.js it loads, both from installed packages."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

__all__ = ["mount_dashboard", "plotly_js_path", "web_dir"]


def web_dir() -> Path:
    return Path(str(files("web")))


def plotly_js_path() -> Path:
    return Path(str(files("plotly"))) / "package_data" / "plotly.min.js"


def mount_dashboard(app: FastAPI) -> None:
    """Serve ``/vendor/plotly.min.js`` and ``web/`` at ``/``; call after every other route."""
    plotly_js = plotly_js_path()

    @app.get("/vendor/plotly.min.js", include_in_schema=False)
    def plotly() -> FileResponse:
        return FileResponse(plotly_js, media_type="text/javascript")

    app.mount("/", StaticFiles(directory=web_dir(), html=True), name="web")
