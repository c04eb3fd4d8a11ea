"""Screenshots of both dashboard pages, from a real service over a run being written.

    .venv/bin/python tests/web/take_screenshots.py [--out docs/screenshots]

Writes ``runs.png`` (the runs page) and ``run.png`` (one run, after a control change
was applied) with headless Chromium.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from _harness import CHROMIUM, CHROMIUM_ARGS, serve_live_run
from playwright.sync_api import sync_playwright

ROOT = Path(__file__).resolve().parents[2]
POINTS = "Number(document.getElementById('chart').dataset.points)"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    with (
        tempfile.TemporaryDirectory() as tmp,
        serve_live_run(
            Path(tmp),
            name="gpt-1.3b fsdp fp16 (8 ranks)",
            history=6000,
            overflow_every=0,
            ceiling=2.0**19,
            ranks="2,5",
            ended_runs=[("bert-large pretrain", "finished"), ("t5-3b sweep lr=3e-4", "crashed")],
        ) as served,
        sync_playwright() as playwright,
    ):
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        context = browser.new_context(
            base_url=served.base_url, viewport={"width": 1280, "height": 800}
        )
        page = context.new_page()
        page.set_default_timeout(15_000)

        page.set_viewport_size({"width": 1280, "height": 420})
        page.goto("/")
        page.locator("#runs tbody tr").nth(2).wait_for()
        page.screenshot(path=args.out / "runs.png", full_page=True)
        page.set_viewport_size({"width": 1280, "height": 800})

        page.goto(f"/run.html?run={served.run_id}")
        page.wait_for_function(f"{POINTS} > 0")
        page.fill("#token", served.token)
        page.fill("#f-growth_interval", "500")
        page.click("#control-submit")
        page.locator("#history tbody tr[data-status=applied]").wait_for()
        page.wait_for_function("document.getElementById('chart').dataset.markers === '1'")
        before = page.evaluate(POINTS)
        page.wait_for_function(f"{POINTS} > {before + 20}")
        page.mouse.move(0, 0)
        page.screenshot(path=args.out / "run.png", full_page=True)
        browser.close()
    print(f"wrote {args.out / 'runs.png'} and {args.out / 'run.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
