"""``scalewatch demo``: a real 2-rank fp16 FSDP2 training served live, stopped by Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from scaler.store.engine import open_store
from scaler.store.queries import list_runs
from tests._net import free_port

pytestmark = pytest.mark.slow


def _get_json(url: str) -> object:
    with urllib.request.urlopen(url, timeout=5) as response:
        assert response.status == 200
        return json.loads(response.read())


def test_demo_trains_serves_and_stops_cleanly(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'demo.db'}"
    port = free_port()
    env = {**os.environ, "SCALEWATCH_TOKEN": "demo-test-token", "HOME": str(tmp_path)}
    demo = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "app",
            "demo",
            "--steps",
            "60",
            "--world-size",
            "2",
            "--db",
            db,
            "--port",
            str(port),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 240
        runs: list[dict[str, object]] = []
        while time.monotonic() < deadline and demo.poll() is None:
            try:
                body = _get_json(f"http://127.0.0.1:{port}/api/runs")
            except OSError:
                body = {"runs": []}
            assert isinstance(body, dict)
            runs = body["runs"]
            if runs and runs[0]["status"] == "finished":
                break
            time.sleep(0.5)
        assert demo.poll() is None, demo.communicate()[0]
        assert runs and runs[0]["status"] == "finished", runs
        assert runs[0]["world_size"] == 2
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as page:
            assert page.status == 200
        with open_store(db) as store:
            (info,) = list_runs(store)
            with store.read() as conn:
                rows = conn.exec_driver_sql(
                    "SELECT step, overflow, scale, scale_after FROM steps ORDER BY step"
                ).all()
        assert [r[0] for r in rows] == list(range(1, 61)), "one row per step"
        assert info.steps == 60
        assert any(r[1] for r in rows), "the high initial scale overflows"
        assert any(r[3] > r[2] for r in rows), "the scale grows at least once"
    finally:
        if demo.poll() is None:
            demo.send_signal(signal.SIGINT)
        output = demo.communicate(timeout=60)[0]
    assert demo.returncode == 0, output
    assert f"http://127.0.0.1:{port}/" in output
