"""Pins every torch internal that ``scalewatch._torch_compat`` reaches for."""

from __future__ import annotations

import enum
import inspect
import math

import pytest
import torch
import torch.distributed as dist

import scalewatch
from scalewatch import _torch_compat as compat
from tests._helpers.twin import make_pair


def test_non_finite_check_and_unscale_multiplies_in_place_and_flags() -> None:
    grads = [torch.tensor([2.0, -4.0]), torch.tensor([8.0])]
    found = torch.zeros(1)
    compat.non_finite_check_and_unscale_(grads, found, torch.tensor(0.5))
    assert [g.tolist() for g in grads] == [[1.0, -2.0], [4.0]]
    assert found.item() == 0.0

    for bad in (math.inf, -math.inf, math.nan):
        grads = [torch.tensor([2.0, bad]), torch.tensor([8.0])]
        compat.non_finite_check_and_unscale_(grads, found, torch.tensor(0.5))
        assert found.item() == 1.0
        assert grads[1].tolist() == [4.0]  # still unscaled: the check does not stop early
        found.zero_()


def test_non_finite_check_and_unscale_fp16_and_sets_flag_to_one_only() -> None:
    grads = [torch.tensor([math.inf, 2.0], dtype=torch.float16)]
    found = torch.zeros(1)
    compat.non_finite_check_and_unscale_(grads, found, torch.tensor(0.25))
    compat.non_finite_check_and_unscale_(grads, found, torch.tensor(0.25))
    assert found.item() == 1.0  # set, not added
    assert grads[0].dtype == torch.float16


def update(scale: float, tracker: int, found: float, interval: int = 3) -> tuple[float, int]:
    s = torch.tensor(scale)
    t = torch.tensor(tracker, dtype=torch.int32)
    compat.amp_update_scale_(s, t, torch.tensor([found]), 2.0, 0.25, interval)
    return s.item(), int(t.item())


def test_amp_update_scale_rule() -> None:
    assert update(8.0, 0, 0.0) == (8.0, 1)
    assert update(8.0, 1, 0.0) == (8.0, 2)
    assert update(8.0, 2, 0.0) == (16.0, 0)  # tracker + 1 == interval: grow
    assert update(8.0, 2, 1.0) == (2.0, 0)  # overflow: back off, reset
    # the stall the scaler avoids: grows only on equality, so a tracker past it never grows
    assert update(8.0, 5, 0.0) == (8.0, 6)


def test_amp_update_scale_never_grows_to_inf() -> None:
    big = torch.finfo(torch.float32).max / 1.5
    s = torch.tensor(big)
    t = torch.tensor(0, dtype=torch.int32)
    compat.amp_update_scale_(s, t, torch.zeros(1), 2.0, 0.5, 1)
    assert s.item() == torch.tensor(big).item()
    assert t.item() == 0


def test_opt_state_members() -> None:
    assert issubclass(compat.OptState, enum.Enum)
    assert [m.name for m in compat.OptState] == ["READY", "UNSCALED", "STEPPED"]
    assert compat.OptState is torch.amp.grad_scaler.OptState


def test_refresh_per_optimizer_state_shape() -> None:
    fresh = compat._refresh_per_optimizer_state()
    assert fresh == {"stage": compat.OptState.READY, "found_inf_per_device": {}}
    assert fresh is not compat._refresh_per_optimizer_state()


def test_our_fresh_per_optimizer_state_equals_torchs() -> None:
    ours = scalewatch.GradScaler("cpu", telemetry=False)
    theirs = torch.amp.GradScaler("cpu")
    assert ours._per_optimizer_states[7] == theirs._per_optimizer_states[7]
    sharded = scalewatch.ShardedGradScaler("cpu", telemetry=False)
    assert sharded._per_optimizer_states[7] == theirs._per_optimizer_states[7]


@pytest.mark.parametrize("overflow", [False, True], ids=["clean", "overflow"])
def test_torchs_per_optimizer_states_keep_torchs_keys_through_a_step(
    kind: str, overflow: bool
) -> None:
    """Ours (the payload of the sharded class's all-reduce, its words read on the host) is
    kept beside torch's per-optimizer dicts, never in them: what reads them finds torch's."""
    seen = []
    for gs in make_pair(kind, init_scale=4.0):
        param = torch.nn.Parameter(torch.zeros(3))
        opt = torch.optim.SGD([param], lr=0.1)
        gs.scale(torch.ones(()))
        param.grad = torch.full((3,), math.inf if overflow else 1.0)
        keys = []
        gs.unscale_(opt)
        keys.append(sorted(gs._per_optimizer_states[id(opt)]))
        gs.step(opt)
        keys.append(sorted(gs._per_optimizer_states[id(opt)]))
        seen.append(keys)
        gs.update()
        assert dict(gs._per_optimizer_states) == {}
    assert seen[1] == seen[0]
    assert seen[0][0] == ["found_inf_per_device", "stage"]


