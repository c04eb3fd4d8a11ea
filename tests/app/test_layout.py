"""Where the service's code lives: its SQL is the store's alone."""

from __future__ import annotations

import ast
from pathlib import Path

from scalewatch import app

APP = Path(app.__file__).resolve().parent


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
    return names


def test_the_service_writes_no_sql_of_its_own() -> None:
    """Statements are written in scalewatch.store; app/ may only catch the driver's errors."""
    writes_sql = {
        path.relative_to(APP).as_posix(): sorted(
            name
            for name in _imports(path)
            if name.split(".")[0] == "sqlalchemy" and name != "sqlalchemy.exc"
        )
        for path in APP.rglob("*.py")
    }
    assert {path: names for path, names in writes_sql.items() if names} == {}
