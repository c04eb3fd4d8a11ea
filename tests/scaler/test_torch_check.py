"""A torch whose internals differ from what the scaler relies on refuses the scaler when it
is made, in one line; both shapes of ``_maybe_opt_step``'s return train as torch's do."""

from __future__ import annotations

import importlib.util
import logging
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.amp import grad_scaler as amp_grad_scaler

import scalewatch
from scalewatch import _torch_check as check
from scalewatch import _torch_compat as compat
from tests._helpers.twin import make_pair, mlp

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _checked_afresh() -> Iterator[None]:
    """Each test's torch is checked anew, and the next test's too (monkeypatch's changes
    are undone before this fixture's end)."""
    check.forget_checks()
    yield
    check.forget_checks()


def refusal(make: Any) -> str:
    with pytest.raises(scalewatch.UnsupportedTorchError) as caught:
        make()
    message = str(caught.value)
    assert "\n" not in message
    prefix = f"scalewatch does not support torch {torch.__version__}: "
    assert message.startswith(prefix)
    return message.removeprefix(prefix).removesuffix(" (tested: torch 2.4 to 2.15)")


BOTH = [
    lambda: scalewatch.GradScaler("cpu", telemetry=False),
    lambda: scalewatch.ShardedGradScaler("cpu", telemetry=False),
]


def test_this_torch_is_one_the_scaler_knows() -> None:
    assert check.torch_mismatch() is None
    assert check.step_shape() == check.StepShape(pair=False)
    check.require_supported_torch()


@pytest.mark.parametrize("make", BOTH, ids=["plain", "sharded"])
def test_a_changed_private_signature_refuses_the_scaler(
    monkeypatch: pytest.MonkeyPatch, make: Any
) -> None:
    def unscale_grads(self: Any, optimizer: Any, inv_scale: Any, found_inf: Any) -> Any:
        raise AssertionError("never called")

    monkeypatch.setattr(compat.TorchGradScaler, "_unscale_grads_", unscale_grads)
    assert refusal(make) == (
        "private signature changed: GradScaler._unscale_grads_('self', 'optimizer',"
        " 'inv_scale', 'found_inf'), expected ('self', 'optimizer', 'inv_scale', 'found_inf',"
        " 'allow_fp16')"
    )


def test_a_changed_per_optimizer_state_refuses_the_scaler(monkeypatch: pytest.MonkeyPatch) -> None:
    def refresh() -> dict[str, Any]:
        return {"stage": compat.OptState.READY, "found_inf_per_device": {}, "retries": 0}

    monkeypatch.setattr(amp_grad_scaler, "_refresh_per_optimizer_state", refresh)
    assert refusal(BOTH[0]).startswith("a fresh per-optimizer state is {'stage': <OptState.READY")


def test_a_changed_optimizer_stage_refuses_the_scaler(monkeypatch: pytest.MonkeyPatch) -> None:
    import enum

    monkeypatch.setattr(amp_grad_scaler, "OptState", enum.Enum("OptState", "READY STEPPED"))
    assert refusal(BOTH[1]) == (
        "OptState's stages are ['READY', 'STEPPED'], expected ['READY', 'UNSCALED', 'STEPPED']"
    )


def test_an_unknown_opt_step_return_refuses_the_scaler(monkeypatch: pytest.MonkeyPatch) -> None:
    def maybe_opt_step(
        self: Any, optimizer: Any, optimizer_state: Any, *args: Any, **kwargs: Any
    ) -> Any:
        return {"retval": optimizer.step(*args, **kwargs)}

    monkeypatch.setattr(compat.TorchGradScaler, "_maybe_opt_step", maybe_opt_step)
    assert refusal(BOTH[0]) == (
        "_maybe_opt_step returned {'retval': 'stepped'}, expected the optimizer's return value"
    )


