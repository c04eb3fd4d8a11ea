from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests._helpers.harness import (
    CHROMIUM,
    CHROMIUM_ARGS,
    HOSTILE_NAME,
    Served,
    Tab,
    serve_live_run,
)


# Package-scoped, not session-scoped: the browser tests run one after the other on one worker
# (tests/conftest.py's GROUPS), and both end with the last of them. Playwright's sync API keeps
# its event loop running in the main thread while it is open, and a later test on the same
# worker that calls asyncio.run would find it there.
@pytest.fixture(scope="package")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp_dir: Path = tmp_path_factory.mktemp("web")
    with serve_live_run(tmp_dir, ended_runs=[(HOSTILE_NAME, 120)]) as live:
        yield live


@pytest.fixture(scope="package")
def browser() -> Iterator[Any]:
    """Chromium, for every browser test (a module that needs nothing else from the
    browser than this fixture is skipped here as the others skip themselves)."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


def _tab(browser: Any, served: Served, *, bypass_csp: bool) -> Iterator[Tab]:
    context = browser.new_context(
        base_url=served.base_url,
        accept_downloads=True,
        viewport={"width": 1280, "height": 900},
        bypass_csp=bypass_csp,
    )
    page = context.new_page()
    # What a page waits for (a live step, a chart drawn) comes in well under a second on a
    # quiet machine; the suite runs on several workers, beside other work.
    page.set_default_timeout(30_000)
    tab = Tab(page)
    page.on("console", lambda message: message.type == "error" and tab.errors.append(message.text))
    page.on("pageerror", lambda error: tab.errors.append(f"uncaught: {error}"))

    def on_dialog(dialog: Any) -> None:
        tab.dialogs.append(dialog.message)
        dialog.dismiss()

    page.on("dialog", on_dialog)
    yield tab
    context.close()


@pytest.fixture
def tab(browser: Any, served: Served) -> Iterator[Tab]:
    """A tab whose page lets the test evaluate JavaScript: Playwright evaluates a waited-on
    expression as a string, which the pages' Content-Security-Policy refuses. The pages
    under their policy: ``strict_tab``."""
    yield from _tab(browser, served, bypass_csp=True)


@pytest.fixture
def strict_tab(browser: Any, served: Served) -> Iterator[Tab]:
    """A tab under the pages' Content-Security-Policy (a violation is a console error)."""
    yield from _tab(browser, served, bypass_csp=False)
