"""The spool: a run's batches kept on the node while the service cannot be reached.

One folder per run under the spool's root (node-local: ``$SCALEWATCH_SPOOL_DIR``, else a
folder of the user's in the system's temporary folder, mode 0700): ``run.json`` (the
service's URL and the run's opening), ``batches.jsonl`` (one batch a line, appended and
synced at each batch), ``sent`` (the byte offset of the first batch the service has not
stored), ``lock`` (held by the sender writing the run). A folder nobody holds is a job's
that ended or was killed with batches unsent: the next sender on the node to the same
service sends it, or ``scalewatch spool send``. Any thread holding the folder's lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from .client import ServiceClient, ServiceRefused, one_line

__all__ = [
    "DEFAULT_BYTES",
    "SPOOL_BYTES_ENV",
    "SPOOL_DIR_ENV",
    "Spool",
    "SpooledRun",
    "send_orphans",
    "send_spool",
    "spool_bytes",
    "spool_root",
    "spooled_runs",
    "unsent_bytes",
]

log = logging.getLogger("scalewatch.telemetry")

SPOOL_DIR_ENV = "SCALEWATCH_SPOOL_DIR"
SPOOL_BYTES_ENV = "SCALEWATCH_SPOOL_BYTES"
DEFAULT_BYTES = 256 * 1024 * 1024
BATCHES, SENT, RUN, LOCK = "batches.jsonl", "sent", "run.json", "lock"


def spool_root(value: str | None = None) -> Path:
    """``value``, else ``$SCALEWATCH_SPOOL_DIR``, else ``scalewatch-spool-<uid>`` in the
    system's temporary folder (local to the node, unlike a cluster's home folders)."""
    chosen = value or os.environ.get(SPOOL_DIR_ENV)
    if chosen:
        return Path(chosen).expanduser()
    return Path(tempfile.gettempdir()) / f"scalewatch-spool-{os.getuid()}"


def spool_bytes(value: int | None = None) -> int:
    """``value``, else ``$SCALEWATCH_SPOOL_BYTES``, else 256 MiB: the most unsent bytes all
    runs of the spool's root keep."""
    if value is not None:
        return value
    text = os.environ.get(SPOOL_BYTES_ENV, "").strip()
    if not text:
        return DEFAULT_BYTES
    if not text.isdigit():
        raise ValueError(f"{SPOOL_BYTES_ENV} must be a number of bytes, got {text!r}")
    return int(text)


