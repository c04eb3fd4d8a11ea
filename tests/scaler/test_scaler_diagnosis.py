"""Overflow diagnosis in one process: names, kinds, counts, the loss, the limit, the paths.

Each scaler here keeps the records the recorder hands to telemetry (``Recorded``); the
store's side is in ``test_scaler_diagnosis_store.py``, real ranks in
``test_scaler_diagnosis_multirank.py``.
"""

from __future__ import annotations

import pickle
from collections import OrderedDict
from typing import Any

import pytest
import torch
from torch import nn

import scalewatch
from scalewatch._diagnosis import gather as _gather
from scalewatch._diagnosis.findings import LIMIT, Report
from scalewatch.store.records import ParamFinding, StepRecord
from tests._helpers.diagnosis import INF, NAN, PLAN, Net, run
from tests._helpers.twin import world1
from tests.scaler._kept_samples import keep_samples


class _Recorded:
    """A scaler keeping the records its recorder hands to telemetry (testing only)."""

    def _reset_transient(self) -> None:
        super()._reset_transient()  # type: ignore[misc]
        self.samples = keep_samples(self)

    @property
    def records(self) -> list[StepRecord]:
        return [sample.record for sample in self.samples]


class RecordedPlain(_Recorded, scalewatch.GradScaler):
    pass


class RecordedSharded(_Recorded, scalewatch.ShardedGradScaler):
    pass


def recorded(kind: str, device: str = "cpu") -> Any:
    cls = RecordedPlain if kind == "plain" else RecordedSharded
    return cls(device, init_scale=256.0, growth_interval=3)


def test_unwatched_parameters_are_named_by_optimizer_position_and_shape(kind: str) -> None:
    gs = recorded(kind)
    run(gs, Net(), PLAN)
    params = {r.step: r.params for r in gs.records}
    assert params[2] == (
        ParamFinding(0, "group 0 param 1 (8)", "nan", 1),
        ParamFinding(0, "group 0 param 2 (2, 8)", "inf", 3),
    )
    assert params[4] == (ParamFinding(0, "group 0 param 0 (8, 4)", "nan", 2),)
    gs.close()


def test_watched_names_kinds_counts_and_clean_steps_carry_nothing(kind: str) -> None:
    gs = recorded(kind)
    model = Net()
    assert gs.watch(model) == 4
    losses = run(gs, model, {**PLAN, 2: [("decoder.bias", 2, NAN), ("decoder.bias", 1, INF)]})
    by_step = {r.step: r for r in gs.records}
    assert by_step[2].params == (
        ParamFinding(0, "encoder.bias", "nan", 1),
        ParamFinding(0, "decoder.weight", "inf", 3),
    )
    # the inf overwrote the first of the two NaNs: one of each
    assert by_step[3].params == (ParamFinding(0, "decoder.bias", "both", 2),)
    assert by_step[4].params == (ParamFinding(0, "encoder.weight", "nan", 2),)
    for step in (1, 5):
        clean = by_step[step]
        assert not clean.overflow
        assert (clean.params, clean.params_omitted, clean.loss_nonfinite_ranks) == ((), 0, ())
    assert [r.loss for r in gs.records] == losses  # every step, exactly (float32 in float64)
    assert all(r.loss_nonfinite_ranks == () for r in gs.records)
    gs.close()


def test_a_non_finite_loss_names_its_rank(kind: str) -> None:
    gs = recorded(kind)
    model = Net()
    gs.watch(model)
    run(gs, model, {}, bad_loss=(2,))
    by_step = {r.step: r for r in gs.records}
    assert by_step[3].overflow and by_step[3].loss == INF
    assert by_step[3].loss_nonfinite_ranks == (0,)
    assert {p.name for p in by_step[3].params} == {n for n, _ in model.named_parameters()}
    assert by_step[2].loss_nonfinite_ranks == () and by_step[2].params == ()
    gs.close()


def test_at_most_32_parameters_a_rank_the_rest_counted() -> None:
    gs = recorded("plain")
    model = nn.Sequential(*[nn.Linear(4, 4) for _ in range(20)])  # 40 parameters
    gs.watch(model)
    plan = {1: [(name, 1, INF) for name, _ in model.named_parameters()]}
    run(gs, model, plan, steps=2)
    record = gs.records[1]
    assert len(record.params) == LIMIT
    assert [p.name for p in record.params] == [n for n, _ in model.named_parameters()][:LIMIT]
    assert record.params_omitted == 40 - LIMIT
    gs.close()


def test_gradient_accumulation_records_the_sum_of_the_losses() -> None:
    gs = recorded("plain")
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    halves = []
    for part in range(2):
        x = torch.randn(3, 4, generator=torch.Generator().manual_seed(part))
        loss = model(x).pow(2).mean() / 2
        halves.append(loss)
        gs.scale(loss).backward()
    gs.step(opt)
    gs.update()
    assert gs.flush()
    assert gs.records[0].loss == (halves[0] + halves[1]).item()
    gs.close()


def test_the_fused_optimizer_path_on_cpu_is_explained_too(kind: str) -> None:
    """On cpu the step's values are memory, read at once: a fused optimizer's overflow is
    known on the host and explained as any other (its grads are not unscaled: same names)."""
    gs = recorded(kind)
    model = Net()
    gs.watch(model)
    opt = torch.optim.Adam(model.parameters(), lr=0.01, fused=True)
    run(gs, model, PLAN, opt=opt)
    assert gs.records[1].params == (
        ParamFinding(0, "encoder.bias", "nan", 1),
        ParamFinding(0, "decoder.weight", "inf", 3),
    )
    gs.close()


