"""Files that are never silently corrupted: atomic writes, and a run folder that one run at a time holds.

    atomic_write("runs/x/run.json", lambda f: f.write(data))  # the old file or the new one, never half of one
    with RunLock("runs/ci-headwise"):      # a second run into the folder is refused at once
        ...                                # released on any exit (the OS drops it if the process dies)
    with RunLock("runs/ci-headwise", timeout=10):  # or waits up to 10 s for the folder first
    lock_holder("runs/ci-headwise")        # who holds it, without taking it: {"pid", "host", "started"} or None

The lock is filelock's `FileLock` on `.lock.os` in the folder (flock on POSIX, LockFileEx on Windows: the OS drops it
when its process ends, however it ends); `.lock` beside it names the holder (pid, host, start time), written once the
lock is held and removed before it is released, so other processes can read it at any moment. Both go at the end of
the run. `check_writable(folder)` makes the folder and proves it can write there; `remove_orphans(folder)` removes
the temp files that an interrupted atomic write left behind. train() uses them, once per run. `read_run_json(folder)`
reads what `minigate train` recorded about a run (a folder of minigate 0.1's: a one-line error naming the key
to rename).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from pathlib import Path

import psutil
from filelock import FileLock, Timeout

LOCK_NAME = ".lock"  # names the holder: pid=, host=, started= lines
OS_LOCK_NAME = ".lock.os"  # the (empty) file that filelock locks
TMP_GLOB = ".*.tmp"  # atomic_write's temp files, see _tmp_path


def _tmp_path(path: Path) -> Path:
    """Where atomic_write writes `path` first: .<name>.<pid>.tmp beside it (TMP_GLOB finds the orphans)."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def atomic_write(path: str | os.PathLike, write):
    """Call write(file) on a temp file in the same folder, then rename it over `path` (atomic on POSIX
    and Windows): a crash at any moment leaves either the old file or the new one, never half of one."""
    path = Path(path)
    tmp = _tmp_path(path)
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


class RunFolderInUse(RuntimeError):
    """Another process is training into this run folder."""


def check_writable(folder: str | os.PathLike) -> Path:
    """Create `folder` (and parents) and write and remove a probe file there; a ValueError naming the folder
    and the fix if it is a file, or cannot be created or written."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"--out {folder} is a file, not a folder; choose a folder for the run")
    probe = _tmp_path(folder / "write-probe")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise ValueError(f"--out {folder} cannot be written ({e.strerror or e}); choose a folder you can write "
                         "to (a read-only or full disk also gives this)") from None
    return folder


def _read_holder(path: Path) -> dict:
    """The key=value lines of a `.lock` ({} if there is none, or it cannot be read)."""
    try:
        return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    except (OSError, ValueError):
        return {}


def _alive(pid: int) -> bool:
    """Whether process `pid` runs on this machine (psutil asks the OS; nothing is sent to it). A process that ended but
    that its parent has not yet waited for (a zombie) still counts, as the OS still lists it."""
    return 0 < pid < 2**31 and psutil.pid_exists(pid)


def lock_holder(folder: str | os.PathLike) -> dict | None:
    """Who holds `folder`'s RunLock, read from its `.lock` without taking the lock (so a status check can never make
    a run's start fail): {"pid": int, "host": str, "started": str}, or None when no run holds it (no `.lock`, or one
    left by a process of this host that no longer runs). A holder on another host is returned: it cannot be checked."""
    info = _read_holder(Path(folder) / LOCK_NAME)
    try:
        holder = {"pid": int(info["pid"]), "host": info["host"], "started": info["started"]}
    except (KeyError, ValueError):
        return None
    return holder if holder["host"] != socket.gethostname() or _alive(holder["pid"]) else None


class RunLock:
    """Held for a whole run: filelock's lock on `.lock.os`, and `.lock` naming the holder (pid, host, start time).

    When another process holds the folder, `timeout` 0 refuses at once (RunFolderInUse) and `timeout` > 0 waits up to
    that many seconds first. Re-entrant within one process: a nested `with RunLock(folder)` in the holder is a no-op,
    never a deadlock (filelock's own count: one FileLock per path in a process, is_singleton). A `.lock` left by a
    process that no longer runs (the OS dropped its lock) is reported and taken over."""

    def __init__(self, folder: str | os.PathLike, timeout: float = 0):
        self.folder = Path(folder).resolve()
        self.path = self.folder / LOCK_NAME
        self.timeout = timeout

    def _holder(self) -> str:
        """Who `.lock` names: "process 123 on host, started 2026-11-23 10:00:00" ("" if there is none)."""
        info = _read_holder(self.path)
        if not info:
            return ""
        return f"process {info.get('pid', '?')} on {info.get('host', '?')}, started {info.get('started', '?')}"

    def __enter__(self) -> RunLock:
        self.folder.mkdir(parents=True, exist_ok=True)
        # the same FileLock for this folder everywhere in this process; any thread of the holder may release it
        self._lock = lock = FileLock(self.folder / OS_LOCK_NAME, thread_local=False, is_singleton=True)
        try:
            lock.acquire(timeout=self.timeout)
        except Timeout:
            who = self._holder() or "unknown"
            raise RunFolderInUse(f"{self.folder} is in use by another run ({who}); wait for it to finish, stop it "
                                 "(Ctrl-C checkpoints it), or choose another --out") from None
        if lock.lock_counter > 1:  # this process held the folder already: filelock counted one more level, no wait
            return self
        try:
            who = self._holder()
            if who:  # named, yet nobody held the lock: its process died without cleaning up
                print(f"note: {self.path} was left by {who}, which is no longer running; taking it over", flush=True)
            self.path.write_text(f"pid={os.getpid()}\nhost={socket.gethostname()}\n"
                                 f"started={time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        except BaseException:
            lock.release()
            raise
        return self

    def __exit__(self, *exc):
        lock = self._lock
        try:
            if lock.lock_counter == 1:  # the outermost exit: both files go while the lock is still held (the next
                # holder finds no stale `.lock`); an inner one only lowers filelock's count
                with contextlib.suppress(OSError):  # on Windows a status check may have it open for an instant
                    self.path.unlink(missing_ok=True)
                if os.name != "nt":  # a waiter that opened this inode sees it unlinked and retries on the new file;
                    (self.folder / OS_LOCK_NAME).unlink(missing_ok=True)  # Windows: filelock removes it after release
        finally:
            lock.release()


def remove_orphans(folder: str | os.PathLike) -> list[Path]:
    """Delete the temp files of interrupted atomic writes in `folder` and `folder/model`. Call it while
    holding the folder's RunLock: then no live writer can own them."""
    folder = Path(folder)
    found = [p for d in (folder, folder / "model") if d.is_dir() for p in d.glob(TMP_GLOB)]
    for p in found:
        p.unlink(missing_ok=True)
    return found


def read_run_json(path: str | os.PathLike) -> dict:
    """A run.json (the file, or a folder holding one): what `minigate train` recorded about a run. A folder written by
    minigate 0.1 records the run's variant under the key "gate": a ValueError says how to bring it up to date."""
    path = Path(path)
    path = path / "run.json" if path.is_dir() else path
    record = json.loads(path.read_text())
    if "gate" in record:
        raise ValueError(f"{path} records the run's variant under 'gate' (written by minigate 0.1): rename that key to "
                         "'variant' in the file, then run again")
    return record
