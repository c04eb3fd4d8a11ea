"""Screenshots of both dashboard pages, from a real service over real training runs.

    .venv/bin/python -m tests.web.take_screenshots [--out docs/screenshots] [--steps 450]

Trains ``scalewatch.examples.tiny_lm`` (an fp16 transformer, FSDP2 on 2 gloo ranks, with
``ShardedGradScaler`` telemetry) while ``scalewatch serve`` serves its store, next to two
small runs of ``tests/_helpers/trainer.py``: one trained to the end and one killed mid-run (it reads
as crashed once its heartbeat is stale). Past two thirds of the language model's
steps, a growth_interval change is submitted on the run page with the token and
applied by the training ranks; then ``run.png`` (the run page), ``overflow.png`` (its
latest overflow's detail, clicked on the chart), ``runs.png`` (the
runs page) and ``compare.png`` (the three runs compared on the runs page) are written
with headless Chromium while the model is still training.
Takes a few minutes on a CPU.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import IO

from playwright.sync_api import sync_playwright

from scalewatch.store import queries
from scalewatch.store.engine import Store, open_store
from tests._helpers.harness import (
    CHROMIUM,
    CHROMIUM_ARGS,
    TOKEN,
    read_run_id,
    start_service,
    start_trainer,
    stop_process,
    wait_for_exit,
    wait_for_steps,
)
from tests._helpers.pages import POINTS, click_overflow

ROOT = Path(__file__).resolve().parents[2]
LM_NAME = "tiny-lm fp16 fsdp2 (2 ranks)"
STEP_TIMEOUT_S = 600.0


def start_tiny_lm(db_url: str, steps: int, log: IO[bytes]) -> subprocess.Popen[bytes]:
    """The example trainer in its own process group, so that Ctrl-C reaches every rank."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "scalewatch.examples.tiny_lm",
            "--steps",
            str(steps),
            "--world-size",
            "2",
            "--growth-interval",
            "20",
            "--db",
            db_url,
            "--run-name",
            LM_NAME,
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=log,
        start_new_session=True,
    )


def interrupt_group(process: subprocess.Popen[bytes]) -> None:
    """Ctrl-C every rank (each closes its scaler), then kill what is left."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGINT)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


def run_named(store: Store, name: str, deadline: float) -> int:
    while time.monotonic() < deadline:
        for run in queries.list_runs(store):
            if run.name == name:
                return int(run.id)
        time.sleep(0.2)
    raise RuntimeError(f"no run named {name!r} appeared")


def wait_for_status(store: Store, run_id: int, status: str, deadline: float) -> None:
    while queries.run_status(store, run_id) != status:
        if time.monotonic() > deadline:
            raise RuntimeError(f"run {run_id} is not {status}")
        time.sleep(0.5)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots")
    parser.add_argument("--steps", type=int, default=450, help="steps of the language model")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        tmp_dir = Path(tmp)
        db_url = f"sqlite:///{tmp_dir / 'scalewatch.db'}"
        store = stack.enter_context(open_store(db_url))
        deadline = time.monotonic() + STEP_TIMEOUT_S

        # Two small runs first, one of them killed, so the list shows every status.
        logs = [stack.enter_context((tmp_dir / f"mlp-{i}.log").open("wb")) for i in range(2)]
        finished = start_trainer(
            db_url, "mlp fp16 (finished)", "--steps", "300", "--rate", "0", stderr=logs[0]
        )
        stack.callback(stop_process, finished)
        crashing = start_trainer(
            db_url,
            "mlp fp16 (killed)",
            "--world-size",
            "1",
            "--crash-at",
            "240",
            "--rate",
            "0",
            stderr=logs[1],
        )
        stack.callback(stop_process, crashing)
        crashed_id = read_run_id(crashing, deadline)
        finished_id = read_run_id(finished, deadline)
        wait_for_exit(finished, deadline)
        crashing.wait(timeout=max(0.0, deadline - time.monotonic()))

        lm_log = stack.enter_context((tmp_dir / "tiny_lm.log").open("wb"))
        lm = start_tiny_lm(db_url, args.steps, lm_log)
        stack.callback(interrupt_group, lm)
        base_url = start_service(stack, db_url, tmp_dir)
        run_id = run_named(store, LM_NAME, deadline)
        wait_for_steps(store, run_id, args.steps * 2 // 3, deadline)

        playwright = stack.enter_context(sync_playwright())
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        stack.callback(browser.close)
        # bypass_csp: Playwright's waits evaluate strings, which the pages' policy refuses.
        context = browser.new_context(
            base_url=base_url, viewport={"width": 1280, "height": 800}, bypass_csp=True
        )
        page = context.new_page()
        page.set_default_timeout(30_000)

        page.goto(f"/run.html?run={run_id}")
        page.wait_for_function(f"{POINTS} > 0")
        page.fill("#token", TOKEN)
        page.fill("#f-growth_interval", "40")
        page.click("#control-submit")
        page.locator("#history tbody tr[data-status=applied]").wait_for()
        page.wait_for_function("document.getElementById('chart').dataset.markers === '1'")
        before = page.evaluate(POINTS)
        page.wait_for_function(f"{POINTS} > {before + 60}", timeout=60_000)
        page.mouse.move(0, 0)
        page.screenshot(path=args.out / "run.png", full_page=True)

        overflows = page.evaluate("document.getElementById('chart').data[3].x")
        if overflows:  # the language model's latest overflow, its parameters and its loss
            detail = click_overflow(page, overflows[-1])
            detail.scroll_into_view_if_needed()
            page.mouse.move(0, 0)
            detail.screenshot(path=args.out / "overflow.png")
        else:
            print("no overflow in the language model's run yet: overflow.png not taken")

        wait_for_status(store, crashed_id, "crashed", deadline)
        page.set_viewport_size({"width": 1280, "height": 420})
        page.goto("/")
        page.locator("#runs tbody tr").nth(2).wait_for()
        page.locator(
            f'#runs tbody tr[data-run-id="{crashed_id}"] .badge', has_text="crashed"
        ).wait_for()
        page.screenshot(path=args.out / "runs.png", full_page=True)

        page.set_viewport_size({"width": 1280, "height": 800})
        page.goto(f"/?compare={run_id},{finished_id},{crashed_id}")
        page.locator(f"#compare-chart[data-runs='{run_id},{finished_id},{crashed_id}']").wait_for(
            state="attached"
        )
        page.locator("#compare").scroll_into_view_if_needed()
        page.mouse.move(0, 0)
        page.locator("#compare").screenshot(path=args.out / "compare.png")

        wait_for_exit_or_stop(lm)
    print(f"wrote the screenshots in {args.out}")
    return 0


def wait_for_exit_or_stop(process: subprocess.Popen[bytes]) -> None:
    """Let the language model finish its steps (it closes its run as finished)."""
    try:
        process.wait(timeout=STEP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        interrupt_group(process)


if __name__ == "__main__":
    sys.exit(main())
