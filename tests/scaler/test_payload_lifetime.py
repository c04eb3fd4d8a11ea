"""The scaler keeps its all-reduced payloads alive, so no gloo worker frees the last one."""

from __future__ import annotations

import gc
import weakref

import torch

from scaler import ShardedGradScaler
from scaler.sharded import KEEP_REDUCED


def _step(gs: ShardedGradScaler, param: torch.nn.Parameter, opt: torch.optim.Optimizer) -> None:
    param.grad = torch.ones_like(param)
    gs.scale(torch.ones(()))
    gs.step(opt)
    gs.update()


def test_reduced_payloads_outlive_their_step_until_newer_ones_replace_them(group: None) -> None:
    param = torch.nn.Parameter(torch.zeros(4))
    opt = torch.optim.SGD([param], lr=0.1)
    gs = ShardedGradScaler("cpu", telemetry=False)
    gs._reduce_alone = True  # a group of one all-reduces as a bigger one does
    param.grad = torch.ones_like(param)
    gs.scale(torch.ones(()))
    gs.unscale_(opt)
    payload = weakref.ref(gs._per_optimizer_states[id(opt)]["payload"])
    gs.step(opt)
    gs.update()
    gs.flush()  # the recorder has read and dropped its reference too
    gc.collect()
    assert payload() is not None
    for _ in range(KEEP_REDUCED - 1):
        _step(gs, param, opt)
    gs.flush()
    gc.collect()
    assert payload() is not None
    _step(gs, param, opt)
    gs.flush()
    gc.collect()
    assert payload() is None  # freed here, on the training thread
    gs.close()
