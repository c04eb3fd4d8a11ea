"""The bootstrap admin token: drawn by a ``serve`` or ``demo`` given none, compared in
constant time, and left in a file for its owner alone. The command's process."""

from __future__ import annotations

import hmac
import os
import secrets
from pathlib import Path

__all__ = ["check_token", "new_token", "write_token_file"]


def new_token() -> str:
    return secrets.token_urlsafe(32)


def check_token(authorization: str | None, expected: str | None) -> bool:
    """Whether an ``Authorization`` header carries the expected bearer token.

    >>> check_token("Bearer abc", "abc"), check_token("Bearer abd", "abc"), check_token(None, "abc")
    (True, False, False)
    """
    if not expected or not authorization:
        return False
    scheme, _, presented = authorization.partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(presented.strip().encode(), expected.encode())


def write_token_file(path: Path, token: str) -> Path:
    """Write ``token`` to ``path``, readable and writable by its owner only (0600)."""
    path = path.expanduser()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, (token + "\n").encode())
    finally:
        os.close(fd)
    return path
