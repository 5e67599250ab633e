"""Files that are never silently corrupted: atomic writes, and a run folder that one run at a time holds.

    atomic_write("runs/x/run.json", lambda f: f.write(data))  # the old file or the new one, never half of one
    with RunLock("runs/ci-headwise"):      # a second run into the folder is refused at once
        ...                                # released on any exit (the OS drops it if the process dies)

`check_writable(folder)` makes the folder and proves it can write there; `remove_orphans(folder)` removes
the temp files that an interrupted atomic write left behind. train() uses them, once per run. `read_run_json(folder)`
reads what `minigate train` recorded about a run, in today's key names.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

if os.name == "nt":
    import msvcrt

    def _try_lock(f) -> bool:
        try:
            msvcrt.locking(f.fileno(), msvcrt.LK_NBLCK, 1)
            return True
        except OSError:
            return False
else:
    import fcntl

    def _try_lock(f) -> bool:
        """An advisory lock the OS drops when the process ends, however it ends (kill -9 included)."""
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError:
            return False

LOCK_NAME = ".lock"
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


class RunLock:
    """Held for a whole run: `.lock` in the folder names the holder (pid, host, start time).

    Re-entrant within one process: a nested `with RunLock(folder)` in the holder is a no-op, never a deadlock.
    A lock left by a process that no longer runs is reported and taken over."""

    _held: dict[Path, list] = {}  # folder -> [file object, depth], for this process

    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder).resolve()
        self.path = self.folder / LOCK_NAME

    def _holder(self) -> str:
        """Who wrote the lock file: "process 123 on host, started 2026-11-23 10:00:00" ("" if unreadable)."""
        try:
            info = dict(line.split("=", 1) for line in self.path.read_text().splitlines() if "=" in line)
        except OSError:
            return ""
        return f"process {info.get('pid', '?')} on {info.get('host', '?')}, started {info.get('started', '?')}"

    def __enter__(self) -> RunLock:
        if self.folder in self._held:
            self._held[self.folder][1] += 1
            return self
        self.folder.mkdir(parents=True, exist_ok=True)
        while True:
            who = self._holder() if self.path.exists() else ""
            f = open(self.path, "a+")
            if not _try_lock(f):
                f.close()
                raise RunFolderInUse(f"{self.folder} is in use by another run ({self._holder() or 'unknown'}); "
                                     "wait for it to finish, stop it (Ctrl-C checkpoints it), or choose another --out")
            try:  # the holder may have released and unlinked it while we opened it: then lock the new file
                if os.stat(self.path).st_ino == os.fstat(f.fileno()).st_ino:
                    break
            except FileNotFoundError:
                pass
            f.close()
        if who:  # the file was there but nobody held it: its process died without cleaning up
            print(f"note: {self.path} was left by {who}, which is no longer running; taking it over", flush=True)
        f.seek(0)
        f.truncate()
        f.write(f"pid={os.getpid()}\nhost={socket.gethostname()}\nstarted={time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        f.flush()
        self._held[self.folder] = [f, 1]
        return self

    def __exit__(self, *exc):
        entry = self._held[self.folder]
        entry[1] -= 1
        if entry[1] == 0:
            del self._held[self.folder]
            self.path.unlink(missing_ok=True)  # unlink first: a waiting run then finds no stale file
            entry[0].close()  # closing drops the flock


def remove_orphans(folder: str | os.PathLike) -> list[Path]:
    """Delete the temp files of interrupted atomic writes in `folder` and `folder/model`. Call it while
    holding the folder's RunLock: then no live writer can own them."""
    folder = Path(folder)
    found = [p for d in (folder, folder / "model") if d.is_dir() for p in d.glob(TMP_GLOB)]
    for p in found:
        p.unlink(missing_ok=True)
    return found


def read_run_json(path: str | os.PathLike) -> dict:
    """A run.json (the file, or a folder holding one): what `minigate train` recorded about a run. Older folders, the
    shipped checkpoints among them, record the run's variant under the key "gate"; it is read as "variant"."""
    path = Path(path)
    path = path / "run.json" if path.is_dir() else path
    return {("variant" if key == "gate" else key): value for key, value in json.loads(path.read_text()).items()}
