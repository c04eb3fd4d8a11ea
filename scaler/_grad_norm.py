"""The gradient norm of a step: measured as each optimizer's gradients are unscaled.

Runs on the training thread of every rank. The total L2 norm of the unscaled gradients
is the value ``torch.nn.utils.clip_grad_norm_`` returns for them: each gradient's norm in
one fused pass per device and dtype (``torch._foreach_norm``), then the norm of those.
Gradients every rank holds whole (a plain module, DDP) count once; the squares of the
shards a rank holds (FSDP1's flat parameters and, with ``use_orig_params=True``, the
originals that are views into them; FSDP2's sharded DTensors) ride in the all-reduce that
agrees on found_inf, so every rank ends with the same total and no collective is added.
That all-reduce sums over every rank of the scaler's group: where replicas hold the same
shards (HSDP: FSDP1's ``HYBRID_SHARD``, FSDP2 on a 2-D mesh) each shard is summed once per
replica, so each rank's squares are weighted by shards / ranks before it. Everything
stays on the device: no value is read on the host.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from ._torch_compat import foreach_l2_norm, local_tensor, shard_count

# (device, dtype, count of shards: 1 for whole) -> (parameters, their gradients): one fused
# pass per device and dtype, as torch's clip_grad_norm_ makes
Buckets = dict[tuple[torch.device, torch.dtype, int], tuple[list[torch.Tensor], list[torch.Tensor]]]


class GradNorm:
    """A scaler's gradient norm: measured (``on``) or handed in (:meth:`give`).

    ``last`` is the norm of the gradients unscaled so far this step (after ``unscale_``), or
    of the last step (after ``update()``); ``None`` before any. Transient: a copy of the
    scaler starts without one.
    """

    __slots__ = ("_given", "_squares", "last", "on", "param_norms", "params", "shard_squares")

    def __init__(self, on: bool) -> None:
        self.on = on
        self.last: torch.Tensor | None = None
        self._squares: torch.Tensor | None = None  # this step's, summed over its optimizers
        self._given: torch.Tensor | None = None
        # The squares of this rank's shards of the optimizer just measured, for the all-reduce.
        self.shard_squares: torch.Tensor | None = None
        # This step's parameters measured and their gradients' norms (on this rank), in order.
        self.params: list[torch.Tensor] = []
        self.param_norms: list[torch.Tensor] = []

    def measure(
        self,
        optimizer: torch.optim.Optimizer,
        device: torch.device,
        factor: torch.Tensor | None = None,
        ranks: int | None = None,
    ) -> None:
        """Add ``optimizer``'s gradients (times ``factor``, where they are still scaled).

        ``ranks``: the size of the group a ShardedGradScaler agrees found_inf over (None:
        no such all-reduce, every gradient counts as whole); the squares of the shards this
        rank holds, weighted by their count of shards over ``ranks``, are left in
        ``shard_squares`` for that all-reduce (zero where it holds none: every rank's
        payload has the same length) and added by :meth:`add_reduced`.
        """
        whole: list[torch.Tensor] = []
        shards: list[torch.Tensor] = []
        weights: list[float] = []
        whole_params: list[torch.Tensor] = []
        shard_params: list[torch.Tensor] = []
        for (_, _, count), (params, grads) in _bucketed(optimizer).items():
            norms = torch.stack(foreach_l2_norm(grads)).to(device, torch.float32)
            if factor is not None:  # a fused optimizer's gradients, still scaled
                norms = norms * factor
            if count > 1 and ranks is not None:
                shards.append(norms)
                weights.append(count / ranks)
                shard_params.extend(params)
            else:
                whole.append(norms)
                whole_params.extend(params)
        norms_of = [*whole, *shards]
        if not norms_of:
            norms = torch.zeros(0, dtype=torch.float32, device=device)
        else:
            norms = norms_of[0] if len(norms_of) == 1 else torch.cat(norms_of)
        self.params.extend(whole_params + shard_params)
        self.param_norms.append(norms)
        squares = _squares(whole, device)
        if ranks is not None:
            self.shard_squares = _weighted_squares(shards, weights, device).double().reshape(1)
        self._add(squares)

    def add_reduced(self, squares: torch.Tensor) -> None:
        """Add the squares of every rank's shards, as the all-reduce summed them."""
        self._add(squares.reshape(()).float())

    def _add(self, squares: torch.Tensor) -> None:
        total = squares if self._squares is None else self._squares + squares
        self._squares = total
        if self._given is None:
            self.last = total.sqrt()

    def give(self, value: torch.Tensor | float, device: torch.device) -> None:
        """This step's norm as the training loop computed it (``clip_grad_norm_``'s value)."""
        if isinstance(value, torch.Tensor):
            if hasattr(value, "full_tensor"):
                raise ValueError(
                    "record_grad_norm() takes the total norm as a plain tensor: pass "
                    "total_norm.full_tensor() for a DTensor norm"
                )
            if value.numel() != 1:
                raise ValueError(
                    f"record_grad_norm() takes one value, got a tensor of {value.numel()}"
                )
            tensor = value.detach().reshape(()).to(device, torch.float32, non_blocking=True)
        elif isinstance(value, int | float) and not isinstance(value, bool):
            tensor = torch.tensor(float(value), dtype=torch.float32, device=device)
        else:
            raise TypeError(
                f"record_grad_norm() takes a tensor or a number, got {type(value).__name__}"
            )
        self._given = tensor
        self.last = tensor

    def finish(self) -> torch.Tensor | None:
        """This step's norm (handed in, else measured; None: neither), for its record; the
        next step starts afresh (``last`` keeps this one)."""
        measured = self._squares is not None or self._given is not None
        norm = self.last if measured else None
        self._squares = self._given = self.shard_squares = None
        return norm

    def largest(self) -> tuple[torch.Tensor, list[torch.Tensor]] | None:
        """This step's ``TOP`` largest per-parameter norms, on the device: their values
        then their positions in the list of parameters returned with them (None: none
        measured); the next step starts afresh."""
        params, norms = self.params, self.param_norms
        self.params, self.param_norms = [], []
        if not norms:
            return None
        vector = norms[0] if len(norms) == 1 else torch.cat(norms)
        if not vector.numel():
            return None
        values, where = torch.topk(vector, min(TOP, vector.numel()))
        return torch.cat((values.double(), where.double())), params