@pytest.mark.cuda
def test_the_fused_optimizer_path_on_cuda_records_the_overflow_but_not_its_parameters() -> None:
    """torch's fused path never reads found_inf on the host; reading it to explain the step
    would be a sync on every step. So the overflow, its ranks and the loss are recorded,
    the parameters are not."""
    gs = recorded("plain", "cuda")
    model = Net().cuda()
    gs.watch(model)
    opt = torch.optim.Adam(model.parameters(), lr=0.01, fused=True)
    losses = run(gs, model, PLAN, opt=opt, device="cuda", bad_loss=(3,))
    by_step = {r.step: r for r in gs.records}
    assert by_step[2].overflow and by_step[2].params == ()
    assert by_step[4].loss == INF and by_step[4].loss_nonfinite_ranks == ()
    assert [r.loss for r in gs.records] == pytest.approx(losses)
    gs.close()


@pytest.mark.cuda
def test_the_plain_path_on_cuda_is_explained() -> None:
    gs = recorded("plain", "cuda")
    model = Net().cuda()
    gs.watch(model)
    losses = run(gs, model, PLAN, device="cuda")
    assert gs.records[1].params == (
        ParamFinding(0, "encoder.bias", "nan", 1),
        ParamFinding(0, "decoder.weight", "inf", 3),
    )
    assert [r.loss for r in gs.records] == losses
    gs.close()


def test_sparse_gradients_are_checked_in_their_values() -> None:
    gs = recorded("plain")
    model = nn.Embedding(10, 3, sparse=True)
    gs.watch(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(2):
        opt.zero_grad()
        gs.scale(model(torch.tensor([1, 4])).sum()).backward()
        if step == 1:
            grad = model.weight.grad
            assert grad is not None and grad.is_sparse
            with torch.no_grad():
                grad._values().view(-1)[:2] = INF
        gs.step(opt)
        gs.update()
    assert gs.flush()
    assert gs.records[1].params == (ParamFinding(0, "weight", "inf", 2),)
    gs.close()


@pytest.mark.filterwarnings("ignore:FSDP is switching to use `NO_SHARD`:UserWarning")
def test_an_fsdp1_flat_parameter_names_its_original_parameters() -> None:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    with world1():
        inner = Net()
        inner.decoder = FSDP(inner.decoder, device_id=torch.device("cpu"))  # type: ignore[assignment]
        model = FSDP(inner, device_id=torch.device("cpu"))
        gs = recorded("sharded")
        assert gs.watch(model) == 4
        flat = {n: p for n, p in model.named_parameters()}
        decoder = flat["_fsdp_wrapped_module.decoder._fsdp_wrapped_module._flat_param"]
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for step in range(2):
            opt.zero_grad()
            gs.scale(model(torch.randn(3, 4)).pow(2).mean()).backward()
            if step == 1:
                assert decoder.grad is not None
                with torch.no_grad():  # decoder.weight (16), then decoder.bias (2)
                    decoder.grad[14:17] = INF
            gs.step(opt)
            gs.update()
        assert gs.flush()
        assert gs.records[1].params == (
            ParamFinding(0, "decoder.weight", "inf", 2),
            ParamFinding(0, "decoder.bias", "inf", 1),
        )
        gs.close()


def test_a_pickled_scaler_trains_on_and_forgets_the_names(kind: str) -> None:
    gs = recorded(kind)
    model = Net()
    gs.watch(model)
    run(gs, model, {}, steps=1)
    copy = pickle.loads(pickle.dumps(gs))
    run(copy, model, PLAN, steps=2)
    assert copy.records[1].params[0].name == "group 0 param 1 (8)"
    gs.close()
    copy.close()


def test_watch_refuses_what_is_not_a_module() -> None:
    with pytest.raises(TypeError, match=r"watch\(\) takes a torch.nn.Module"):
        scalewatch.GradScaler("cpu", telemetry=False).watch(object())  # type: ignore[arg-type]


def test_the_gather_encoding_is_fixed_size_and_cuts_long_names() -> None:
    long = "é" * 400  # 800 bytes of UTF-8: cut at a character, within 500 bytes
    params = [(f"p{i}", "both", i) for i in range(LIMIT - 1)]
    report = Report(3, (*params, (long, "nan", 7)))
    data = _gather.encode(report)
    assert len(data) == _gather.SLOT == len(_gather.encode(Report(0)))
    back = _gather.decode(data, 3)
    assert back.params[:-1] == report.params[:-1]
    assert back.params[-1] == ("é" * 250, "nan", 7)
    assert _gather.decode(_gather.encode(Report(1, (), 12, True)), 1) == Report(1, (), 12, True)


def test_a_scan_that_fails_is_logged_and_training_goes_on(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from scalewatch import _diagnosis

    def broken(*args: Any) -> Any:
        raise RuntimeError("no")

    monkeypatch.setattr(_diagnosis, "scan", broken)
    gs = recorded("plain")
    run(gs, Net(), PLAN, steps=3)
    assert [r.overflow for r in gs.records] == [False, True, False]
    assert gs.records[1].params == ()
    assert "could not explain this overflow on rank 0" in caplog.text
    gs.close()


def test_a_long_name_is_cut_as_the_store_keeps_it() -> None:
    class Deep(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            module: nn.Module = nn.Linear(4, 2)
            for _ in range(60):
                module = nn.Sequential(OrderedDict(a_rather_long_module_name=module))
            self.body = module

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.body(x)  # type: ignore[no-any-return]

    gs = recorded("plain")
    model = Deep()
    gs.watch(model)
    name = next(n for n, _ in model.named_parameters())
    assert len(name) > 500
    run(gs, model, {1: [(name, 1, INF)]}, steps=2)
    assert gs.records[1].params == (ParamFinding(0, name[:500], "inf", 1),)
    gs.close()
