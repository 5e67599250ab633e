"""Shared test setup: the local WikiText-2 copy (../shared/data, as in CI) and one torch thread."""

import os
from pathlib import Path

import torch

os.environ.setdefault("MINIGATE_DATA_DIR", str(Path(__file__).parents[1].parent / "shared" / "data"))
torch.set_num_threads(1)  # tests share a 2-core machine; one thread each keeps them from oversubscribing
