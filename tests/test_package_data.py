"""The data ships: every file under data/ is in the wheel as minigate/_data/..., and an installed (not editable)
minigate finds each one and reads its seeds, prompts, tokenizer and shipped models from there, as in Colab.

The wheel is built from a clean copy of the checkout (the files git tracks or would, as in the working tree: a stale
build/ folder cannot hide a gap), or taken from $MINIGATE_WHEEL_DIR (`make test` builds it once: tests/colab_env.py
wheel DIR). About 20 s on 2 cores; 5 s with make test's wheel.
"""

import json
import os
import subprocess
import zipfile
from pathlib import Path

import pytest
from colab_env import ROOT, clean_env, git_files, wheel_env

from minigate import data
from minigate.course import release

pytestmark = pytest.mark.slow  # builds and installs the wheel
DATA = sorted(f.removeprefix("data/") for f in git_files() if f.startswith("data/"))
FIX = ('widen [tool.setuptools.package-data] "minigate._data" in pyproject.toml ("**/*" takes every file but those '
       'whose name starts with a dot)')

PROBE = """import json, sys, sysconfig
import minigate
from minigate import data
from minigate.resources import DATA_DIR
from minigate.course import release
print(json.dumps({
    "minigate": minigate.__file__, "data": str(DATA_DIR), "site": sysconfig.get_paths()["purelib"],
    "absent": [f for f in json.loads(sys.argv[1]) if not (DATA_DIR / f).is_file()],
    "seeds": {p.stem: sorted(release.seed_rows(p.stem)) for p in (DATA_DIR / "seeds").glob("*.json")},
    "prompts": {k: len(v) for k, v in data.load_prompts().items()},
    "vocab": data.load_tokenizer().get_vocab_size(), "shipped": release.shipped_names()}))"""


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(the wheel, the python of an environment with it installed)."""
    folder = os.environ.get("MINIGATE_WHEEL_DIR")
    if folder:
        return next(Path(folder).glob("minigate-*.whl")), Path(folder) / "env" / "bin" / "python"
    dest = tmp_path_factory.mktemp("wheel")
    python = wheel_env(dest)
    return next(dest.glob("minigate-*.whl")), python


def test_every_data_file_is_in_the_wheel(installed):
    assert "seeds/code.json" in DATA and "tokenizer.json" in DATA  # what lessons 04 and 08 open, what every one does
    names = set(zipfile.ZipFile(installed[0]).namelist())
    missing = [f for f in DATA if f"minigate/_data/{f}" not in names]
    assert not missing, f"{len(missing)} files of data/ are not in the wheel, e.g. {missing[:8]}: {FIX}"


def test_an_installed_minigate_reads_its_data(installed, tmp_path):
    out = subprocess.run([str(installed[1]), "-c", PROBE, json.dumps(DATA)], cwd=tmp_path, env=clean_env(),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout)
    site = Path(found["site"])
    assert Path(found["minigate"]).is_relative_to(site) and not Path(found["minigate"]).is_relative_to(ROOT)
    assert Path(found["data"]) == site / "minigate" / "_data"  # the installed copy, not the checkout's data/
    assert not found["absent"], f"installed minigate lacks {found['absent'][:8]}: {FIX}"
    # what the lessons read, the same as from the checkout: the seeds (lessons 04 and 08), prompts, tokenizer, models
    assert found["seeds"] == {Path(f).stem: sorted(release.seed_rows(Path(f).stem)) for f in DATA
                              if f.startswith("seeds/") and f.endswith(".json")}
    assert found["prompts"] == {k: len(v) for k, v in data.load_prompts().items()}
    assert found["vocab"] == data.load_tokenizer().get_vocab_size()
    assert found["shipped"] == release.shipped_names()
