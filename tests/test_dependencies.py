"""What the distribution's dependencies must give every process that imports torch."""

from __future__ import annotations

import subprocess
import sys


def test_torch_imports_without_a_warning() -> None:
    """Without numpy, torch warned "Failed to initialize NumPy" in every script and every
    demo rank; numpy is a dependency, so that no filter has to hide it."""
    done = subprocess.run(
        [
            sys.executable,
            "-W",
            "error",
            "-c",
            "import torch; import scaler; torch.zeros(1).numpy()",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
