from __future__ import annotations

import io
import stat
from pathlib import Path

import pytest
from pydantic import SecretStr

from app.cli import main
from app.security import check_token, is_loopback
from app.serving import BindRefused, prepare
from app.settings import Settings


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
    settings = Settings(host="0.0.0.0", token=SecretStr("abc"), token_file=tmp_path / "t")
    assert prepare(settings, out=io.StringIO()) is settings
    assert not (tmp_path / "t").exists()


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
    import app

    assert app.__all__ == ["Settings", "create_app", "get_settings"]
    for name in app.__all__:
        assert getattr(app, name).__module__.startswith("app.")
