"""The service against a store that a real training process is writing."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from scalewatch.store.engine import Store
from tests._helpers.serving import events
from tests._helpers.waiting import wait_for

pytestmark = pytest.mark.heavy  # real processes or a real trainer: make check leaves it out

POISONED = (5, 12)  # update() counts at which the trainer puts an inf into a gradient

TRAINER = """
import sys, time
from pathlib import Path
import torch
import scalewatch
url, stop, poisoned = sys.argv[1], Path(sys.argv[2]), {int(s) for s in sys.argv[3].split(",")}
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
gs = scalewatch.GradScaler("cpu", growth_interval=4, telemetry=url, run_name="real-training")
step = 0
while not stop.exists() and step < 2000:
    step += 1
    opt.zero_grad()
    gs.scale(model(torch.randn(8, 8)).pow(2).mean()).backward()
    if step in poisoned:
        model[0].weight.grad.view(-1)[0] = float("inf")
    gs.step(opt)
    gs.update()
    time.sleep(0.05)  # about 20 steps/s
gs.close()
print(step, flush=True)
"""


def test_api_and_live_stream_follow_a_real_training_run(
    server: str,
    db_url: str,
    store: Store,
    tmp_path: Path,
) -> None:
    stop = tmp_path / "stop"
    trainer = subprocess.Popen(
        [sys.executable, "-c", TRAINER, db_url, str(stop), ",".join(map(str, POISONED))],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        with httpx.Client(base_url=server, timeout=10) as http:

            def running_run() -> int | None:
                runs = http.get("/api/runs").json()["runs"]
                if runs and runs[0]["steps"] >= max(POISONED) + 3:
                    return int(runs[0]["id"])
                return None

            run = int(wait_for(running_run, 60, "the trainer's first steps"))  # type: ignore[arg-type]
            with http.stream("GET", f"/api/runs/{run}/stream") as response:
                stream = events(response)
                lags = []
                for _ in range(10):
                    event = next(stream)
                    assert event.event == "step"
                    lags.append(time.time() - json.loads(event.data)["wall_time"])
                assert max(lags) < 1.0, lags
                stop.touch()
                tail = [e for e in stream if e.event != "control"]
            assert tail[-1].event == "end" and json.loads(tail[-1].data) == {"status": "finished"}
            steps = int(trainer.communicate(timeout=60)[0])

            detail = http.get(f"/api/runs/{run}").json()
            assert (detail["status"], detail["steps"], detail["overflows"]) == (
                "finished",
                steps,
                len(POISONED),
            )
            overflows = http.get(f"/api/runs/{run}/overflows", params={"after": 0}).json()
            assert [(o["step"], o["inf_ranks"]) for o in overflows["items"]] == [
                (s, [0]) for s in POISONED
            ]
            series = http.get(f"/api/runs/{run}/steps", params={"max_points": 10}).json()
            assert sum(series["series"]["n"]) == steps
            assert sum(series["series"]["overflows"]) == len(POISONED)
            exported = http.get(
                f"/api/runs/{run}/export", params={"what": "steps", "format": "csv"}
            ).text
            rows = list(csv.DictReader(io.StringIO(exported)))
            assert [int(r["step"]) for r in rows] == list(range(1, steps + 1))
            assert [int(r["step"]) for r in rows if r["overflow"] == "1"] == list(POISONED)
            assert f'run_id="{run}"' in http.get("/metrics").text
    finally:
        if trainer.poll() is None:
            trainer.kill()
            trainer.communicate(timeout=10)
