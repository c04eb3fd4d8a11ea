"""The filesystem a SQLite store's file lies on, and the stores SQLite cannot keep there.

SQLite's WAL needs every process that opens the database on one host, sharing memory
("WAL does not work over a network filesystem", sqlite.org/wal.html), and its locks are
only as good as the filesystem's: a store on NFS, Lustre, GPFS, CephFS, sshfs and the like
is refused before anything is written to it, in one line that says the ways out. A user
who knows that only one host ever opens the file says so in the URL with a rollback
journal (``?journal_mode=delete``), which such a filesystem supports.

Mounts are read through psutil (``/proc/self/mounts`` on Linux, ``getfsstat`` on macOS
and the BSDs). Any thread, any process.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import psutil

from .errors import StoreOnNetworkFilesystem

# Filesystem types whose files other hosts reach, or that a remote service backs, as
# mounts name them (Linux's /proc/self/mounts, macOS's f_fstypename).
NETWORK_TYPES = frozenset(
    {
        "nfs", "nfs4", "cifs", "smb", "smb3", "smbfs", "afs", "ncpfs", "coda",
        "lustre", "gpfs", "beegfs", "ceph", "glusterfs", "ocfs2", "gfs2", "orangefs",
        "pvfs2", "9p", "virtiofs", "davfs", "webdav", "afpfs", "panfs", "quobyte",
    }
)  # fmt: skip
# FUSE filesystems (Linux names them fuse.<name>) backed by another host or a service.
NETWORK_FUSE = frozenset(
    {
        "sshfs", "s3fs", "gcsfuse", "juicefs", "rclone", "goofys", "blobfuse", "blobfuse2",
        "glusterfs", "cephfs", "ceph-fuse", "lustre", "beegfs", "mountpoint-s3", "weka",
        "objectivefs", "cvmfs2", "davfs", "smbnetfs", "curlftpfs", "alluxio-fuse",
    }
)  # fmt: skip
# The journal modes a URL may ask for; all but WAL are rollback journals, which need no
# shared memory and work on a filesystem of one host's use.
JOURNAL_MODES = ("wal", "delete", "truncate", "persist")


@dataclass(frozen=True)
class Mount:
    mountpoint: str
    fstype: str


def is_network(fstype: str) -> bool:
    """Whether a mount of type ``fstype`` may be shared between hosts.

    >>> is_network("nfs4"), is_network("fuse.sshfs"), is_network("ext4"), is_network("fuse")
    (True, True, False, False)
    """
    kind = fstype.lower()
    if kind.startswith(("fuse.", "fuseblk.")):
        return kind.split(".", 1)[1] in NETWORK_FUSE
    return kind in NETWORK_TYPES or kind.startswith(("nfs", "smb"))


def mount_of(path: str) -> Mount | None:
    """The mount that holds ``path`` (a file that need not exist yet: its nearest existing
    folder decides); None where the mounts cannot be read."""
    real = os.path.realpath(path)
    try:
        mounts = psutil.disk_partitions(all=True)
    except (OSError, RuntimeError, NotImplementedError):
        return None
    best: Mount | None = None
    for mount in mounts:
        point = mount.mountpoint
        inside = real == point or real.startswith(point.rstrip(os.sep) + os.sep)
        if inside and (best is None or len(point) >= len(best.mountpoint)):
            best = Mount(point, mount.fstype)  # the last of equal points: mounted over
    return best


def refuse_network(path: str, journal_mode: str | None) -> None:
    """Raise :class:`StoreOnNetworkFilesystem` when the SQLite file ``path`` lies on a
    network filesystem and ``journal_mode`` (the URL's, None if it names none) is not a
    rollback journal."""
    if journal_mode not in (None, "wal"):
        return
    mount = mount_of(path)
    if mount is not None and is_network(mount.fstype):
        raise StoreOnNetworkFilesystem(os.path.abspath(path), mount.fstype, mount.mountpoint)
