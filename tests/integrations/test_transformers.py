"""Hugging Face's Trainer trains with scalewatch's scaler, through its accelerator.

``TrainingArguments(fp16=True)`` on the CPU (transformers 5.23, accelerate 1.15) builds no
scaler and does not autocast; ``trainer.accelerator.scaler`` set before ``train()`` is used
for every step. On a GPU the Trainer's accelerator builds torch's, which
``scalewatch.instrument.instrument()`` makes ours.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import scalewatch
from tests._helpers.integrations import the_run

HOW = "pip install -c constraints.txt '.[integrations]'"
transformers = pytest.importorskip("transformers", reason=f"needs transformers: {HOW}")
pytest.importorskip("accelerate", reason=f"needs accelerate (the Trainer's): {HOW}")
from accelerate.state import AcceleratorState  # noqa: E402

pytestmark = pytest.mark.heavy  # real processes or a real trainer: make check leaves it out

STEPS = 20


@pytest.fixture(autouse=True)
def _fresh_accelerator_state() -> Iterator[None]:
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


def tiny_gpt2() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=64,
        n_positions=16,
        n_embd=16,
        n_layer=1,
        n_head=2,
        bos_token_id=0,
        eos_token_id=0,
    )
    return transformers.GPT2LMHeadModel(config)


def token_rows(count: int) -> list[dict[str, torch.Tensor]]:
    ids = torch.randint(0, 64, (count, 16), generator=torch.Generator().manual_seed(1))
    return [{"input_ids": row, "labels": row} for row in ids]


def test_hf_trainer_steps_with_the_scaler_set_on_its_accelerator(
    db_url: str, tmp_path: Path
) -> None:
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"),
        use_cpu=True,
        fp16=True,
        per_device_train_batch_size=4,
        max_steps=STEPS,
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
    )
    trainer = transformers.Trainer(
        model=tiny_gpt2(), args=args, train_dataset=token_rows(4 * STEPS)
    )
    assert trainer.accelerator.scaler is None  # none built on the CPU
    # Gradients stay fp32 here: a scale near float32's largest makes the first steps overflow.
    ours = scalewatch.GradScaler(
        "cpu", init_scale=2.0**127, telemetry=db_url, run_name="hf-trainer"
    )
    trainer.accelerator.scaler = ours
    trainer.train()
    ours.close()
    assert trainer.state.global_step == STEPS
    run = the_run(db_url)
    assert (run.name, run.status, run.steps, run.world_size) == ("hf-trainer", "finished", STEPS, 1)
    assert run.skipped == run.overflows > 0
    assert run.scale == ours.get_scale() == 2.0 ** (127 - run.overflows)  # backoffs, no growth


ON_A_GPU = """
import torch
import transformers

import scalewatch
from scalewatch.instrument import instrument

instrument()
config = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2,
                                 bos_token_id=0, eos_token_id=0)
ids = torch.randint(0, 64, (80, 16))
args = transformers.TrainingArguments(output_dir="out", fp16=True, per_device_train_batch_size=4,
                                      max_steps=20, report_to="none", save_strategy="no")
trainer = transformers.Trainer(model=transformers.GPT2LMHeadModel(config), args=args,
                               train_dataset=[{"input_ids": r, "labels": r} for r in ids])
ours = trainer.accelerator.scaler
assert isinstance(ours, scalewatch.GradScaler), type(ours)
trainer.train()
trainer.accelerator.scaler.close()
"""


@pytest.mark.cuda
def test_the_hf_trainers_scaler_on_a_gpu_is_ours_under_instrument(tmp_path: Path) -> None:
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(ON_A_GPU))
    db = f"sqlite:///{tmp_path / 'sw.db'}"
    env = {**os.environ, "SCALEWATCH_DB": db, "SCALEWATCH_RUN_NAME": "hf-gpu"}
    done = subprocess.run(
        [sys.executable, str(path)],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    run = the_run(db)
    assert (run.name, run.status, run.steps, run.world_size) == ("hf-gpu", "finished", 20, 1)
