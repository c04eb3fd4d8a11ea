"""A store on a real network filesystem: a folder of this machine served by sshd on
127.0.0.1 and mounted with sshfs (FUSE), as a cluster's home directory would be over NFS.
The trainer is refused before its first step, the CLI in one line, and a URL that asks
for a rollback journal trains and records there. Skipped where sshd, sshfs or FUSE are
missing (CI installs openssh-server and sshfs)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from scalewatch.store import open_store
from tests._helpers.processes import end_process
from tests._helpers.stored import db_url, step_rows
from tests._helpers.waiting import wait_for

SSHD = "/usr/sbin/sshd"
SSHFS = shutil.which("sshfs")
FUSERMOUNT = shutil.which("fusermount3") or shutil.which("fusermount")

pytestmark = pytest.mark.skipif(
    not (os.path.exists(SSHD) and SSHFS and FUSERMOUNT and os.path.exists("/dev/fuse")),
    reason="needs sshd, sshfs and FUSE (apt-get install openssh-server sshfs)",
)

TRAIN = """
import sys, torch, scalewatch
gs = scalewatch.GradScaler("cpu", telemetry=sys.argv[1])
param = torch.nn.Parameter(torch.ones(2))
param.grad = torch.ones(2)
opt = torch.optim.SGD([param], lr=0.1)
for _ in range(3):
    gs.scale(param.sum())
    gs.step(opt)
    gs.update()
gs.close()
print("trained")
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _mounted(point: Path) -> bool:
    lines = Path("/proc/self/mounts").read_text().splitlines()
    return any(line.split()[1] == str(point) for line in lines)


@pytest.fixture
def sshfs_mount(tmp_path: Path) -> Iterator[Path]:
    """``tmp_path/export`` served by a sshd of this test's own and mounted at
    ``tmp_path/mnt`` with sshfs; unmounted and stopped afterwards."""
    keys, export, point = tmp_path / "keys", tmp_path / "export", tmp_path / "mnt"
    for folder in (keys, export, point):
        folder.mkdir()
    for name in ("host", "client"):
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(keys / name)], check=True
        )
    shutil.copy(keys / "client.pub", keys / "authorized_keys")
    port = _free_port()
    config = keys / "sshd_config"
    config.write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {keys / 'host'}\n"
        f"AuthorizedKeysFile {keys / 'authorized_keys'}\nPidFile {keys / 'sshd.pid'}\n"
        "StrictModes no\nUsePAM no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
        "PermitRootLogin prohibit-password\nSubsystem sftp internal-sftp\n"
    )
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation folder
    log = keys / "sshd.log"
    with log.open("wb") as err:
        sshd = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stderr=err)
    try:

        def listening() -> bool:
            if sshd.poll() is not None:
                raise RuntimeError(f"sshd exited: {log.read_text()[-500:]}")
            with socket.socket() as sock:
                return sock.connect_ex(("127.0.0.1", port)) == 0

        wait_for(listening, 30, "sshd to listen")
        user = os.environ.get("USER") or __import__("getpass").getuser()
        options = (
            f"IdentityFile={keys / 'client'},StrictHostKeyChecking=no,"
            "UserKnownHostsFile=/dev/null,BatchMode=yes,LogLevel=ERROR"
        )
        mount = subprocess.run(
            [SSHFS, "-p", str(port), "-o", options, f"{user}@127.0.0.1:{export}", str(point)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if mount.returncode != 0:
            pytest.skip(f"sshfs could not mount here: {mount.stderr.strip()[-300:]}")
        wait_for(lambda: _mounted(point), 30, "the sshfs mount")
        try:
            yield point
        finally:
            subprocess.run([FUSERMOUNT, "-u", "-z", str(point)], check=False)
    finally:
        end_process(sshd)


def test_a_trainer_and_the_cli_are_refused_on_sshfs_and_a_rollback_journal_records_there(
    sshfs_mount: Path, tmp_path: Path
) -> None:
    url = db_url(sshfs_mount / "sw.db")
    refused = subprocess.run(
        [sys.executable, "-c", TRAIN, url], capture_output=True, text=True, timeout=120
    )
    assert refused.returncode == 1 and "trained" not in refused.stdout
    last = refused.stderr.strip().splitlines()[-1]
    assert "StoreOnNetworkFilesystem" in last and "is on a fuse.sshfs filesystem" in last
    assert list(sshfs_mount.iterdir()) == []  # refused before anything was written
    cli = subprocess.run(
        [sys.executable, "-m", "scalewatch.app", "db", "upgrade", "--db", url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert cli.returncode == 1
    assert cli.stderr.count("\n") == 1 and "is on a fuse.sshfs filesystem" in cli.stderr
    one_host = url + "?journal_mode=delete"
    trained = subprocess.run(
        [sys.executable, "-c", TRAIN, one_host], capture_output=True, text=True, timeout=120
    )
    assert trained.returncode == 0, trained.stderr[-2000:]
    with open_store(one_host) as store:
        assert [row["step"] for row in step_rows(store)] == [1, 2, 3]
    assert (tmp_path / "export" / "sw.db").exists()  # on the far side of the mount
    assert not (tmp_path / "export" / "sw.db-wal").exists()
