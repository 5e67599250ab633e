"""Shared test setup: the local WikiText-2 copy (../shared/data, as in CI) and one torch thread."""

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import torch

# the folder of local corpus copies; its old name, if set, is taken over (the notebooks' kernels see the new one only)
os.environ.setdefault("MINIGATE_CORPORA_DIR", os.environ.pop("MINIGATE_DATA_DIR", None)
                      or str(Path(__file__).parents[1].parent / "shared" / "data"))
# the token cache of this test session (and of the notebooks' kernels it starts) stays out of ~/.cache
if "MINIGATE_CACHE_DIR" not in os.environ:
    os.environ["MINIGATE_CACHE_DIR"] = tempfile.mkdtemp(prefix="minigate-cache-")
    atexit.register(shutil.rmtree, os.environ["MINIGATE_CACHE_DIR"], True)
torch.set_num_threads(1)  # tests share a 2-core machine; one thread each keeps them from oversubscribing


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (tests/gpu; `python tests/gpu/check.py` runs them)")

