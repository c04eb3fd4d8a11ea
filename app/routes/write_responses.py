"""What every token-guarded write may answer besides its own success, for the OpenAPI document."""

from __future__ import annotations

from ..middleware.limits import MAX_BODY_BYTES
from ..models import ErrorMessage

__all__ = ["WRITE_RESPONSES"]

WRITE_RESPONSES: dict[int | str, dict[str, object]] = {
    400: {
        "model": ErrorMessage,
        "description": "the body cannot be decoded: not UTF-8, an integer of over 4300"
        " digits, nesting too deep (JSON with a syntax error is a 422 json_invalid)",
    },
    401: {"model": ErrorMessage, "description": "missing or wrong bearer token"},
    404: {"model": ErrorMessage, "description": "no such run"},
    409: {"model": ErrorMessage, "description": "the run is not running"},
    413: {"model": ErrorMessage, "description": f"a body over {MAX_BODY_BYTES} bytes"},
    429: {
        "model": ErrorMessage,
        "description": "too many wrong tokens from this client lately: refused, whatever"
        " the token, for the seconds in Retry-After",
        "headers": {"Retry-After": {"schema": {"type": "integer"}}},
    },
}