def test_replicators_serve_the_master_per_device() -> None:
    master = torch.ones(1)
    general = compat._GeneralMultiDeviceReplicator(master)
    served = general.get(torch.device("cpu"))
    assert torch.equal(served, master)
    assert general.get(torch.device("cpu")) is served  # one tensor per device, reused
    assert list(general._per_device_tensors) == [torch.device("cpu")]
    assert issubclass(compat._GeneralMultiDeviceReplicator, compat._MultiDeviceReplicator)


def test_base_classes_are_torchs() -> None:
    assert compat.TorchGradScaler is torch.amp.GradScaler
    assert issubclass(scalewatch.GradScaler, compat.TorchGradScaler)
    assert issubclass(scalewatch.ShardedGradScaler, compat.TorchShardedGradScaler)
    for name in ("_scale", "_growth_tracker", "_init_scale", "_init_growth_tracker"):
        assert name in vars(torch.amp.GradScaler("cpu"))
    for name in ("_unscale_grads_", "_check_inf_per_device", "_get_scale_async", "_maybe_opt_step"):
        assert callable(getattr(compat.TorchGradScaler, name))


def test_local_tensor_of_plain_tensor_is_itself() -> None:
    t = torch.ones(3)
    assert compat.local_tensor(t) is t


def test_process_group_info_without_group(no_group: None) -> None:
    assert compat.process_group_info(None) is None
    assert compat.process_group_info(dist.group.WORLD) is None


@pytest.mark.filterwarnings(  # torch 2.4's, at a cpu mesh
    "ignore:DTensor random operators may not have complete support:UserWarning"
)
def test_process_group_info_and_local_tensor_of_dtensor(group: None) -> None:
    try:  # public from torch 2.5
        from torch.distributed.tensor import DTensor, Shard, distribute_tensor
    except ImportError:
        from torch.distributed._tensor import DTensor, Shard, distribute_tensor
    from torch.distributed.device_mesh import init_device_mesh

    assert compat.process_group_info(None) == (0, 1)
    assert compat.process_group_info(dist.group.WORLD) == (0, 1)
    mesh = init_device_mesh("cpu", (1,))
    full = torch.arange(6.0)
    sharded = distribute_tensor(full, mesh, [Shard(0)])
    assert isinstance(sharded, DTensor)
    local = compat.local_tensor(sharded)
    assert type(local) is torch.Tensor
    assert local is sharded._local_tensor
    assert torch.equal(local, full)


def test_the_cuda_unavailable_check_and_warning_are_torchs() -> None:
    source = inspect.getsource(compat.TorchGradScaler.__init__)
    assert repr(compat.CUDA_UNAVAILABLE)[1:-1] in source  # the text torch warns with
    assert "amp_definitely_not_available()" in source  # the check torch makes
    assert compat.cuda_amp_unavailable("cuda") is not torch.cuda.is_available()
    assert compat.cuda_amp_unavailable("cpu") is False


def test_optimizer_stages_mark_a_stepped_optimizer() -> None:
    """update() reads torch's per-optimizer stage to know whether step() ran."""
    gs = torch.amp.GradScaler("cpu")
    param = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([param], lr=0.1)
    gs.scale(param.sum()).backward()
    assert gs._per_optimizer_states[id(opt)]["stage"] is compat.OptState.READY
    gs.step(opt)
    assert gs._per_optimizer_states[id(opt)]["stage"] is compat.OptState.STEPPED


def test_the_privates_we_override_or_call_have_the_pinned_signatures() -> None:
    assert compat.mismatched_signatures() == []


def test_a_changed_private_signature_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    key = (compat.TorchGradScaler, "_maybe_opt_step")
    monkeypatch.setitem(compat.PINNED, key, ("self", "optimizer"))
    assert compat.mismatched_signatures() == [
        "GradScaler._maybe_opt_step('self', 'optimizer', 'optimizer_state', 'args', 'kwargs'),"
        " expected ('self', 'optimizer')"
    ]


