from __future__ import annotations

import scalewatch


def test_all_is_pinned() -> None:
    assert scalewatch.__all__ == [
        "GradScaler",
        "ScalerCheckpoint",
        "ScalerConfigError",
        "ScalerStats",
        "ShardedGradScaler",
        "UnsupportedTorchError",
    ]


def test_every_exported_name_is_defined() -> None:
    for name in scalewatch.__all__:
        assert getattr(scalewatch, name).__name__ == name
