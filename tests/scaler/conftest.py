from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch.distributed as dist

from tests._helpers.twin import world1


@pytest.fixture(params=["plain", "sharded"])
def kind(request: pytest.FixtureRequest) -> Iterator[str]:
    """Both classes; the sharded pair runs in a world-1 gloo group (torch's needs one)."""
    if request.param == "plain":
        yield "plain"
        return
    with world1():
        yield "sharded"


@pytest.fixture
def group() -> Iterator[None]:
    """A world-1 gloo group for this test only.

    Function scope, not module scope: tests of the sharded class without any
    process group share these modules, and a lingering group would change them.
    """
    with world1():
        yield


@pytest.fixture
def no_group() -> None:
    assert not dist.is_initialized()


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def device(request: pytest.FixtureRequest) -> str:
    """Where the scalers, models and batches live: cpu, and cuda where a GPU is present."""
    param: str = request.param
    return param
