"""No code change: scalewatch's scalers where a script builds torch's (scalewatch.instrument)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import scalewatch
from scalewatch import _deprecated_names
from scalewatch.instrument import instrument, site_dir, uninstrument
from scalewatch.store import open_store
from scalewatch.store.queries import list_runs
from tests._helpers import integrations
from tests._helpers.net import free_port


@pytest.fixture
def instrumented() -> Iterator[None]:
    with integrations.instrumented():
        yield


def test_every_name_of_torchs_scalers_builds_ours(instrumented: None) -> None:
    from torch.distributed.fsdp import sharded_grad_scaler

    assert torch.amp.GradScaler is torch.GradScaler is scalewatch.GradScaler
    assert torch.amp.grad_scaler.GradScaler is scalewatch.GradScaler
    assert torch.cuda.amp.GradScaler is _deprecated_names.CudaGradScaler
    assert torch.cpu.amp.GradScaler is _deprecated_names.CpuGradScaler
    assert sharded_grad_scaler.ShardedGradScaler is scalewatch.ShardedGradScaler
    gs = torch.amp.GradScaler("cpu", telemetry=False)
    assert isinstance(gs, scalewatch.GradScaler)


def test_undone_torchs_classes_are_back() -> None:
    original = torch.amp.GradScaler
    instrument()
    instrument()  # twice: still torch's underneath
    uninstrument()
    assert torch.amp.GradScaler is original
    assert torch.cpu.amp.GradScaler.__module__ == "torch.cpu.amp.grad_scaler"


def test_the_deprecated_deprecated_names_warn_as_torchs_do() -> None:
    original = torch.cpu.amp.GradScaler
    with warnings.catch_warnings(record=True) as theirs:
        warnings.simplefilter("always")
        original(init_scale=8.0)
    instrument()
    try:
        with warnings.catch_warnings(record=True) as ours:
            warnings.simplefilter("always")
            gs = torch.cpu.amp.GradScaler(init_scale=8.0)
    finally:
        uninstrument()
    gs.close()
    assert isinstance(gs, scalewatch.GradScaler) and gs.get_scale() == 8.0
    [want] = [w for w in theirs if w.category is FutureWarning]
    [got] = [w for w in ours if w.category is FutureWarning]
    assert str(got.message) == str(want.message)
    assert got.filename == want.filename == __file__  # the caller's line, as torch's


SCRIPT = """
import torch
gs = torch.amp.GradScaler("cpu")
print(type(gs).__module__)
p = torch.nn.Parameter(torch.ones(3))
opt = torch.optim.SGD([p], lr=0.1)
for _ in range(5):
    opt.zero_grad()
    gs.scale(p.sum()).backward()
    gs.step(opt)
    gs.update()
"""

SHARDED = """
import os
import torch
import torch.distributed as dist
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

dist.init_process_group("gloo")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
gs = ShardedGradScaler("cpu")
os.write(1, f"{type(gs).__module__}:{dist.get_rank()} ".encode())  # one write: ranks share it
for step in range(5):
    opt.zero_grad()
    gs.scale(model(torch.ones(2, 4)).sum()).backward()
    gs.step(opt)
    gs.update()
gs.close()
del model
dist.destroy_process_group()
"""


SPIKY = """
import torch
torch.manual_seed(0)
gs = torch.amp.GradScaler("cpu", init_scale=1024.0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.001)
skipped = []
for step in range(30):
    opt.zero_grad()
    target = 100.0 if step == 26 else 1.0  # a batch far off: its gradient norm spikes
    gs.scale(model(torch.randn(8, 4)).sub(target).pow(2).mean()).backward()
    gs.step(opt)
    gs.update()
    if gs.last_step_skipped:
        skipped.append(step)
print(*skipped)
"""


def _instrument(
    tmp_path: Path, script: str, *launcher: str, options: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(script))
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    command = [
        sys.executable,
        "-m",
        "scalewatch.app",
        "instrument",
        "--db",
        f"sqlite:///{tmp_path / 'sw.db'}",
    ]
    return subprocess.run(
        [*command, "--run-name", "unedited", *options, "--", *launcher, str(path)],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
        cwd=tmp_path,
    )


@pytest.mark.heavy
def test_a_script_that_builds_torchs_scaler_records_a_run(tmp_path: Path) -> None:
    done = _instrument(tmp_path, SCRIPT, sys.executable)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["scalewatch.grad_scaler"]
    assert "Error in sitecustomize" not in done.stderr
    with open_store(f"sqlite:///{tmp_path / 'sw.db'}") as store:
        [run] = list_runs(store)
    assert (run.name, run.status, run.steps, run.world_size) == ("unedited", "finished", 5, 1)
    assert run.grad_norm == pytest.approx(3**0.5)  # measured: instrument turns it on


@pytest.mark.heavy
def test_skip_on_spike_reaches_the_scaler_an_unedited_script_builds(tmp_path: Path) -> None:
    done = _instrument(
        tmp_path, SPIKY, sys.executable, options=("--skip-on-spike", "grad_norm_z=20")
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["26"]  # the spike's step, and no other
    refused = _instrument(tmp_path, SPIKY, sys.executable, options=("--skip-on-spike", "z=-1"))
    assert refused.returncode == 2
    assert refused.stderr.splitlines() == [
        "scalewatch instrument: --skip-on-spike takes grad_norm_z=Z and/or loss_z=Z (each a"
        " number above 0, comma-separated), not 'z=-1'"
    ]


@pytest.mark.slow
def test_every_rank_that_torchrun_starts_is_instrumented(tmp_path: Path) -> None:
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1"]
    torchrun += ["--nproc-per-node", "2", "--master-addr", "127.0.0.1"]
    torchrun += ["--master-port", str(free_port())]
    done = _instrument(tmp_path, SHARDED, *torchrun)
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.split()) == ["scalewatch.sharded:0", "scalewatch.sharded:1"], (
        done.stdout
    )
    with open_store(f"sqlite:///{tmp_path / 'sw.db'}") as store:
        [run] = list_runs(store)  # rank 0 reports
    assert (run.name, run.status, run.steps, run.world_size) == ("unedited", "finished", 5, 2)


@pytest.mark.heavy
def test_instrument_without_a_command_says_how(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "scalewatch.app", "instrument"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("scalewatch instrument: give the command to run after --")


def test_the_site_folder_holds_only_the_hook() -> None:
    assert sorted(p.name for p in site_dir().glob("*.py")) == ["sitecustomize.py"]