TOP = 10  # per-parameter norms kept of a step


def named_norms(
    host: list[float], params: list[torch.Tensor], lookup: Callable[[torch.Tensor], object]
) -> tuple[tuple[str, float], ...]:
    """The largest norms as read (``host``: their values, then their positions in
    ``params``) as ``(name, norm)``, named as ``watch()`` named them (an FSDP1 flat
    parameter by the originals in this rank's shard), else by position and shape."""
    half = len(host) // 2
    out = []
    for value, where in zip(host[:half], host[half:], strict=True):
        param = params[int(where)]
        name = lookup(param)
        if isinstance(name, tuple):  # a flat parameter's segments: (name, offset, elements)
            name = "+".join(segment[0] for segment in name)
        elif not isinstance(name, str):
            name = f"param {int(where)} ({', '.join(map(str, param.shape))})"
        out.append((name, float(value)))
    return tuple(out)


def _bucketed(optimizer: torch.optim.Optimizer) -> Buckets:
    """``optimizer``'s parameters with a gradient and their gradients (this rank's shards),
    by device, dtype and count of shards."""
    buckets: Buckets = {}
    for group in optimizer.param_groups:
        for param in group["params"]:
            grad = param.grad
            if grad is None:
                continue
            count = shard_count(param, grad)
            if grad.is_sparse:
                local = (grad if grad.is_coalesced() else grad.coalesce())._values()
            else:
                local = local_tensor(grad)
            params, grads = buckets.setdefault((local.device, local.dtype, count), ([], []))
            params.append(param)
            grads.append(local)
    return buckets


def _squares(norms: Iterable[torch.Tensor], device: torch.device) -> torch.Tensor:
    """The sum of the squares of ``norms`` (vectors of gradient norms), a 0-d float32."""
    parts = list(norms)
    if not parts:
        return torch.zeros((), dtype=torch.float32, device=device)
    vector = parts[0] if len(parts) == 1 else torch.cat(parts)
    return vector.square().sum()


def _weighted_squares(
    norms: list[torch.Tensor], weights: list[float], device: torch.device
) -> torch.Tensor:
    """The sum of the squares of ``norms``, each vector's times its weight, a 0-d float32."""
    if all(weight == 1.0 for weight in weights):  # each shard held once: no multiply
        return _squares(norms, device)
    parts = [vector.square().sum() * weight for vector, weight in zip(norms, weights, strict=True)]
    return parts[0] if len(parts) == 1 else torch.stack(parts).sum()