def test_every_torch_private_our_classes_override_is_pinned() -> None:
    pinned = {name for _, name in compat.PINNED}
    for ours, theirs in (
        (scalewatch.GradScaler, compat.TorchGradScaler),
        (scalewatch.ShardedGradScaler, compat.TorchShardedGradScaler),
    ):
        overridden = {
            name
            for klass in ours.__mro__
            if klass.__module__.startswith("scalewatch.")
            for name in vars(klass)
            if name.startswith("_") and not name.startswith("__") and hasattr(theirs, name)
        }
        assert overridden <= pinned, overridden - pinned


def test_opt_step_unless_inf_steps_only_on_a_clean_found_inf() -> None:
    param = torch.nn.Parameter(torch.ones(2))
    param.grad = torch.ones(2)
    opt = torch.optim.SGD([param], lr=0.5)
    clean = {"found_inf_per_device": {torch.device("cpu"): torch.zeros(1)}}
    assert compat.opt_step_unless_inf(opt, clean, (), {}) == (None, 0.0)
    assert param.tolist() == [0.5, 0.5]
    found = {"found_inf_per_device": {torch.device("cpu"): torch.ones(1)}}
    assert compat.opt_step_unless_inf(opt, found, (), {}) == (None, 1.0)
    assert param.tolist() == [0.5, 0.5]  # skipped


def test_the_two_norm_is_non_finite_exactly_for_inf_and_nan() -> None:
    inf, nan = math.inf, math.nan
    tensors = [torch.tensor(v) for v in ([1.0, -2.0], [inf, -inf], [nan], [inf, nan, 1.0])]
    norms = [n.item() for n in compat.foreach_l2_norm(tensors)]
    assert math.isfinite(norms[0]) and norms[1] == inf  # infs alone: inf, never NaN
    assert math.isnan(norms[2]) and math.isnan(norms[3])  # NaN exactly when one is summed
    half = compat.foreach_l2_norm([torch.tensor([65504.0, 65504.0], dtype=torch.float16)])
    assert half[0].dtype == torch.float16  # fp16 in, fp16 out: may overflow, then counted


def test_clean_parameter_name_drops_the_wrapper_prefixes() -> None:
    name = "_fsdp_wrapped_module.layers.0._checkpoint_wrapped_module.attn.weight"
    assert compat.clean_parameter_name(name) == "layers.0.attn.weight"
    assert compat.clean_parameter_name("module.encoder.bias") == "module.encoder.bias"


@pytest.mark.filterwarnings("ignore:FSDP is switching to use `NO_SHARD`:UserWarning")
def test_flat_param_parts_name_the_originals_in_this_shard(group: None) -> None:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    model = FSDP(torch.nn.Linear(3, 2), device_id=torch.device("cpu"))
    (flat,) = model.parameters()
    assert compat.flat_param_parts(flat) == [("weight", 0, 6), ("bias", 6, 2)]
    assert compat.flat_param_parts(torch.nn.Parameter(torch.ones(2))) is None


@pytest.mark.filterwarnings("ignore:FSDP is switching to use `NO_SHARD`:UserWarning")
def test_shard_count_finds_an_original_parameters_flat_parameter(group: None) -> None:
    """What ``shard_count`` relies on: FSDP1 marks the originals it hands the optimizer
    (``use_orig_params=True``) and lists them in their flat parameter's ``_params``. In a
    world of one FSDP keeps them whole (``NO_SHARD``): 1. (Sharded counts, on real ranks:
    test_grad_norm_multirank, test_grad_norm_hsdp_multirank.)"""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    model = FSDP(torch.nn.Linear(3, 2), device_id=torch.device("cpu"), use_orig_params=True)
    originals = list(model.parameters())
    assert all(getattr(p, "_fsdp_flattened", False) for p in originals)
    flat = model._flat_param
    assert [f for f in compat._flat_params() if f is flat] == [flat]  # found among all
    assert all(any(p is o for o in flat._params) for p in originals)
    model(torch.ones(1, 3)).sum().backward()
    assert [compat.shard_count(p, p.grad) for p in originals] == [1, 1]
    assert compat.shard_count(flat, torch.ones(1)) == 1
    plain = torch.nn.Parameter(torch.ones(2))
    assert compat.shard_count(plain, torch.ones(2)) == 1
