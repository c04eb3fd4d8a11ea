"""The dashboard as a viewer (no control action) and as an operator (a change lands, and
the history names who made it)."""

from __future__ import annotations

import pytest

from scalewatch.store.control import control_history
from scalewatch.store.identities import Role, create_identity
from tests._helpers.harness import Served, Tab

pytestmark = pytest.mark.browser

POINTS = "(document.getElementById('chart').data || []).reduce((n, t) => n + (t.x || []).length, 0)"


def signed_in(tab: Tab, token: str) -> None:
    tab.page.add_init_script(f"sessionStorage.setItem('scalewatch.token', {token!r})")


def test_a_viewer_sees_who_they_are_and_cannot_change_the_run(tab: Tab, served: Served) -> None:
    token = create_identity(served.store, "vera", Role.VIEWER, by="test").token
    signed_in(tab, token)
    page = tab.page
    page.goto(f"/run.html?run={served.run_id}")
    page.wait_for_function(f"{POINTS} > 0")  # reads work with the viewer's token
    assert page.inner_text("#whoami") == "vera · viewer"
    page.locator("#control-closed", has_text="only an operator or an admin").wait_for()
    assert page.is_disabled("#control-submit")
    assert page.is_disabled("#f-growth_interval")
    assert page.is_disabled("#autopilot-switch")
    assert not page.is_visible("#token")
    page.locator("#live[data-state=live]").wait_for()  # the stream opened with a ticket
    assert tab.unexpected_errors() == []


def test_an_operators_change_lands_and_the_history_names_them(tab: Tab, served: Served) -> None:
    token = create_identity(served.store, "olga", Role.OPERATOR, by="test").token
    signed_in(tab, token)
    page = tab.page
    page.goto(f"/run.html?run={served.run_id}")
    page.wait_for_function(f"{POINTS} > 0")
    assert page.inner_text("#whoami") == "olga · operator"
    assert not page.is_visible("#token")  # the kept token sends the change
    page.fill("#f-growth_interval", "41")
    page.click("#control-submit")
    row = page.locator("#history tbody tr[data-status=applied]", has_text="growth_interval = 41")
    row.wait_for(timeout=10_000)
    assert "olga" in row.inner_text()
    mine = [
        r
        for r in control_history(served.store, served.run_id)
        if r.values == {"growth_interval": 41}
    ]
    assert [(r.requested_by, r.source) for r in mine] == [("olga", "api")]
    assert tab.unexpected_errors() == []
