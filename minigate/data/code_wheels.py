"""python-code: the .py files of a pinned list of pure-Python wheels, the same bytes on every machine.

The list is `data/python-code.lock.json`: each wheel by name, version, file name and SHA-256 (with its licence
and why it is there), and the two caps. pip fetches the wheels from the package index into the corpus cache
(`MINIGATE_CACHE_DIR`, default ~/.cache/minigate, folder `wheels/`) and checks every hash; nothing installed on this
machine enters the corpus, so the same lock gives the same corpus on a laptop, in Colab and in CI.

The rule, as for the Python-files corpora (python_files.py): every `.py` member of every wheel, outside test folders,
labelled "<wheel name>/<path in the wheel>" and ordered by a SHA-1 of that label; walking that order, a file is
skipped when it is empty, when its bytes equal a file taken before it (pip vendors requests, pygments and more), when
its wheel already holds `per_wheel_max_bytes`, or when it would pass `max_bytes`. corpora.py splits the files 90/10.

Offline, or behind a proxy: pip reads its usual settings, so `PIP_FIND_LINKS=<folder of the wheels> PIP_NO_INDEX=1`
fetches from a folder; or copy the wheels into the cache's `wheels/` folder (each is checked against the lock).
`MINIGATE_CODE_LOCK` names another lock file (the tests use one small wheel of this one).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from ..resources import DATA_DIR

LOCK_FILE = "python-code.lock.json"  # in data/
LOCK_VAR = "MINIGATE_CODE_LOCK"  # another lock file, e.g. a one-wheel subset for tests
SKIP = frozenset({"test", "tests", "testing", "idle_test", "__pycache__", "encodings"})  # folders left out


class CorpusLockError(RuntimeError):
    """A wheel of the lock could not be had, or its bytes are not the ones the lock pins."""


@dataclass(frozen=True)
class Wheel:
    name: str  # the distribution's name, also the first part of each file's label
    version: str  # pinned version
    file: str  # the wheel's file name (py3-none-any)
    sha256: str  # of the wheel file, as the package index lists it
    license: str  # as its metadata states it
    kind: str  # why it is in the mix: general, numerical, web or tooling


@dataclass(frozen=True)
class Lock:
    wheels: tuple[Wheel, ...]
    max_bytes: int  # the corpus's cap in bytes of .py
    per_wheel_max_bytes: int  # no wheel gives more than this, so no one package dominates
    sha256: str  # of the lock file's bytes: the corpus's name in every record

    def requirements(self) -> str:
        """A pip requirements file pinning every wheel by version and hash."""
        return "".join(f"{w.name}=={w.version} --hash=sha256:{w.sha256}\n" for w in self.wheels)


def lock_path() -> Path:
    return Path(os.environ.get(LOCK_VAR) or DATA_DIR / LOCK_FILE)


def load_lock(path: str | Path | None = None) -> Lock:
    """The lock file (default: $MINIGATE_CODE_LOCK, else data/python-code.lock.json)."""
    path = Path(path or lock_path())
    raw = path.read_bytes()
    got = json.loads(raw)
    wheels = tuple(Wheel(**{k: w[k] for k in Wheel.__dataclass_fields__}) for w in got["wheels"])
    return Lock(wheels, int(got["max_bytes"]), int(got["per_wheel_max_bytes"]), hashlib.sha256(raw).hexdigest())


def wheel_dir() -> Path:
    return Path(os.environ.get("MINIGATE_CACHE_DIR") or Path.home() / ".cache" / "minigate") / "wheels"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _say(msg: str):
    print(f"[minigate.data] {msg}", flush=True)


def fetch(lock: Lock | None = None, dest: Path | None = None, quiet: bool = False) -> list[Path]:
    """Every wheel of the lock in `dest` (default: the cache's wheels/), fetched with pip where missing, each checked
    against its SHA-256. Raises CorpusLockError naming the wheel that could not be had or does not match."""
    lock, dest = lock or load_lock(), Path(dest or wheel_dir())
    dest.mkdir(parents=True, exist_ok=True)
    with FileLock(dest / ".fetch.lock"):  # two processes (test workers, two trainings) fetch once
        return _fetch(lock, dest, quiet)


def _fetch(lock: Lock, dest: Path, quiet: bool) -> list[Path]:
    missing = [w for w in lock.wheels if not (dest / w.file).is_file()]
    if missing:
        _say(f"python-code: fetching {len(missing)} pinned wheels with pip into {dest}")
        with tempfile.TemporaryDirectory() as tmp:
            req = Path(tmp) / "requirements.txt"
            req.write_text(Lock(tuple(missing), 0, 0, "").requirements())
            # the wheels are read, not installed: any Python fetches the same py3-none-any files
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--platform", "any",
                   "--python-version", "3.11", "--implementation", "py", "--abi", "none", "--ignore-requires-python",
                   "--require-hashes", "-r", str(req), "-d", str(dest), "--progress-bar", "off"]
            done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            last = [ln for ln in done.stderr.splitlines() if ln.strip() and not ln.startswith("WARNING")][-1:]
            raise CorpusLockError(
                f"python-code: {len(missing)} pinned wheels (first: {missing[0].file}) are not in {dest} and pip "
                f"could not fetch them ({last[0].strip() if last else 'pip failed'}). Connect to the package index, "
                f"or point pip at a folder of the wheels (PIP_FIND_LINKS=<folder> PIP_NO_INDEX=1), or copy them into "
                f"{dest}; the list is in {LOCK_FILE}.")
    for w in lock.wheels:
        path = dest / w.file
        if not path.is_file():
            raise CorpusLockError(f"python-code: pip fetched no {w.file}; fetch {w.name}=={w.version} into {dest}")
        if _sha256(path) != w.sha256:
            raise CorpusLockError(f"python-code: {path} is not the pinned {w.name}=={w.version} (SHA-256 differs "
                                  f"from the lock's {w.sha256[:12]}...); delete it and fetch again")
    if not quiet and missing:
        size = sum((dest / w.file).stat().st_size for w in lock.wheels)
        _say(f"python-code: {len(lock.wheels)} wheels checked, {size:,} bytes")
    return [dest / w.file for w in lock.wheels]


def _members(wheel: Wheel, path: Path) -> list[tuple[str, bytes]]:
    """(label, bytes) of the wheel's .py files outside test folders."""
    with zipfile.ZipFile(path) as z:
        return [(f"{wheel.name}/{m}", z.read(m)) for m in z.namelist()
                if m.endswith(".py") and not set(m.split("/")[:-1]) & SKIP]


@functools.lru_cache(maxsize=2)
def _corpus(lock: Lock, dest: str, max_bytes: int) -> tuple[tuple[str, bytes], ...]:
    files = [f for w, p in zip(lock.wheels, fetch(lock, Path(dest)), strict=True) for f in _members(w, p)]
    files.sort(key=lambda f: hashlib.sha1(f[0].encode()).hexdigest())
    out, seen, per_wheel, total = [], set(), {}, 0
    for label, b in files:
        digest, wheel = hashlib.sha256(b).digest(), label.split("/", 1)[0]
        size = len(b)
        if (size == 0 or digest in seen or per_wheel.get(wheel, 0) + size > lock.per_wheel_max_bytes
                or total + size > max_bytes):
            continue
        out.append((label, b))
        seen.add(digest)
        per_wheel[wheel] = per_wheel.get(wheel, 0) + size
        total += size
    return tuple(out)


def code_max_bytes(lock: Lock | None = None) -> int:
    """The cap: $MINIGATE_CODE_MAX_BYTES for a quick try or a test, else the lock's."""
    return int(os.environ.get("MINIGATE_CODE_MAX_BYTES") or (lock or load_lock()).max_bytes)


def code_files(max_bytes: int | None = None) -> list[tuple[str, bytes]]:
    """python-code's files as (label, bytes), in their fixed order, up to max_bytes (None: code_max_bytes())."""
    lock = load_lock()
    return list(_corpus(lock, str(wheel_dir()), max_bytes or code_max_bytes(lock)))


def python_code_info(max_bytes: int | None = None) -> dict:
    """What python-code holds: the lock's SHA-256, its wheels, the files and bytes taken, and a SHA-256 of their
    contents (the same on every machine for the same lock and cap)."""
    lock = load_lock()
    files, h = code_files(max_bytes), hashlib.sha256()
    for _, b in files:
        h.update(hashlib.sha256(b).digest())
    return {"lock_sha256": lock.sha256, "wheels": len(lock.wheels), "files": len(files),
            "bytes": sum(len(b) for _, b in files), "max_bytes": max_bytes or code_max_bytes(lock),
            "sha256": h.hexdigest()}
