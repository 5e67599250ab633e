"""The GPU check's own plumbing, on CPU: it skips cleanly without CUDA, and its notebook runner reports
passes, failures (cell and last line) and the device a notebook used."""

import subprocess
import sys

import nbformat
import pytest
import torch

from minigate.course import ROOT
from tests.gpu import check

pytestmark = pytest.mark.slow  # runs the check and notebooks in processes of their own


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_without_cuda_the_check_says_so_and_passes():
    r = subprocess.run([sys.executable, str(ROOT / "tests" / "gpu" / "check.py")], capture_output=True, text=True)
    assert r.returncode == 0 and "no CUDA GPU here" in r.stdout


def test_notebook_runner_reports_pass_failure_and_device(tmp_path):
    good, bad = tmp_path / "good.ipynb", tmp_path / "bad.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1 + 1")]), good)
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("y = 2"),
                                                   nbformat.v4.new_code_cell("assert y == 3, 'y is not 3'")]), bad)
    ok = check.run_notebook(str(good), timeout=120)
    assert ok["ok"] and ok["device"] == ("cpu" if not torch.cuda.is_available() else torch.cuda.get_device_name())
    failed = check.run_notebook(str(bad), timeout=120)
    assert not failed["ok"] and failed["error"].startswith("cell 1:") and "y is not 3" in failed["error"]
