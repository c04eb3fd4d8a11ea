"""A user's project folder: packages of its own named as other projects name theirs
(FastAPI's and Flask's ``app``, Django's and Flask-Migrate's ``migrations``, web.py's ``web``,
the index's ``scaler``), each of which fails loudly if anything imports it."""

from __future__ import annotations

from pathlib import Path

NAMES = ("app", "web", "migrations", "scaler")


def own_packages(folder: Path) -> Path:
    """Lays the four packages in ``folder`` (returned), beside whatever it holds."""
    for name in NAMES:
        (folder / name).mkdir(parents=True, exist_ok=True)
        said = f"the project's own {name!r} package was imported"
        (folder / name / "__init__.py").write_text(f"raise RuntimeError({said!r})\n")
    return folder
