from __future__ import annotations

import scaler


def test_all_is_pinned() -> None:
    assert scaler.__all__ == [
        "GradScaler",
        "ScalerCheckpoint",
        "ScalerConfigError",
        "ScalerStats",
        "ShardedGradScaler",
        "UnsupportedTorchError",
    ]


def test_every_exported_name_is_defined() -> None:
    for name in scaler.__all__:
        assert getattr(scaler, name).__name__ == name
