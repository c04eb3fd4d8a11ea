from __future__ import annotations

import gc
import io
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from scalewatch.app.bootstrap_token import check_token
from scalewatch.app.cli import main
from scalewatch.app.cli._serving import (
    MIN_TOKEN_CHARS,
    SHUTDOWN_GRACE_S,
    BindRefused,
    listen,
    make_server,
    prepare,
    ready_to_serve,
)
from scalewatch.app.main import create_app
from scalewatch.app.middleware.hosts import host_name, is_loopback
from scalewatch.app.settings import Settings
from scalewatch.store.engine import open_store
from scalewatch.store.runs import write_steps
from tests._helpers.service import add_run, simulate


def test_binding_elsewhere_without_a_token_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SCALEWATCH_TOKEN", raising=False)
    monkeypatch.setenv("SCALEWATCH_TOKEN_FILE", str(tmp_path / "token"))

    code = main(["serve", "--host", "0.0.0.0", "--db", f"sqlite:///{tmp_path / 'x.db'}"])

    assert code == 2
    assert "SCALEWATCH_TOKEN" in capsys.readouterr().err
    assert not (tmp_path / "token").exists()
    with pytest.raises(BindRefused):
        prepare(Settings(host="10.1.2.3", token_file=tmp_path / "token"), out=io.StringIO())


def test_an_explicit_token_allows_any_host(tmp_path: Path) -> None:
    token = SecretStr("a" * MIN_TOKEN_CHARS)
    settings = Settings(host="0.0.0.0", token=token, token_file=tmp_path / "t")
    assert prepare(settings, out=io.StringIO()) is settings
    assert not (tmp_path / "t").exists()


def test_a_short_token_is_refused_beyond_loopback_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``SCALEWATCH_TOKEN=a scalewatch serve --host 0.0.0.0`` started."""
    monkeypatch.setenv("SCALEWATCH_TOKEN", "a" * (MIN_TOKEN_CHARS - 1))
    monkeypatch.setenv("SCALEWATCH_TOKEN_FILE", str(tmp_path / "token"))
    db = f"sqlite:///{tmp_path / 'x.db'}"
    assert main(["serve", "--host", "0.0.0.0", "--port", "0", "--db", db]) == 2
    err = capsys.readouterr().err
    assert err.startswith("scalewatch serve: refusing to bind '0.0.0.0' with a token of 15")
    assert "one under 16 can be guessed" in err and err.count("\n") == 1, err
    with pytest.raises(BindRefused):
        prepare(Settings(host="10.1.2.3", token=SecretStr("a")), out=io.StringIO())
    loopback = Settings(token=SecretStr("a"), token_file=tmp_path / "t")  # reachable by its host
    assert prepare(loopback, out=io.StringIO()) is loopback


def test_a_generated_token_is_printed_once_and_saved_owner_only(tmp_path: Path) -> None:
    out = io.StringIO()
    path = tmp_path / "dir" / "token"

    settings = prepare(Settings(token_file=path), out=out)

    assert settings.token is not None
    token = settings.token.get_secret_value()
    assert len(token) >= 32
    assert out.getvalue().count(token) == 1
    assert path.read_text().strip() == token
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert token not in repr(settings)


def test_token_check_and_loopback() -> None:
    assert check_token("Bearer abc", "abc")
    assert check_token("bearer abc", "abc")
    assert not check_token("Bearer abd", "abc")
    assert not check_token("Bearer abc", None)
    assert not check_token("", "abc")
    assert all(map(is_loopback, ["127.0.0.1", "127.5.0.1", "::1", "[::1]", "localhost"]))
    assert not any(map(is_loopback, ["0.0.0.0", "::", "192.168.1.4", "example.org"]))


def test_an_empty_token_is_no_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCALEWATCH_TOKEN", " ")
    assert Settings().token is None
    assert not check_token("Bearer ", "")


def test_exported_members() -> None:
    from scalewatch import app

    assert app.__all__ == ["Settings", "create_app", "get_settings"]
    for name in app.__all__:
        assert getattr(app, name).__module__.startswith("scalewatch.app.")


def test_a_port_in_use_fails_before_any_token_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second ``serve`` must not replace the token of the server that holds the port."""
    monkeypatch.delenv("SCALEWATCH_TOKEN", raising=False)
    token_file = tmp_path / "token"
    token_file.write_text("the running server's token\n")
    monkeypatch.setenv("SCALEWATCH_TOKEN_FILE", str(token_file))
    with listen("127.0.0.1", 0) as taken:
        taken.listen()
        port = taken.getsockname()[1]
        code = main(["serve", "--port", str(port), "--db", f"sqlite:///{tmp_path / 'x.db'}"])
    assert code == 3
    assert f"cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err
    assert token_file.read_text() == "the running server's token\n"


