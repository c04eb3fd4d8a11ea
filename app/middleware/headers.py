"""Security headers on every answer: the pages load scripts, styles and data from this
service alone and run no inline script, and no other site may frame them; served over TLS,
browsers are told to come back over TLS alone (HSTS)."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["CONTENT_SECURITY_POLICY", "SECURITY_HEADERS", "STRICT_TRANSPORT", "SecurityHeaders"]

# Inline styles stay allowed: plotly.js and Swagger UI set them as they draw.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline';"
    " img-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none';"
    " form-action 'self'; frame-ancestors 'none'"
)
SECURITY_HEADERS = (
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
)

# A year, this host alone: the service's name says nothing of its domain's other hosts.
STRICT_TRANSPORT = (b"strict-transport-security", b"max-age=31536000")


class SecurityHeaders:
    """Add :data:`SECURITY_HEADERS` to every HTTP answer that does not set them itself, and
    :data:`STRICT_TRANSPORT` to those over HTTPS (a plain-HTTP answer's would be ignored)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        added: tuple[tuple[bytes, bytes], ...] = SECURITY_HEADERS
        if scope.get("scheme") == "https":
            added = (*SECURITY_HEADERS, STRICT_TRANSPORT)

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {name.lower() for name, _ in headers}
                headers.extend(item for item in added if item[0] not in present)
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, with_headers)
