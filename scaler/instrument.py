"""scalewatch's scalers in place of torch's, for a script that builds torch's own.

``instrument()`` does it in this process: every later ``torch.amp.GradScaler(...)``,
``torch.GradScaler``, ``torch.cuda.amp.GradScaler``, ``torch.cpu.amp.GradScaler`` and FSDP's
``ShardedGradScaler`` is scalewatch's (a name bound before the call, as by ``from torch.amp
import GradScaler``, keeps torch's class). ``scalewatch instrument -- COMMAND`` does it in
every Python process that COMMAND starts (each rank of ``torchrun``), through a
``sitecustomize`` on their path that instruments torch once it is imported: nothing is
written into the user's environment. The run's name and store come from
``$SCALEWATCH_RUN_NAME`` and ``$SCALEWATCH_DB``.

This module imports torch only when ``instrument()`` runs.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

# (module, attribute) that name torch's scaler classes, and which of ours stands in.
TARGETS: tuple[tuple[str, str, str], ...] = (
    ("torch", "GradScaler", "GradScaler"),
    ("torch.amp", "GradScaler", "GradScaler"),
    ("torch.amp.grad_scaler", "GradScaler", "GradScaler"),
    ("torch.cuda.amp", "GradScaler", "CudaGradScaler"),
    ("torch.cuda.amp.grad_scaler", "GradScaler", "CudaGradScaler"),
    ("torch.cpu.amp", "GradScaler", "CpuGradScaler"),
    ("torch.cpu.amp.grad_scaler", "GradScaler", "CpuGradScaler"),
    ("torch.distributed.fsdp.sharded_grad_scaler", "ShardedGradScaler", "ShardedGradScaler"),
)

_ORIGINALS: dict[tuple[str, str], Any] = {}


def instrument() -> None:
    """Stand scalewatch's classes in for torch's (see the module's docstring). Idempotent."""
    from . import _deprecated_names
    from .grad_scaler import GradScaler
    from .sharded import ShardedGradScaler

    ours = {
        "GradScaler": GradScaler,
        "ShardedGradScaler": ShardedGradScaler,
        "CudaGradScaler": _deprecated_names.CudaGradScaler,
        "CpuGradScaler": _deprecated_names.CpuGradScaler,
    }
    for module_name, attribute, replacement in TARGETS:
        module = importlib.import_module(module_name)
        _ORIGINALS.setdefault((module_name, attribute), getattr(module, attribute))
        setattr(module, attribute, ours[replacement])


def uninstrument() -> None:
    """Put torch's classes back."""
    for (module_name, attribute), original in _ORIGINALS.items():
        setattr(importlib.import_module(module_name), attribute, original)
    _ORIGINALS.clear()


def site_dir() -> Path:
    """The folder whose ``sitecustomize`` instruments a process that imports torch."""
    return Path(__file__).resolve().parent / "_instrument_site"
