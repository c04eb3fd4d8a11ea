"""The private methods PyTorch's own scaler tests call, on torch's class and ours side by side,
on a fresh scaler and after its first ``scale()``: the same values and the same errors.

(``test_scaling_unscaling_sparse`` in torch's FSDP tests calls ``_unscale_grads_`` on a
ShardedGradScaler that has scaled nothing yet.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from tests._helpers.twin import make_pair, outcome

Case = Callable[[Any], Any]


def _optimizer(
    grads: list[torch.Tensor | None],
) -> tuple[torch.optim.Optimizer, list[torch.Tensor]]:
    params = []
    for grad in grads:
        shape = grad.shape if grad is not None else (3,)
        param = torch.zeros(shape, dtype=grad.dtype if grad is not None else torch.float32)
        if grad is not None and grad.is_sparse:
            param = torch.zeros(shape, dtype=grad.dtype).to_sparse()
        param.grad = grad
        params.append(param)
    return torch.optim.SGD(params, lr=1.0), params


def _unscale(grads: Callable[[], list[torch.Tensor | None]], allow_fp16: bool = True) -> Case:
    """``_unscale_grads_`` over fresh gradients from ``grads`` (it unscales them in place)."""

    def case(scaler: Any) -> Any:
        opt, params = _optimizer(grads())
        inv_scale = torch.full((1,), 0.5)
        found_inf = torch.zeros((1,))
        found = scaler._unscale_grads_(opt, inv_scale, found_inf, allow_fp16)
        return found, [p.grad for p in params]

    return case


def _sparse(values: list[float], indices: list[list[int]], dtype: torch.dtype) -> torch.Tensor:
    return torch.sparse_coo_tensor(
        torch.tensor(indices),
        torch.tensor(values, dtype=dtype),
        (2, 3),
        dtype=dtype,
        check_invariants=True,
    )


SPARSE_AT = [[0, 1, 1], [2, 0, 2]]
CASES: dict[str, Case] = {
    "unscale_dense": _unscale(lambda: [torch.tensor([4.0, 8.0]), torch.tensor([16.0])]),
    "unscale_dense_inf": _unscale(lambda: [torch.tensor([4.0, float("inf")])]),
    "unscale_no_grads": _unscale(lambda: [None]),
    "unscale_sparse": _unscale(lambda: [_sparse([16.0, 32.0, 64.0], SPARSE_AT, torch.float32)]),
    "unscale_sparse_inf": _unscale(
        lambda: [_sparse([16.0, 32.0, float("inf")], SPARSE_AT, torch.float32)]
    ),
    # Coalescing adds the two values at (1, 0): 2**16 overflows fp16.
    "unscale_sparse_fp16_coalesced": _unscale(
        lambda: [_sparse([2.0**15, 2.0**15, 1.0], [[1, 1, 1], [0, 0, 2]], torch.float16)]
    ),
    "unscale_fp16_refused": _unscale(lambda: [torch.tensor([1.0], dtype=torch.float16)], False),
    "get_growth_tracker": lambda s: s._get_growth_tracker(),
    "get_scale_async": lambda s: s._get_scale_async(),
    "check_scale_growth_tracker": lambda s: s._check_scale_growth_tracker("unscale_"),
    "lazy_init": lambda s: (s._lazy_init_scale_growth_tracker(torch.device("cpu")), s._scale),
    "check_inf_per_device": lambda s: s._check_inf_per_device(
        _optimizer([torch.tensor([1.0, float("nan")])])[0]
    ),
    "scale_and_tracker": lambda s: (s._scale, s._growth_tracker),
}


@pytest.mark.parametrize("first_scale", [False, True], ids=["fresh", "after_scale"])
@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("kind", ["plain", "sharded"])
def test_private_calls_match_torch(kind: str, name: str, first_scale: bool) -> None:
    theirs, ours = make_pair(kind, init_scale=4.0)
    results = []
    for scaler in (theirs, ours):
        if first_scale:
            scaler.scale(torch.ones(()))
        results.append(outcome(lambda scaler=scaler: CASES[name](scaler)))
    assert results[1] == results[0]


def test_unscale_grads_on_a_fresh_sharded_scaler_as_torchs_own_test() -> None:
    # torch's test_scaling_unscaling_sparse, as it calls the scaler.
    _, ours = make_pair("sharded", init_scale=2.0)
    opt, params = _optimizer([_sparse([16.0, 32.0, 64.0], SPARSE_AT, torch.float32)])
    found = ours._unscale_grads_(opt, torch.full((1,), 0.5), torch.zeros((1,)))
    assert found[params[0].device].item() == 0.0
    expected = _sparse([8.0, 16.0, 32.0], SPARSE_AT, torch.float32).to_dense()
    assert params[0].grad is not None
    assert torch.equal(params[0].grad.to_dense(), expected)
