"""The library stands without the course's packages (issue 56): with ipywidgets, IPython, nbformat, nbclient,
jupyter_client and nbgrader unimportable, `import minigate` works, a ci-preset model trains into a run folder, loads
back, and its sinks and activations are measured. Only `pip install "minigate[course]"` brings those packages."""

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
COURSE_ONLY = ("ipywidgets", "IPython", "nbformat", "nbclient", "jupyter_client", "nbgrader")

PROBE = """
import importlib.abc, sys
BLOCKED = set(sys.argv[1].split(","))

class Absent(importlib.abc.MetaPathFinder):  # as if the package were not installed
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)

sys.meta_path.insert(0, Absent())
import dataclasses, json, torch
import minigate
from minigate.analysis import massive_activations, published_measures
from minigate.presets import PRESETS, model_config
from minigate.train import train

torch.manual_seed(0)
cfg = dataclasses.replace(PRESETS["ci"].train, steps=4, warmup_steps=1, eval_every=2, eval_batches=1,
                          batch_size=2, seq_len=32, device="cpu")
tokens = torch.randint(1, 4096, (20_000,), dtype=torch.int32)
model = minigate.Transformer(dataclasses.replace(model_config("ci", "elementwise"), max_seq_len=32))
history = train(model, tokens, tokens[:2_000], cfg, out_dir=sys.argv[2], progress=True)
back = minigate.from_pretrained(sys.argv[2] + "/model")
windows = torch.cat([torch.zeros(2, 1, dtype=torch.long), tokens[:62].long().view(2, 31)], 1)
m = published_measures(back, windows)
print(json.dumps({"steps": len(history.loss), "m_act": m.m_act, "f_attn": m.f_attn,
                  "loaded": sorted(k.partition(".")[0] for k in sys.modules if k.partition(".")[0] in BLOCKED)}))
"""


@pytest.mark.slow
def test_the_library_trains_and_measures_without_the_course_packages(tmp_path):
    out = subprocess.run([sys.executable, "-c", PROBE, ",".join(COURSE_ONLY), str(tmp_path / "run")],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["steps"] == 4 and got["m_act"] > 0 and 0 < got["f_attn"] <= 1
    assert got["loaded"] == []
    assert (tmp_path / "run" / "model" / "model.safetensors").is_file()


def test_the_course_packages_are_an_extra_not_a_dependency():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    name = lambda req: Requirement(req).name.lower()  # noqa: E731
    required = {name(r) for r in project["dependencies"]}
    course = {name(r) for r in project["optional-dependencies"]["course"]}
    assert not required & {p.lower() for p in COURSE_ONLY}, "the library's dependencies name a course-only package"
    assert {"ipywidgets", "ipython", "nbformat", "nbclient", "jupyter_client"} <= course
