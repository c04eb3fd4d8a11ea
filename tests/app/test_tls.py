"""``scalewatch serve --ssl-certfile/--ssl-keyfile`` serves HTTPS (uvicorn's TLS), and says
so in Strict-Transport-Security."""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests._helpers.net import free_port
from tests._helpers.processes import end_process

pytestmark = pytest.mark.heavy  # real processes or a real trainer: make check leaves it out

TOKEN = "a-token-for-the-tls-test"


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, made by the ``openssl`` command."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("needs the openssl command to make a certificate")
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


def test_serve_answers_https_with_the_certificate(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    port = free_port()
    command = [
        sys.executable, "-m", "scalewatch.app", "serve", "--port", str(port),
        "--db", f"sqlite:///{tmp_path / 'sw.db'}",
        "--ssl-certfile", str(cert), "--ssl-keyfile", str(key),
    ]  # fmt: skip
    env = {**os.environ, "SCALEWATCH_TOKEN": TOKEN}
    trusting = ssl.create_default_context(cafile=str(cert))
    log = tmp_path / "serve.out"
    with log.open("wb") as out:
        server = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        with httpx.Client(base_url=f"https://127.0.0.1:{port}", verify=trusting) as https:
            deadline = time.monotonic() + 60
            while True:
                assert server.poll() is None and time.monotonic() < deadline, "no server"
                try:
                    me = https.get("/api/whoami", headers={"Authorization": f"Bearer {TOKEN}"})
                    break
                except httpx.ConnectError:
                    time.sleep(0.1)
            assert me.json()["name"] == "admin"
            # Browsers that met it once come back over HTTPS alone, for a year.
            assert me.headers["strict-transport-security"] == "max-age=31536000"
        with pytest.raises(httpx.TransportError):  # plain HTTP is not spoken there
            httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5)
    finally:
        end_process(server)
    out = log.read_text()
    assert f"serving https://127.0.0.1:{port}/" in out
    assert "reads are open on loopback" in out


def test_a_certificate_without_its_key_is_refused(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from scalewatch.app.cli import cli

    result = CliRunner().invoke(cli, ["serve", "--ssl-certfile", "c.pem", "--db", "x.db"])
    assert result.exit_code == 2
    assert "--ssl-certfile and --ssl-keyfile go together" in result.stderr
