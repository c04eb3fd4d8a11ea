"""Overflow diagnosis on real gloo ranks, read back from the store.

One spawn per world size trains the model kinds (on 4 ranks all of DDP, FSDP1 with flat
parameters and with ``use_orig_params``, FSDP2, and DDP unwatched; on 2 the FSDP ones)
with named modules; inf goes into one
named parameter's local gradient on rank 1, NaN into another's on rank 0, and the last
rank's loss is made infinite at one step. Exactly those names, kinds, counts, ranks and
steps must be in the tables ``steps`` and ``overflow_params``; clean steps carry nothing.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from sqlalchemy import select
from torch import nn

import scalewatch
from scalewatch.store import open_store
from scalewatch.store.schema import overflow_params, runs, steps
from tests._helpers.nets import Net, fully_shard_net
from tests._helpers.ranks import run_ranks

INF, NAN = float("inf"), float("nan")
STEPS = 7
BAD_LOSS_STEP = 5  # the last rank's loss is infinite: every rank's grads follow it
# step -> [(rank, parameter, elements written, value)]
PLAN: dict[int, list[tuple[int, str, int, float]]] = {
    1: [(1, "encoder.weight", 3, INF)],
    3: [(0, "decoder.weight", 2, NAN), (1, "encoder.weight", 1, INF)],
}
PLAN_STEP = 2  # the record of PLAN's first step (records count updates from 1)
KINDS = ["ddp", "fsdp1", "fsdp1-orig", "fsdp2", "unwatched"]
# the names a kind's scaler reports for each parameter of Net
NAMES = {
    "ddp": {"encoder.weight": "module.encoder.weight", "decoder.weight": "module.decoder.weight"},
    "unwatched": {
        "encoder.weight": "group 0 param 0 (16, 4)",
        "decoder.weight": "group 0 param 2 (4, 16)",
    },
}


def wrap(kind: str) -> nn.Module:
    net = Net()
    if kind in ("ddp", "unwatched"):
        return nn.parallel.DistributedDataParallel(net)
    if kind == "fsdp2":
        return fully_shard_net(net)
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    orig = kind == "fsdp1-orig"
    cpu = torch.device("cpu")
    net.encoder = FSDP(net.encoder, device_id=cpu, use_orig_params=orig)  # type: ignore[assignment]
    net.decoder = FSDP(net.decoder, device_id=cpu, use_orig_params=orig)  # type: ignore[assignment]
    return FSDP(net, device_id=cpu, use_orig_params=orig)


def local_grads(model: nn.Module) -> dict[str, torch.Tensor]:
    """This rank's gradient of each original parameter of Net, flat, as views (the test's own
    reading of torch's layouts: DTensor local shards, FSDP1 flat parameters' segments)."""
    out: dict[str, torch.Tensor] = {}
    for raw, param in model.named_parameters():
        name = raw.replace("_fsdp_wrapped_module.", "").removeprefix("module.")
        grad = param.grad
        if grad is None:
            continue
        grad = getattr(grad, "_local_tensor", grad)
        if not getattr(param, "_is_flat_param", False):
            if grad.numel():
                out[name] = grad.view(-1)
            continue
        prefix = name.removesuffix("_flat_param")
        for fqn, info in zip(param._fqns, param._shard_param_infos, strict=True):  # type: ignore[attr-defined]
            if info.in_shard:
                start = info.offset_in_shard
                out[prefix + fqn] = grad.view(-1)[start : start + info.numel_in_shard]
    return out


def train(rank: int, world: int, kind: str, url: str) -> dict[str, Any]:
    model = wrap(kind)
    gs = scalewatch.ShardedGradScaler("cpu", init_scale=1024.0, telemetry=url, run_name=kind)
    if kind != "unwatched":
        gs.watch(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    losses, numels = [], {}
    for step in range(STEPS):
        opt.zero_grad()
        x = torch.randn(6, 4, generator=torch.Generator().manual_seed(10 * step + rank))
        loss = model(x).pow(2).mean()
        if step == BAD_LOSS_STEP and rank == world - 1:
            loss = loss * INF
        losses.append(loss.item())
        gs.scale(loss).backward()
        grads = local_grads(model)
        if step == BAD_LOSS_STEP:
            numels = {name: grad.numel() for name, grad in grads.items()}
        for bad_rank, name, count, value in PLAN.get(step, []):
            if rank == bad_rank:
                with torch.no_grad():
                    grads[name][:count] = value
        gs.step(opt)
        gs.update()
    gs.close()
    dist.barrier()
    return {"losses": losses, "numels": numels}


def worker(rank: int, world: int, url: str, kinds: list[str]) -> dict[str, Any]:
    return {kind: train(rank, world, kind, url) for kind in kinds}


def stored(url: str, kind: str) -> tuple[dict[int, Any], dict[int, list[tuple[Any, ...]]]]:
    """The run's steps by step, and its overflow_params rows by step."""
    with open_store(url) as store, store.read() as conn:
        run_id = conn.execute(select(runs.c.id).where(runs.c.name == kind)).scalar_one()
        rows = {r.step: r for r in conn.execute(select(steps).where(steps.c.run_id == run_id))}
        found: dict[int, list[tuple[Any, ...]]] = {}
        query = (
            select(overflow_params)
            .where(overflow_params.c.run_id == run_id)
            .order_by(overflow_params.c.step, overflow_params.c.rank, overflow_params.c.name)
        )
        for p in conn.execute(query):
            found.setdefault(p.step, []).append((p.rank, p.name, p.kind, p.count))
    return rows, found


