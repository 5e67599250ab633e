"""The Python-files corpora: the .py files of this Python, one rule with two settings (the pinned python-code corpus,
read from wheels and the same on every machine, is code_wheels.py).

python-stdlib: the .py files under `sysconfig.get_paths()["stdlib"]`, minus test folders,
site-packages and the generated codec tables in encodings/, ordered by a hash of their relative path
(deterministic, but mixing packages, so a size cap keeps a varied sample) and taken until `max_bytes`
(STDLIB_MAX_BYTES). The standard library changes between Python versions, so this corpus does too:
`stdlib_info()` records the version, and so does every run's history.

python-site: the same rule over every site-packages folder too (`site.getsitepackages()` and the user
site), with test folders skipped, ordered by a hash of "<stdlib or site-packages>/<path relative to its
root>" so the order is the same wherever Python is installed, capped at SITE_MAX_BYTES. Every machine
has one, of a different size, and installing a package changes it: `python_site_info()` records what was read
(Python version, files, bytes, a content hash), and `minigate train` writes it into run.json. It was the `code`
presets' corpus until python-code was pinned to wheels; it stays for anyone who wants their own machine's code.

corpora.py splits the files 90/10 into documents.
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

STDLIB_MAX_BYTES = 6_000_000  # default cap of the python-stdlib corpus (the full 3.11 stdlib is ~10 MB)
SITE_MAX_BYTES = 150_000_000  # default cap of python-site; a smaller one for a quick try or a test: the environment
#                               variable MINIGATE_CODE_MAX_BYTES (as for python-code)


@dataclass(frozen=True)
class PythonFiles:
    """The .py files of a corpus, in a fixed order: (path, label, size) sorted by a hash of the label."""

    skip: frozenset  # folder names whose files are left out
    site_packages: bool  # also every site-packages folder (labels "<kind>/<path>"); False: the stdlib alone

    def roots(self) -> list[Path]:
        """The standard library, then (site_packages) every site-packages folder of this Python, no duplicates."""
        paths = [sysconfig.get_paths()["stdlib"]]
        if self.site_packages:
            import site

            paths += [*site.getsitepackages(), site.getusersitepackages(), sysconfig.get_paths()["purelib"],
                      sysconfig.get_paths()["platlib"]]
        out = []
        for r in paths:
            p = Path(r).resolve()
            if p.is_dir() and p not in out:
                out.append(p)
        return out

    @functools.lru_cache(maxsize=1)  # noqa: B019 (two instances, kept for the process)
    def all_files(self) -> tuple[tuple[Path, str, int], ...]:
        """(path, label, size) of every .py file under the roots, skipped folders left out, in hashed label order."""
        roots, files = self.roots(), []
        stdlib = Path(sysconfig.get_paths()["stdlib"]).resolve()
        for root in roots:
            kind = "stdlib" if root == stdlib else "site-packages"
            for p in root.rglob("*.py"):
                rel = p.relative_to(root)
                parts = set(rel.parts[:-1])
                if parts & self.skip or (kind == "stdlib" and parts & {"site-packages", "dist-packages"}):
                    continue
                if any(r != root and r.is_relative_to(root) and p.is_relative_to(r) for r in roots):
                    continue  # site-packages inside the stdlib folder: counted under its own root
                files.append((p, f"{kind}/{rel.as_posix()}" if self.site_packages else rel.as_posix()))
        files.sort(key=lambda f: hashlib.sha1(f[1].encode()).hexdigest())
        return tuple((p, label, p.stat().st_size) for p, label in files)

    def files(self, max_bytes: int | None) -> list[Path]:
        """The files in their fixed order up to max_bytes (None: all); empty files and any file that would
        overflow the cap are skipped."""
        out, total = [], 0
        for p, _, size in self.all_files():
            if size == 0 or (max_bytes is not None and total + size > max_bytes):
                continue
            out.append(p)
            total += size
        return out


STDLIB = PythonFiles(frozenset({"test", "tests", "idle_test", "__pycache__", "encodings"}), site_packages=False)
SITE = PythonFiles(frozenset({"test", "tests", "testing", "idle_test", "__pycache__", "encodings"}), site_packages=True)


def stdlib_files(max_bytes: int | None = STDLIB_MAX_BYTES) -> list[Path]:
    """The stdlib .py files of the python-stdlib corpus, in their fixed (hashed-path) order."""
    return STDLIB.files(max_bytes)


def stdlib_info(max_bytes: int | None = STDLIB_MAX_BYTES) -> dict:
    """What python-stdlib contains here: Python version, folder, file count and bytes."""
    files = stdlib_files(max_bytes)
    return {"python": sys.version.split()[0], "stdlib": sysconfig.get_paths()["stdlib"],
            "files": len(files), "bytes": sum(p.stat().st_size for p in files), "max_bytes": max_bytes}


def site_max_bytes() -> int:
    return int(os.environ.get("MINIGATE_CODE_MAX_BYTES") or SITE_MAX_BYTES)


def site_files(max_bytes: int | None = None) -> list[Path]:
    """The .py files of the python-site corpus, in their fixed (hashed-path) order, up to max_bytes
    (None: site_max_bytes(), i.e. SITE_MAX_BYTES unless MINIGATE_CODE_MAX_BYTES says otherwise)."""
    return SITE.files(max_bytes or site_max_bytes())


def python_site_info(max_bytes: int | None = None) -> dict:
    """What python-site holds on this machine: Python version, files, bytes, and a SHA-256 of the contents."""
    return _site_info(max_bytes or site_max_bytes())


@functools.lru_cache(maxsize=4)
def _site_info(max_bytes: int) -> dict:
    files, h, total = site_files(max_bytes), hashlib.sha256(), 0
    for p in files:
        b = p.read_bytes()
        h.update(hashlib.sha256(b).digest())
        total += len(b)
    # the kinds of folder read, not their paths: run.json files travel with shipped checkpoints
    roots = ["stdlib" if i == 0 else "site-packages" for i, _ in enumerate(SITE.roots())]
    return {"python": sys.version.split()[0], "roots": roots, "files": len(files),
            "bytes": total, "max_bytes": max_bytes, "sha256": h.hexdigest()}
