"""The scalewatch service: REST, live stream, export and control over the store."""

from __future__ import annotations

from .main import create_app
from .settings import Settings, get_settings

__all__ = ["Settings", "create_app", "get_settings"]
