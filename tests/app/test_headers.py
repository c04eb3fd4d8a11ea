"""Security headers: the pages run no inline script and cannot be framed by another site."""

from __future__ import annotations

import re
from html.parser import HTMLParser

from fastapi.testclient import TestClient

from scalewatch.app.dashboard import web_dir

PAGES = ("/", "/run.html", "/docs")


def test_every_answer_carries_the_security_headers(client: TestClient) -> None:
    for path in (*PAGES, "/api/runs", "/api/runs/999", "/healthz", "/style.css", "/nothing"):
        headers = client.get(path).headers
        assert headers["x-frame-options"] == "DENY", path
        assert headers["x-content-type-options"] == "nosniff", path
        parts = headers["content-security-policy"].split("; ")
        policy = {name: value for name, _, value in (part.partition(" ") for part in parts)}
        assert policy["script-src"] == "'self'", path
        assert policy["frame-ancestors"] == "'none'", path
        assert policy["default-src"] == "'self'", path


def test_a_refusal_before_the_routes_carries_them_too(client: TestClient) -> None:
    response = client.get("/api/runs", headers={"Host": "evil.example"})
    assert response.status_code == 400
    assert response.headers["x-frame-options"] == "DENY"


class _Scripts(HTMLParser):
    """Inline scripts and event-handler attributes: what ``script-src 'self'`` blocks."""

    def __init__(self) -> None:
        super().__init__()
        self.inline: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        names = dict(attrs)
        self.inline += [f"{tag} {name}" for name in names if name.startswith("on")]
        self.inline += [f"{tag} {name}" for name, v in attrs if v and v.startswith("javascript:")]
        self._in_script = tag == "script" and "src" not in names
        if self._in_script:
            self.inline.append("script without src")

    def handle_endtag(self, tag: str) -> None:
        self._in_script = False


def test_the_pages_have_no_inline_script_the_policy_would_block(client: TestClient) -> None:
    sources = [client.get(path).text for path in PAGES]
    sources += [page.read_text() for page in web_dir().glob("*.html")]
    for html in sources:
        parser = _Scripts()
        parser.feed(html)
        assert parser.inline == [], parser.inline
    for script in web_dir().glob("*.js"):
        assert not re.search(r"\beval\(|new Function\(", script.read_text()), script.name


def test_hsts_only_over_https(client: TestClient) -> None:
    assert "strict-transport-security" not in client.get("/healthz").headers
    over_tls = client.get(client.base_url.copy_with(scheme="https").join("/healthz"))
    assert over_tls.headers["strict-transport-security"] == "max-age=31536000"
    assert over_tls.headers["x-frame-options"] == "DENY"