def test_listen_takes_a_bracketed_ipv6_loopback() -> None:
    try:
        sock = listen("[::1]", 0)
    except OSError as error:  # a machine without IPv6
        pytest.skip(f"no IPv6 loopback here: {error}")
    with sock:
        assert sock.family == socket.AF_INET6 and sock.getsockname()[0] == "::1"


def test_spaces_around_the_configured_token_are_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCALEWATCH_TOKEN", " tok\n")
    token = Settings().token
    assert token is not None and token.get_secret_value() == "tok"
    assert check_token("Bearer tok", token.get_secret_value())


@pytest.mark.parametrize(
    ("bind", "allowed", "base_url", "status"),
    [
        ("127.0.0.1", "", "http://127.0.0.1:8765", 200),
        ("127.0.0.1", "", "http://localhost:8765", 200),
        ("127.0.0.1", "", "http://[::1]:8765", 200),
        ("127.0.0.1", "", "http://evil.example", 400),  # a page rebinding its name
        ("127.0.0.1", "", "http://127.0.0.1.evil.example", 400),
        ("127.0.0.1", "scalewatch.lab, other", "http://scalewatch.lab", 200),
        ("127.0.0.1", "*", "http://evil.example", 200),
        ("0.0.0.0", "", "http://evil.example", 200),  # bound for others: any name reaches it
    ],
)
def test_a_loopback_service_answers_only_loopback_host_names(
    tmp_path: Path, bind: str, allowed: str, base_url: str, status: int
) -> None:
    settings = Settings(
        db=f"sqlite:///{tmp_path / 'x.db'}",
        host=bind,
        token=SecretStr("t"),
        allowed_hosts=allowed,
    )
    # The name as a browser sends it, in the Host header (Starlette's test client before
    # 1.7 could not take a bracketed IPv6 address in its base URL).
    host = base_url.removeprefix("http://")
    with TestClient(create_app(settings)) as client:
        # Beyond loopback reads need a token: the bootstrap admin's here.
        response = client.get("/api/runs", headers={"Host": host, "Authorization": "Bearer t"})
    assert response.status_code == status
    if status == 400:
        assert "Host" in response.json()["detail"]


def test_host_names() -> None:
    assert host_name("127.0.0.1:8765") == "127.0.0.1"
    assert host_name("[::1]:8765") == host_name("[::1]") == "::1"
    assert host_name("LocalHost") == "localhost"


@pytest.mark.heavy
def test_ctrl_c_stops_serve_while_a_live_stream_is_open(tmp_path: Path) -> None:
    """A live stream never ends by itself: the server must not wait for it for ever. It
    ends the stream (a whole response: the reader sees its end, no broken body) before the
    server's wait for open responses runs out, and exits 0."""
    url = f"sqlite:///{tmp_path / 'sw.db'}"
    store = open_store(url)
    run = add_run(store, simulate(5, set()))
    done = threading.Event()

    def train() -> None:  # a live run: the stream always has a step to send
        step = 5
        while not done.wait(0.05):
            step += 1
            write_steps(store, run, simulate(1, set(), first=step))

    trainer = threading.Thread(target=train)
    trainer.start()
    sock = listen("127.0.0.1", 0)
    port = sock.getsockname()[1]
    sock.close()
    env = {**os.environ, "SCALEWATCH_TOKEN": "t"}
    command = [sys.executable, "-m", "scalewatch.app", "serve", "--port", str(port), "--db", url]
    with subprocess.Popen(
        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    ) as server:
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
                deadline = time.monotonic() + 60
                while not _answers(http):
                    assert server.poll() is None and time.monotonic() < deadline, "no server"
                    time.sleep(0.05)
                with http.stream("GET", f"/api/runs/{run}/stream") as response:
                    assert response.status_code == 200
                    lines = response.iter_lines()
                    # Read on, as a browser does, until the server ends the stream.
                    ended: list[float] = []

                    def read() -> None:
                        for _ in lines:
                            pass
                        ended.append(time.monotonic())

                    reader = threading.Thread(target=read, daemon=True)
                    reader.start()
                    server.send_signal(signal.SIGINT)
                    signalled = time.monotonic()
                    _, err = server.communicate(timeout=30)
                    reader.join(10)
        finally:
            if server.poll() is None:
                server.kill()
            done.set()
            trainer.join(10)
            store.close()
    assert server.returncode == 0, err
    assert "Traceback" not in err and "ERROR" not in err, err
    assert len(ended) == 1, "the stream broke off instead of ending"
    assert ended[0] - signalled < SHUTDOWN_GRACE_S, ended[0] - signalled


