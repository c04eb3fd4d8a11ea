"""The README's Python examples run as written and record their runs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from scaler.store.engine import open_store
from scaler.store.queries import list_runs
from tests._net import free_port

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)
EXPECTED = {  # run name -> (steps, world size)
    "quickstart": (50, 1),
    "ddp-example": (30, 2),
    "fsdp2-example": (30, 2),
    "fsdp1-example": (30, 2),
}


def test_the_readme_has_the_four_examples() -> None:
    names = [re.search(r'run_name="([^"]+)"', block) for block in BLOCKS]
    assert [m.group(1) for m in names if m] == list(EXPECTED)


@pytest.mark.slow
@pytest.mark.parametrize("block", BLOCKS, ids=list(EXPECTED))
def test_readme_example_runs_and_records(block: str, tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(block, encoding="utf-8")
    db = f"sqlite:///{tmp_path / 'readme.db'}"
    env = {**os.environ, "SCALEWATCH_DB": db, "MASTER_PORT": str(free_port())}
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    with open_store(db) as store:
        (run,) = list_runs(store)
    steps, world_size = EXPECTED[run.name]
    assert (run.status, run.steps, run.world_size) == ("finished", steps, world_size)
