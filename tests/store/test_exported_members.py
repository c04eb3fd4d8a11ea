from __future__ import annotations

import types

import scalewatch.store


def test_all_pins_the_public_names() -> None:
    public = {
        name
        for name, value in vars(scalewatch.store).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    public.discard("annotations")
    assert set(scalewatch.store.__all__) == public
    assert sorted(scalewatch.store.__all__) == [
        "ControlRequestRow",
        "ControlValidationError",
        "RequestNotFound",
        "RunNotFound",
        "RunNotRunning",
        "RunRef",
        "StepRecord",
        "Store",
        "default_url",
        "downgrade",
        "open_store",
        "upgrade",
    ]
