"""Names of the parameters an overflow is reported for.

``watch(model)`` registers ``model.named_parameters()``, less FSDP's wrapper prefixes
(``_fsdp_wrapped_module.``), so that a wrapped model's names are its module's own. An
FSDP1 flat parameter (``use_orig_params=False``) names the original parameters it holds,
each with the part of this rank's shard it occupies. A parameter nobody registered is
named by its place in the optimizer and its shape:

>>> positional(0, 17, (4096, 4096))
'group 0 param 17 (4096, 4096)'
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import torch

from .._torch_compat import clean_parameter_name, flat_param_parts

# A flat parameter's originals in this rank's shard: (name, offset in shard, elements).
Segment = tuple[str, int, int]


def positional(group: int, index: int, shape: Sequence[int]) -> str:
    """The name of an unregistered parameter: optimizer group, index in it, shape."""
    return f"group {group} param {index} ({', '.join(map(str, shape))})"


class Names:
    """Registered parameters, held weakly: registering keeps no model alive."""

    def __init__(self) -> None:
        self._by_id: dict[int, tuple[weakref.ref[torch.Tensor], str | tuple[Segment, ...]]] = {}

    def __len__(self) -> int:
        return len(self._by_id)

    def watch(self, model: Any) -> int:
        """Register ``model``'s parameters; returns how many names it gave."""
        named = getattr(model, "named_parameters", None)
        if named is None:
            raise TypeError(f"watch() takes a torch.nn.Module, not {type(model).__name__}")
        given = 0
        for raw, param in named():
            name = clean_parameter_name(raw)
            parts = flat_param_parts(param)
            if parts is None:
                naming: str | tuple[Segment, ...] = name
                given += 1
            else:
                prefix = name.rpartition(".")[0]
                naming = tuple(
                    (f"{prefix}.{fqn}" if prefix else fqn, offset, numel)
                    for fqn, offset, numel in parts
                )
                given += len(naming)
            self._by_id[id(param)] = (weakref.ref(param), naming)
        return given

    def lookup(self, param: torch.Tensor) -> str | tuple[Segment, ...] | None:
        """``param``'s registered name, or its segments for a flat parameter; None if none."""
        entry = self._by_id.get(id(param))
        if entry is None or entry[0]() is not param:  # an id reused by another tensor
            return None
        return entry[1]
