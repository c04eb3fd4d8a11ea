"""The packages setuptools finds in each of the repository's folders, named under the one
import name ``scalewatch`` (pyproject.toml's ``package-dir`` maps each folder)."""

from __future__ import annotations

from setuptools import find_packages, setup

FOLDERS = {
    "scalewatch": "scaler",
    "scalewatch.app": "app",
    "scalewatch.migrations": "migrations",
    "scalewatch.web": "web",
}

setup(
    packages=[
        package
        for name, folder in FOLDERS.items()
        for package in (name, *(f"{name}.{found}" for found in find_packages(folder)))
    ]
)
