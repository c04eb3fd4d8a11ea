from __future__ import annotations

import types

import scalewatch.app.alerts


def test_all_pins_the_public_names() -> None:
    public = {
        name
        for name, value in vars(scalewatch.app.alerts).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    public.discard("annotations")
    assert set(scalewatch.app.alerts.__all__) == public
    assert sorted(scalewatch.app.alerts.__all__) == [
        "AlertConfig",
        "KINDS",
        "Kind",
        "Params",
        "Reading",
        "Rule",
        "RulesFileError",
        "RunView",
        "StepView",
        "Watch",
        "Webhook",
        "default_rules",
        "kind",
        "load_rules",
    ]
