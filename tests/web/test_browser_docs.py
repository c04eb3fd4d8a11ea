"""The pages in headless Chromium under their Content-Security-Policy: the docs page
(Swagger UI renders FastAPI's OpenAPI 3.1) and the dashboard work, loading nothing from
outside the service."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests._helpers.harness import CHROMIUM, Served, Tab

pytestmark = pytest.mark.browser

if not Path(CHROMIUM).exists():
    pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium)", allow_module_level=True)
pytest.importorskip("playwright.sync_api")


def test_the_docs_page_lists_the_operations_and_loads_only_from_the_service(
    strict_tab: Tab, served: Served
) -> None:
    """Swagger UI 4.15 said "Unable to render this definition" of the OpenAPI 3.1 document."""
    tab = strict_tab
    page = tab.page
    requested: list[str] = []
    page.on("request", lambda request: requested.append(request.url))
    page.goto("/docs")
    page.locator(".opblock").first.wait_for()
    operations = {
        (block.locator(".opblock-summary-method").inner_text(), block.get_attribute("id"))
        for block in page.locator(".opblock").all()
    }
    paths = {
        text.replace("\u200b", "")
        for text in page.locator(".opblock-summary-path").all_inner_texts()
    }
    assert "/api/runs/{run}/control" in paths and "/api/runs/{run}/steps" in paths
    assert len(operations) >= 10
    assert {method for method, _ in operations} == {"GET", "POST", "PUT", "DELETE"}
    assert page.get_by_text("Unable to render this definition").count() == 0
    assert tab.errors == []
    assert requested
    hosts = {urlsplit(url).hostname for url in requested if not url.startswith("data:")}
    assert hosts == {"127.0.0.1"}, requested


def test_the_dashboard_works_under_its_content_security_policy(
    strict_tab: Tab, served: Served
) -> None:
    """Waits on selectors alone: an expression evaluated in the page is what the policy
    refuses (``script-src 'self'``)."""
    tab = strict_tab
    page = tab.page
    requested: list[str] = []
    page.on("request", lambda request: requested.append(request.url))
    page.goto("/")
    page.locator("#runs tbody tr").first.wait_for()
    page.locator("#updated", has_text="Updated").wait_for()
    page.goto(f"/run.html?run={served.run_id}")
    page.locator("#chart:not([data-points='0']) .main-svg").first.wait_for()
    page.locator("#live[data-state='live']").wait_for()
    page.locator("#control-fields input").first.wait_for()
    assert tab.errors == []
    hosts = {urlsplit(url).hostname for url in requested if not url.startswith("data:")}
    assert hosts == {"127.0.0.1"}, requested