def test_a_missing_kernel_refuses_the_scaler(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(torch, "_amp_update_scale_")
    assert refusal(BOTH[1]) == "torch has no _amp_update_scale_"


def test_a_missing_private_fails_the_import_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch moves a private the compat module imports: importing it says so, in one line."""
    monkeypatch.delattr(amp_grad_scaler, "_MultiDeviceReplicator")
    spec = importlib.util.spec_from_file_location("scalewatch._torch_compat_again", compat.__file__)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    message = refusal(lambda: spec.loader.exec_module(module))  # type: ignore[union-attr]
    assert message.startswith("cannot import name '_MultiDeviceReplicator'")


class Returning(torch.optim.SGD):
    """An optimizer whose step returns a value (as LBFGS returns the loss)."""

    def step(self, closure: Any = None) -> Any:
        super().step(closure)
        return 0.25


def steps(kind: str, **step_kwargs: Any) -> list[tuple[Any, Any]]:
    """What torch's scaler's and ours' step() return: a clean step, then an overflow."""
    returned = []
    models = mlp(), mlp()
    optimizers = [Returning(m.parameters(), lr=0.1) for m in models]
    for overflow in (False, True):
        pair = []
        for scaler_, model, optimizer in zip(make_pair(kind), models, optimizers, strict=True):
            optimizer.zero_grad()
            scaler_.scale(model(torch.ones(3, 4)).sum()).backward()
            if overflow:
                next(model.parameters()).grad.view(-1)[0] = float("inf")
            pair.append(scaler_.step(optimizer, **step_kwargs))
            scaler_.update()
        returned.append(tuple(pair))
    return returned


def test_step_returns_the_optimizers_value_as_torchs(kind: str) -> None:
    assert steps(kind) == [(0.25, 0.25), (None, None)]


def emulate_found_inf_return(monkeypatch: pytest.MonkeyPatch, found_type: type) -> None:
    """torch's GradScaler as proposed upstream: ``_maybe_opt_step`` returns (retval,
    found_inf), and ``step(..., return_found_inf=True)`` hands the pair back."""
    maybe_opt_step, step = compat.TorchGradScaler._maybe_opt_step, compat.TorchGradScaler.step

    def pair_maybe_opt_step(
        self: Any, optimizer: Any, optimizer_state: Any, *args: Any, **kwargs: Any
    ) -> tuple[Any, Any]:
        found = sum(v.item() for v in optimizer_state["found_inf_per_device"].values())
        retval = maybe_opt_step(self, optimizer, optimizer_state, *args, **kwargs)
        return retval, (torch.tensor(found) if found_type is torch.Tensor else bool(found))

    def pair_step(
        self: Any, optimizer: Any, *args: Any, return_found_inf: bool = False, **kwargs: Any
    ) -> Any:
        retval, found_inf = step(self, optimizer, *args, **kwargs)
        return (retval, found_inf) if return_found_inf else retval

    monkeypatch.setattr(compat.TorchGradScaler, "_maybe_opt_step", pair_maybe_opt_step)
    monkeypatch.setattr(compat.TorchGradScaler, "step", pair_step)


@pytest.mark.parametrize("found_type", [bool, torch.Tensor], ids=["bool", "tensor"])
def test_step_returns_the_pair_on_a_torch_whose_opt_step_returns_one(
    kind: str, monkeypatch: pytest.MonkeyPatch, found_type: type
) -> None:
    emulate_found_inf_return(monkeypatch, found_type)
    assert check.step_shape() == check.StepShape(pair=True, found_type=found_type)
    assert steps(kind) == [(0.25, 0.25), (None, None)]
    (clean, overflow) = steps(kind, return_found_inf=True)
    for theirs, ours in (clean, overflow):
        assert theirs[0] == ours[0]
        assert type(ours[1]) is found_type
        assert bool(theirs[1]) == bool(ours[1])
    assert [bool(found) for _, found in (clean[1], overflow[1])] == [False, True]


def lanes() -> list[str]:
    """The torch releases CI's lanes test (the Makefile's ``TORCH_LANES``)."""
    found = re.search(r"^TORCH_LANES :?= (.+)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert found is not None
    return found.group(1).split()


def minor(version: str) -> tuple[int, int]:
    major, minor_, *_ = version.split(".")
    return int(major), int(minor_)


def test_the_declared_torch_range_is_the_tested_range() -> None:
    """pyproject admits torch from the oldest lane's release to the newest lane's, no more;
    constraints.txt's torch (the one every other test runs on) lies inside."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (requirement,) = [d for d in project["dependencies"] if re.match(r"torch\W", d)]
    oldest, newest = lanes()
    low, high = minor(oldest), minor(newest)
    assert requirement == f"torch>={low[0]}.{low[1]},<{high[0]}.{high[1] + 1}"
    assert str(check.unsupported("x")).endswith(
        f"(tested: torch {low[0]}.{low[1]} to {high[0]}.{high[1]})"
    )
    pins = dict(
        line.split("==")
        for line in (ROOT / "constraints.txt").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    )
    assert low <= minor(pins["torch"]) <= high


def test_an_older_torch_without_public_fsdp2_is_told_once_in_one_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(check, "FSDP2_PUBLIC", False)
    with caplog.at_level(logging.WARNING, logger="scalewatch"):
        scalewatch.GradScaler("cpu", telemetry=False)  # FSDP2 is the sharded scaler's
        assert caplog.messages == []
        scalewatch.ShardedGradScaler("cpu", telemetry=False)
        scalewatch.ShardedGradScaler("cpu", telemetry=False)
    assert caplog.messages == [
        f"scalewatch: torch {torch.__version__} predates FSDP2's public fully_shard"
        " (torch 2.6): ShardedGradScaler is tested on it with DDP and FSDP1, not FSDP2"
    ]


def test_this_torchs_public_fsdp2_is_found(caplog: pytest.LogCaptureFixture) -> None:
    from torch.distributed import fsdp

    assert check.FSDP2_PUBLIC is hasattr(fsdp, "fully_shard")
    with caplog.at_level(logging.WARNING, logger="scalewatch"):
        scalewatch.ShardedGradScaler("cpu", telemetry=False)
    assert (caplog.messages == []) is check.FSDP2_PUBLIC
