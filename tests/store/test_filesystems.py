"""A SQLite store on a network filesystem is refused before anything is written, in one
line; a URL that asks for a rollback journal keeps a one-host user working
(scalewatch.store.filesystems). The mounts are given here (psutil's list, as Linux's
/proc/self/mounts reads); tests/store/test_network_mount.py does it on a real sshfs mount."""

from __future__ import annotations

import os
import sqlite3
from collections import namedtuple
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import scalewatch
from scalewatch.app.cli import cli
from scalewatch.store import filesystems, open_store
from scalewatch.store.errors import StoreOnNetworkFilesystem
from scalewatch.store.filesystems import is_network, mount_of
from scalewatch.telemetry import TelemetrySettings
from tests._helpers.stored import db_url, step_rows

Partition = namedtuple("Partition", "device mountpoint fstype opts")


def mounted(monkeypatch: pytest.MonkeyPatch, *mounts: tuple[str, str]) -> None:
    """The host's mounts are ``(mount point, type)``, and / is ext4."""
    table = [Partition("/dev/root", "/", "ext4", "rw")]
    table += [Partition("server:/export", point, kind, "rw") for point, kind in mounts]
    monkeypatch.setattr(filesystems.psutil, "disk_partitions", lambda all=False: table)


@pytest.mark.parametrize(
    "fstype",
    ["nfs", "nfs4", "cifs", "smb3", "lustre", "gpfs", "beegfs", "ceph", "glusterfs", "9p",
     "fuse.sshfs", "fuse.s3fs", "fuse.gcsfuse", "fuse.juicefs", "NFS4", "smbfs"],
)  # fmt: skip
def test_network_filesystems_are_told(fstype: str) -> None:
    assert is_network(fstype)


@pytest.mark.parametrize(
    "fstype", ["ext4", "xfs", "btrfs", "zfs", "tmpfs", "overlay", "apfs", "fuse"]
)
def test_local_filesystems_are_not(fstype: str) -> None:
    assert not is_network(fstype)


def test_the_mount_of_a_path_is_the_longest_mount_point_that_holds_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    mounted(monkeypatch, (str(home), "nfs4"), (str(home / "me" / "scratch"), "xfs"))
    (home / "me" / "scratch").mkdir(parents=True)
    assert mount_of(str(home / "me" / "sw.db")) == filesystems.Mount(str(home), "nfs4")
    assert mount_of(str(home / "me" / "scratch" / "sw.db")).fstype == "xfs"  # type: ignore[union-attr]
    assert mount_of(str(tmp_path / "homework" / "sw.db")).fstype == "ext4"  # type: ignore[union-attr]
    # a link out of the network mount counts where it leads
    os.symlink(tmp_path, home / "me" / "local")
    assert mount_of(str(home / "me" / "local" / "sw.db")).fstype == "ext4"  # type: ignore[union-attr]


def test_a_store_on_a_network_filesystem_is_refused_in_one_line_and_nothing_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mounted(monkeypatch, (str(tmp_path), "nfs4"))
    db = tmp_path / "sw.db"
    with pytest.raises(StoreOnNetworkFilesystem) as refused:
        open_store(db_url(db))
    message = str(refused.value)
    assert "\n" not in message
    assert repr(str(db)) in message and "nfs4" in message and str(tmp_path) in message
    assert "local disk" in message and "PostgreSQL" in message and "?journal_mode=delete" in message
    assert list(tmp_path.iterdir()) == []


def test_a_rollback_journal_in_the_url_keeps_one_host_working_without_wal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mounted(monkeypatch, (str(tmp_path), "nfs4"))
    db = tmp_path / "sw.db"
    url = db_url(db) + "?journal_mode=delete"
    gs = scalewatch.GradScaler("cpu", telemetry=url)
    param = __import__("torch").nn.Parameter(__import__("torch").ones(2))
    param.grad = __import__("torch").ones(2)
    opt = __import__("torch").optim.SGD([param], lr=0.1)
    for _ in range(3):
        gs.scale(param.sum())
        gs.step(opt)
        gs.update()
    gs.close()
    with open_store(url) as store:
        assert [row["step"] for row in step_rows(store)] == [1, 2, 3]
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA journal_mode").fetchone() == ("delete",)
    conn.close()
    assert not (tmp_path / "sw.db-wal").exists()


def test_a_journal_mode_that_is_not_one_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="journal_mode in a store's URL is one of wal, delete"):
        open_store(db_url(tmp_path / "sw.db") + "?journal_mode=memory")


@pytest.mark.parametrize("given", ["url", "settings", "environment"])
def test_a_scaler_is_refused_where_it_is_made_before_any_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, given: str
) -> None:
    mounted(monkeypatch, (str(tmp_path), "lustre"))
    url = db_url(tmp_path / "sw.db")
    telemetry: Any = {"url": url, "settings": TelemetrySettings(url), "environment": None}[given]
    if given == "environment":
        monkeypatch.setenv("SCALEWATCH_DB", url)
    with pytest.raises(StoreOnNetworkFilesystem, match="is on a lustre filesystem"):
        scalewatch.ShardedGradScaler("cpu", telemetry=telemetry)
    # a relative path, read against the working folder
    monkeypatch.chdir(tmp_path)
    with pytest.raises(StoreOnNetworkFilesystem):
        scalewatch.GradScaler("cpu", telemetry="sw.db")
    scalewatch.GradScaler("cpu", telemetry=False)  # no store, nothing to refuse
    assert list(tmp_path.iterdir()) == []


def test_every_command_that_opens_the_store_says_it_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = db_url(tmp_path / "sw.db")
    open_store(url).close()  # a store there already (made before the folder was shared)
    new = db_url(tmp_path / "new.db")
    mounted(monkeypatch, (str(tmp_path), "fuse.sshfs"))
    for argv in (
        ["db", "upgrade", "--db", new],
        ["runs", "--db", url],
        ["tokens", "list", "--db", url],
    ):
        result = CliRunner().invoke(cli, argv, catch_exceptions=False)
        assert result.exit_code == 1, (argv, result.output)
        assert result.stderr.count("\n") == 1, result.stderr
        assert "is on a fuse.sshfs filesystem" in result.stderr
