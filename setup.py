"""The packages setuptools finds in each of the repository's folders, named under the one
import name ``scalewatch``, as pyproject.toml's ``package-dir`` maps each folder."""

from __future__ import annotations

import tomllib

from setuptools import find_packages, setup

with open("pyproject.toml", "rb") as project:
    FOLDERS: dict[str, str] = tomllib.load(project)["tool"]["setuptools"]["package-dir"]

setup(
    packages=[
        package
        for name, folder in FOLDERS.items()
        for package in (name, *(f"{name}.{found}" for found in find_packages(folder)))
    ]
)