def test_serve_logs_writes_and_errors_but_not_the_reads_that_succeeded(tmp_path: Path) -> None:
    """An open dashboard's polls were 65 access lines a minute, burying what mattered."""
    url = f"sqlite:///{tmp_path / 'sw.db'}"
    with open_store(url) as store:
        run = add_run(store, simulate(5, set()))
    sock = listen("127.0.0.1", 0)
    port = sock.getsockname()[1]
    sock.close()
    env = {**os.environ, "SCALEWATCH_TOKEN": "t"}
    command = [sys.executable, "-m", "scalewatch.app", "serve", "--port", str(port), "--db", url]
    with subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as server:
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
                deadline = time.monotonic() + 60
                while not _answers(http):
                    assert server.poll() is None and time.monotonic() < deadline, "no server"
                    time.sleep(0.05)
                for _ in range(3):
                    assert http.get(f"/api/runs/{run}/steps").status_code == 200
                assert http.get("/api/runs/999").status_code == 404
                written = http.post(
                    f"/api/runs/{run}/control",
                    json={"growth_interval": 7},
                    headers={"Authorization": "Bearer t"},
                )
                assert written.status_code == 202
            server.send_signal(signal.SIGINT)
            out, _ = server.communicate(timeout=30)
        finally:
            if server.poll() is None:
                server.kill()
    assert server.returncode == 0, out
    assert '"GET /api/runs/999 HTTP/1.1" 404' in out
    assert f'"POST /api/runs/{run}/control HTTP/1.1" 202' in out
    assert "/steps" not in out and "/healthz" not in out, out


def _answers(http: httpx.Client) -> bool:
    try:
        return http.get("/healthz").status_code == 200
    except httpx.TransportError:
        return False


def test_two_services_keep_a_token_file_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both wrote ~/.scalewatch/token, which then held the second token alone while the first
    service accepted only its own (``make demo`` beside a running ``serve``)."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("SCALEWATCH_TOKEN", raising=False)
    monkeypatch.delenv("SCALEWATCH_TOKEN_FILE", raising=False)
    db = f"sqlite:///{tmp_path / 'x.db'}"
    first, first_sock = ready_to_serve(Settings(db=db, port=0), out=io.StringIO())
    second, second_sock = ready_to_serve(Settings(db=db, port=0), out=io.StringIO())
    with first_sock, second_sock:
        ports = [sock.getsockname()[1] for sock in (first_sock, second_sock)]
        for settings, port in zip((first, second), ports, strict=True):
            assert settings.token is not None
            path = tmp_path / ".scalewatch" / f"token-{port}"
            assert path.read_text().strip() == settings.token.get_secret_value()
            assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert first.token != second.token


@pytest.mark.heavy
def test_a_server_freezes_the_heap_it_starts_with_after_collecting_its_garbage(
    tmp_path: Path,
) -> None:
    """make_server puts what the imports and the app made beyond the collector (its full
    passes no longer walk them), after freeing what was already garbage."""

    class Cycle:
        other: Cycle

    garbage = Cycle()
    garbage.other = garbage
    gone = weakref.ref(garbage)
    del garbage
    settings = Settings(db=f"sqlite:///{tmp_path / 'x.db'}", token=SecretStr("t" * 20))
    gc.unfreeze()  # what a server made in this process before froze
    try:
        with listen("127.0.0.1", 0) as sock:
            make_server(create_app(settings), settings, sock)
        assert gc.get_freeze_count() > 10_000  # the imports, at least
        assert gone() is None  # collected, not frozen
    finally:
        gc.unfreeze()
