"""What a module of the checkout imports, by the names the package installs it under
(``app/cli/demo.py``'s ``from ._common import x`` is ``scalewatch.app.cli._common``)."""

from __future__ import annotations

import ast
import importlib.util
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Each folder of the checkout and the package it is, as pyproject.toml's package-dir says.
with (ROOT / "pyproject.toml").open("rb") as _project:
    FOLDERS = {
        folder: package
        for package, folder in tomllib.load(_project)["tool"]["setuptools"]["package-dir"].items()
    }


def module_name(path: Path) -> str:
    """>>> module_name(ROOT / "app" / "cli" / "__init__.py")
    'scalewatch.app.cli'
    """
    folder, *rest = path.resolve().relative_to(ROOT).with_suffix("").parts
    parts = [*FOLDERS[folder].split("."), *rest]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path) -> set[str]:
    """Every module ``path`` imports, relative imports resolved, and each name a ``from``
    import takes as ``module.name`` (it may be a submodule)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            relative = "." * node.level + (node.module or "")
            base = importlib.util.resolve_name(relative, package) if node.level else relative
            names |= {base, *(f"{base}.{alias.name}" for alias in node.names)}
        elif isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
    return names
