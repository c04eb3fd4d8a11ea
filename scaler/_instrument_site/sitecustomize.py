"""Put on a process's path by ``scalewatch instrument``: once torch is imported, its
scaler classes are scalewatch's. Processes that never import torch pay nothing.

A ``sitecustomize`` that this one shadows on the path is still run.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from types import ModuleType

_HERE = os.path.dirname(os.path.abspath(__file__))


class _InstrumentTorch(importlib.abc.MetaPathFinder):
    """Finds torch as usual, and instruments it when its import completes."""

    def find_spec(
        self, name: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        run = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            from scalewatch.instrument import instrument

            instrument()

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


if "torch" not in sys.modules:
    sys.meta_path.insert(0, _InstrumentTorch())


def _run_shadowed() -> None:
    """Run the sitecustomize this one shadows on the path, if any (not imported by name:
    this module is ``sitecustomize`` while it runs)."""
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


_run_shadowed()
