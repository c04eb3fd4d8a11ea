"""After a session of a real service that used every operation with every kind of
credential, no token, secret, salt, hash or proxy header secret is in its log, in an
answer, in /metrics or in an export."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from scalewatch.store.engine import open_store
from scalewatch.store.runs import end_run
from scalewatch.store.schema import identities
from tests._helpers.net import free_port
from tests._helpers.processes import end_process
from tests._helpers.service import add_run, simulate

pytestmark = pytest.mark.heavy  # real processes or a real trainer: make check leaves it out

BOOTSTRAP = "bootstrap-secret-0123456789abcdef-for-the-leak-test"
ACCESS_TOKEN = "oauth2-proxy-access-token-that-must-never-show"


def concrete(path: str, run: int) -> str:
    names = {"run": str(run), "step": "3", "name": "nobody"}
    return re.sub(r"\{(\w+)\}", lambda m: names[m[1]], path)


def test_no_secret_in_any_log_line_answer_metric_or_export(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'sw.db'}"
    with open_store(url) as store:
        run = add_run(store, simulate(20, {3, 9}))
        end_run(store, run)  # its streams end by themselves
    port = free_port()
    command = [
        sys.executable, "-m", "scalewatch.app", "serve", "--port", str(port), "--db", url,
        "--trust-proxy", "127.0.0.1/32", "--proxy-user-header", "X-Forwarded-User",
    ]  # fmt: skip
    log = tmp_path / "serve.log"
    env = {**os.environ, "SCALEWATCH_TOKEN": BOOTSTRAP}
    with log.open("wb") as out:
        server = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    answers: list[str] = []
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=20) as http:
            deadline = time.monotonic() + 60
            while True:
                assert server.poll() is None and time.monotonic() < deadline, log.read_text()
                try:
                    http.get("/healthz")
                    break
                except httpx.TransportError:
                    time.sleep(0.1)
            boot = {"Authorization": f"Bearer {BOOTSTRAP}"}
            tokens = {"bootstrap": BOOTSTRAP}
            for role in ("viewer", "operator", "admin"):
                made = http.post("/api/tokens", json={"name": role, "role": role}, headers=boot)
                tokens[role] = made.json()["token"]
            tokens["revoked"] = http.post(
                "/api/tokens", json={"name": "gone", "role": "admin"}, headers=boot
            ).json()["token"]
            http.delete("/api/tokens/gone", headers=boot)
            document = http.get("/openapi.json").json()
            credentials = [
                *({"Authorization": f"Bearer {token}"} for token in tokens.values()),
                {"Authorization": f"Bearer {tokens['viewer']}x"},
                {"Authorization": f"Basic {BOOTSTRAP}"},
                {"X-Forwarded-User": "ada", "X-Forwarded-Access-Token": ACCESS_TOKEN},
                {},
            ]
            for path, operations in document["paths"].items():
                for method in operations:
                    for headers in credentials:
                        body = {"growth_interval": 5} if method in ("post", "put") else None
                        answer = http.request(
                            method, concrete(path, run), json=body, headers=headers
                        )
                        answers.append(f"{answer.status_code} {answer.headers} {answer.text}")
            ticket = http.post("/api/tickets", headers=boot).json()["ticket"]
            for what in ("steps", "overflows"):
                for fmt in ("csv", "jsonl"):
                    answers.append(
                        http.get(
                            f"/api/runs/{run}/export?what={what}&format={fmt}&ticket={ticket}"
                        ).text
                    )
            answers.append(http.get("/metrics", headers=boot).text)
    finally:
        end_process(server)
    with open_store(url) as store, store.read() as conn:
        rows = conn.execute(select(identities)).mappings().all()
    secrets = [ACCESS_TOKEN, *tokens.values()]
    secrets += [token.split("_", 2)[2] for token in tokens.values() if token.startswith("sw_")]
    secrets += [row["token_hash"] for row in rows if row["token_hash"]]
    secrets += [row["salt"] for row in rows if row["salt"]]
    logged = log.read_text()
    assert "GET /api/runs" in logged  # the access log was written
    everything = logged + "\n".join(answers)
    assert len(answers) > 100
    for secret in secrets:
        assert secret not in everything, secret[:6]
