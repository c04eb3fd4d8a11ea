"""What explaining an overflow step costs, as a ratio to the unscale pass over the same
gradients (torch's ``_amp_foreach_non_finite_check_and_unscale_``, which every step pays).

An overflow step runs the diagnosis scan once (``scalewatch._diagnosis.findings.scan``): one fused
2-norm pass over every gradient, then inf and NaN counts of the gradients that hold one.
Three cases: one gradient of ~200 poisoned (an overflow in one layer), every gradient
with an inf (an inf that reached every layer), and every gradient with inf and NaN (the
most the scan can cost: a gradient whose 2-norm is NaN has its NaNs counted too). Times
are interleaved in rounds; the figure is the median of the per-round ratios with a
bootstrap 95% interval. Goal: the one-layer case costs about one unscale pass
(``scan / unscale <= 2.0``: a read pass against torch's fused read-write kernel); the
every-layer case, which counts every element, is printed beside it.

    python bench/diagnosis.py [--device cpu|cuda] [--reps 21] [--elements 20000000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from scalewatch._diagnosis.findings import scan
from scalewatch._diagnosis.names import Names
from scalewatch._torch_compat import non_finite_check_and_unscale_

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _figures import figure, median_interval

TENSORS = 200
GOAL = 2.0  # one read pass against torch's fused read-write pass, within 2x


def grads(device: str, elements: int) -> list[torch.nn.Parameter]:
    """~``TENSORS`` parameters of mixed sizes, ``elements`` in all, with gradients."""
    torch.manual_seed(0)
    sizes = [max(1, int(elements * w)) for w in _weights()]
    params = []
    for size in sizes:
        param = torch.nn.Parameter(torch.empty(size, device=device))
        param.grad = torch.randn(size, device=device)
        params.append(param)
    return params


def _weights() -> list[float]:
    raw = [1.0 + (i % 7) for i in range(TENSORS)]
    total = sum(raw)
    return [w / total for w in raw]


def timed(fn: Callable[[], object], device: str) -> float:
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def case(
    device: str, params: list[torch.nn.Parameter], poisoned: int, reps: int, nan: bool = False
) -> None:
    grads_ = [p.grad for p in params if p.grad is not None]
    for grad in grads_[-poisoned:]:
        grad.view(-1)[:3] = float("inf")  # the last layers: nearest the loss
        if nan:
            grad.view(-1)[3] = float("nan")  # its NaNs are counted too
    optimizer = torch.optim.SGD(params, lr=0.1)
    names = Names()
    found = torch.zeros(1, device=device)
    one = torch.ones((), device=device)  # an inv_scale of 1 leaves the gradients as they are

    def unscale() -> None:
        non_finite_check_and_unscale_(grads_, found, one)

    def diagnose() -> None:
        report = scan([optimizer], names, None)
        assert len(report.params) + report.omitted == poisoned

    for _ in range(3):  # warm both (the first counts of a size allocate its memory)
        unscale()
        diagnose()
    ratios, scans, unscales = [], [], []
    for round_ in range(reps):
        pair = (unscale, diagnose) if round_ % 2 == 0 else (diagnose, unscale)
        times = {fn: timed(fn, device) for fn in pair}
        unscales.append(times[unscale])
        scans.append(times[diagnose])
        ratios.append(times[diagnose] / times[unscale])
    ratio = statistics.median(ratios)
    low, high = median_interval(ratios)
    title = "one gradient" if poisoned == 1 else f"all {poisoned} gradients"
    title += " with inf and NaN" if nan else " with inf"
    print(
        f"{title}: scan {statistics.median(scans) * 1e3:.2f} ms, unscale pass "
        f"{statistics.median(unscales) * 1e3:.2f} ms, x{ratio:.2f} [{low:.2f}, {high:.2f}]"
    )
    publish = poisoned == 1
    figure(
        f"overflow diagnosis, {title}",
        f"x{ratio:.2f} of the unscale pass",
        f"<= {GOAL}" if publish else "(info)",
        ratio <= GOAL or not publish,
        f"median of {reps} paired rounds, 95% interval [{low:.2f}, {high:.2f}]",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--reps", type=int, default=21)
    parser.add_argument("--elements", type=int, default=20_000_000)
    args = parser.parse_args()
    params = grads(args.device, args.elements)
    print(
        f"torch {torch.__version__}, device {args.device}, {torch.get_num_threads()} threads, "
        f"{len(params)} gradients, {sum(p.numel() for p in params):,} elements"
    )
    case(args.device, params, 1, args.reps)
    case(args.device, grads(args.device, args.elements), TENSORS, args.reps)
    case(args.device, grads(args.device, args.elements), TENSORS, args.reps, nan=True)


if __name__ == "__main__":
    main()