def check(kind: str, world: int, url: str, per_rank: list[dict[str, Any]]) -> None:
    names = NAMES.get(kind, {name: name for name in ("encoder.weight", "decoder.weight")})
    rows, found = stored(url, kind)
    assert sorted(rows) == list(range(1, STEPS + 1)), kind  # record step = update count
    expected = {
        step + 1: sorted(
            (rank, names[name], "nan" if value != value else "inf", count)
            for rank, name, count, value in plan
        )
        for step, plan in PLAN.items()
    }
    for step, row in rows.items():
        assert row.loss == per_rank[0][kind]["losses"][step - 1], (kind, step)  # rank 0's
        assert row.params_omitted == 0
        if step in expected:
            assert row.overflow and row.loss_nonfinite_ranks == "", (kind, step)
            assert found.get(step) == expected[step], (kind, step)
            assert row.inf_ranks == ",".join(sorted({str(r) for r, *_ in expected[step]}))
        elif step == BAD_LOSS_STEP + 1:
            assert row.overflow and row.loss_nonfinite_ranks == str(world - 1), kind
            # the infinite loss reached every element of every rank's gradients
            got = {(rank, name): count for rank, name, _, count in found[step]}
            if kind != "unwatched":
                want = {
                    (rank, name if kind != "ddp" else f"module.{name}"): numel
                    for rank, result in enumerate(per_rank)
                    for name, numel in result[kind]["numels"].items()
                }
                assert got == want, kind
            assert {r for r, _ in got} == set(range(world))
            assert {k for _, _, k, _ in found[step]} <= {"inf", "nan", "both"}
        else:  # clean steps carry nothing
            assert not row.overflow and row.loss_nonfinite_ranks == "", (kind, step)
            assert step not in found, (kind, step)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("world", "kinds"),
    [(2, ["fsdp1", "fsdp2"]), (4, KINDS)],  # two ranks where the shards split otherwise
    ids=["world2", "world4"],
)
def test_overflows_explain_themselves_on_real_ranks(
    world: int, kinds: list[str], tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'sw.db'}"
    per_rank = run_ranks(worker, world, url, kinds, timeout=240.0)
    for kind in kinds:
        check(kind, world, url, per_rank)
    check_api(url, kinds, world)


def check_api(url: str, kinds: list[str], world: int) -> None:
    """What the store holds comes back through the REST API and the overflows exports:
    each overflow's parameters, the ranks whose loss was not finite, one overflow in full,
    and the parameters ranked."""
    from fastapi.testclient import TestClient  # here: the ranks import this module too

    from scalewatch.app.main import create_app
    from scalewatch.app.settings import Settings

    with TestClient(create_app(Settings(db=url)), base_url="http://127.0.0.1") as client:
        ids = {run["name"]: run["id"] for run in client.get("/api/runs").json()["runs"]}
        for kind in kinds:
            _, found = stored(url, kind)
            run = ids[kind]
            items = client.get(f"/api/runs/{run}/overflows").json()["items"]
            assert [item["step"] for item in items] == sorted(found), kind
            for item in items:
                params = [(p["rank"], p["name"], p["kind"], p["count"]) for p in item["params"]]
                assert params == found[item["step"]], (kind, item["step"])
                bad_loss = [world - 1] if item["step"] == BAD_LOSS_STEP + 1 else []
                assert item["loss_nonfinite_ranks"] == bad_loss, (kind, item["step"])
            detail = client.get(f"/api/runs/{run}/overflows/{PLAN_STEP}").json()
            assert detail["params"] == items[0]["params"] and detail["step"] == PLAN_STEP
            assert client.get(f"/api/runs/{run}/overflows/{PLAN_STEP + 1}").status_code == 404
            ranking = client.get(f"/api/runs/{run}/params", params={"end": PLAN_STEP + 2}).json()
            top = ranking["params"][0]  # encoder.weight: at both planned overflows, rank 1
            assert (top["overflows"], top["ranks"], top["kinds"]) == (2, [1], ["inf"]), kind
            export = f"/api/runs/{run}/export?what=overflows"
            rows = list(csv.DictReader(io.StringIO(client.get(f"{export}&format=csv").text)))
            assert [int(row["step"]) for row in rows] == sorted(found)
            assert rows[0]["params"] == ";".join(
                f"{rank}:{name}:{k}:{count}" for rank, name, k, count in found[PLAN_STEP]
            )
            lines = client.get(f"{export}&format=jsonl").text.splitlines()
            assert [json.loads(line)["params"] for line in lines] == [
                item["params"] for item in items
            ]
