"""The scaler holds its last all-reduces' handles, so no gloo worker frees the last one.

A gloo worker thread drops its reference to an all-reduce just after completing it. Were
that reference the last, the worker would free the payload, a Python tensor, which needs
the GIL; a process group destroyed meanwhile by a thread holding the GIL (as DDP's reducer
does) joins that worker: a hang. Holding the handle makes the training thread free it.
"""

from __future__ import annotations

import gc
import weakref

import torch
import torch.distributed as dist

from scalewatch import ShardedGradScaler
from scalewatch._agreement import KEEP_REDUCED


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
    payload = weakref.ref(gs._agreement.payloads[id(opt)])
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


def test_the_scaler_holds_the_handles_of_its_last_all_reduces(group: None) -> None:
    param = torch.nn.Parameter(torch.zeros(4))
    opt = torch.optim.SGD([param], lr=0.1)
    gs = ShardedGradScaler("cpu", telemetry=False)
    gs._reduce_alone = True
    handles = []
    for _ in range(KEEP_REDUCED + 2):
        _step(gs, param, opt)
        newest = gs._agreement.reduced[-1]
        assert isinstance(newest, dist.Work)
        assert newest.is_completed()  # waited on before the step went on
        handles.append(newest)
    assert list(gs._agreement.reduced) == handles[-KEEP_REDUCED:]
    gs.close()
