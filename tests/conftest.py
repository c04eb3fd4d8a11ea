"""Every test runs with its own default store, so nothing writes ./scalewatch.db."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _private_default_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCALEWATCH_DB", f"sqlite:///{tmp_path / 'default-store.db'}")