class Spool:
    """The spool folder of the run ``uid`` under ``root``."""

    def __init__(self, root: Path, uid: str) -> None:
        self.root = root
        self.folder = root / uid
        self._lock: int | None = None
        self._offset: int | None = None
        self.last_sequence = 0  # the newest batch spooled

    def claim(self) -> bool:
        """Hold the folder (made if need be); False while another process holds it."""
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.folder.mkdir(mode=0o700, exist_ok=True)
        fd = os.open(self.folder / LOCK, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._lock = fd
        self._drop_partial_line()
        self.last_sequence = max((body["sequence"] for body, _ in self._bodies()), default=0)
        return True

    def release(self, *, remove: bool = True) -> None:
        """Let the folder go; removed when nothing in it is unsent (and ``remove``)."""
        if self._lock is None:
            return
        if remove and not self.pending():
            shutil.rmtree(self.folder, ignore_errors=True)
        os.close(self._lock)
        self._lock = None

    def write_run(self, url: str, opening: dict[str, Any]) -> None:
        _write_synced(self.folder / RUN, json.dumps({"url": url, "opening": opening}).encode())

    def run(self) -> dict[str, Any]:
        found: dict[str, Any] = json.loads((self.folder / RUN).read_text())
        return found

    def append(self, body: dict[str, Any]) -> None:
        """``body`` after the batches spooled, synced before this returns."""
        with open(self.folder / BATCHES, "ab") as file:
            file.write(json.dumps(body).encode() + b"\n")
            file.flush()
            os.fsync(file.fileno())
        self.last_sequence = max(self.last_sequence, int(body.get("sequence", 0)))

    def head(self) -> tuple[dict[str, Any], int] | None:
        """The oldest unsent batch and its line's length; None when none."""
        try:
            with open(self.folder / BATCHES, "rb") as file:
                file.seek(self.offset())
                line = file.readline()
        except FileNotFoundError:
            return None
        if not line.endswith(b"\n"):
            return None
        return json.loads(line), len(line)

    def pop(self, length: int) -> None:
        """The oldest unsent batch (``length`` bytes) is stored."""
        offset = self.offset() + length
        if offset >= _size(self.folder / BATCHES):
            for name in (BATCHES, SENT):
                with contextlib.suppress(FileNotFoundError):
                    (self.folder / name).unlink()
            offset = 0
        else:
            _write_synced(self.folder / SENT, str(offset).encode())
        self._offset = offset

    def offset(self) -> int:
        if self._offset is None:
            try:
                self._offset = int((self.folder / SENT).read_text() or 0)
            except FileNotFoundError:
                self._offset = 0
        return self._offset

    def unsent(self) -> int:
        """Bytes spooled and not yet stored."""
        return max(0, _size(self.folder / BATCHES) - self.offset())

    def pending(self) -> bool:
        return self.unsent() > 0

    def batches(self) -> int:
        """How many batches are unsent."""
        return len(self._bodies())

    def _bodies(self) -> list[tuple[dict[str, Any], int]]:
        try:
            with open(self.folder / BATCHES, "rb") as file:
                file.seek(self.offset())
                return [(json.loads(line), len(line)) for line in file]
        except FileNotFoundError:
            return []

    def _drop_partial_line(self) -> None:
        """A line its writer did not finish (killed mid-write) is cut off."""
        path = self.folder / BATCHES
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return
        whole = data.rfind(b"\n") + 1
        if whole < len(data):
            with open(path, "r+b") as file:
                file.truncate(whole)


@dataclass(frozen=True, slots=True)
class SpooledRun:
    uid: str
    url: str
    name: str
    batches: int
    bytes: int
    held: bool  # by a job still running on this node


def unsent_bytes(root: Path) -> int:
    """Bytes unsent in every run folder under ``root``."""
    if not root.is_dir():
        return 0
    return sum(Spool(root, entry.name).unsent() for entry in os.scandir(root) if entry.is_dir())


def spooled_runs(root: Path) -> list[SpooledRun]:
    """The runs with batches unsent under ``root``, oldest folder first."""
    if not root.is_dir():
        return []
    found = []
    entries = sorted((e for e in os.scandir(root) if e.is_dir()), key=lambda e: e.stat().st_mtime)
    for entry in entries:
        spool = Spool(root, entry.name)
        if not spool.pending():
            continue
        held = not spool.claim()
        try:
            run = spool.run()
            batches = spool.batches()
        except (OSError, ValueError):
            run, batches = {"url": "?", "opening": {}}, 0
        finally:
            spool.release(remove=False)
        name = str(run["opening"].get("name", "?"))
        found.append(SpooledRun(entry.name, run["url"], name, batches, spool.unsent(), held))
    return found


def send_spool(
    spool: Spool, client: ServiceClient, *, on_answer: Any = None
) -> tuple[int | None, int]:
    """Send ``spool``'s batches (held by the caller) in their order through ``client``;
    returns (the run's id, batches stored). Raises :class:`httpx.HTTPError` when the
    service cannot be reached (the rest stay), :class:`ServiceRefused` when it refuses the
    run (another writer's, say: they all stay). A batch it refuses is let go, logged."""
    run = spool.run()
    run_id, _ = client.open_run(run["opening"])
    sent = 0
    while (head := spool.head()) is not None:
        body, length = head
        try:
            answer = client.post_batch(run_id, body)
        except ServiceRefused as refused:
            log.warning("scalewatch: the service refused a batch of run %d: %s", run_id, refused)
            answer = None
        spool.pop(length)
        sent += 1
        if answer is not None and on_answer is not None:
            on_answer(answer)
    return run_id, sent


def send_orphans(root: Path, url: str | None = None) -> list[tuple[str, str]]:
    """Send the spooled runs under ``root`` that no running job holds (to ``url`` only,
    when given); (uid, what became of it in one line) of each."""
    done = []
    for entry in [e for e in os.scandir(root) if e.is_dir()] if root.is_dir() else []:
        spool = Spool(root, entry.name)
        if not spool.claim():
            continue  # a job still writing it
        if not spool.pending():  # left empty by a job killed after all was sent
            spool.release()
            continue
        try:
            target = spool.run()["url"]
            if url is not None and target.rstrip("/") != url.rstrip("/"):
                continue
            client = ServiceClient(target)
            try:
                run_id, sent = send_spool(spool, client)
                done.append((entry.name, f"run {run_id}: {sent} batches stored"))
            finally:
                client.close()
        except (httpx.HTTPError, ServiceRefused, OSError, ValueError, KeyError) as error:
            done.append((entry.name, f"left in the spool: {one_line(error)}"))
        finally:
            spool.release()
    return done


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _write_synced(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` whole: written beside it, synced, renamed over it."""
    temporary = path.with_name(path.name + ".tmp")
    with open(temporary, "wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)
