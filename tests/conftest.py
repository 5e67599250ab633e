"""Shared test setup: the local WikiText-2 copy (../shared/data, as in CI) and one torch thread; and the helpers the
test files share, as fixtures: the tiny models' ModelConfig fields (one config, and a three-layer one where a test needs
a middle layer), seeded token ids, a seeded tiny model, transformers' Qwen3Config fields of the same tiny model, the
held-out prose windows, a free local port, a tiny training run's data and TrainConfig, a Measurement of given numbers
and closing the figures a test drew. The `slow` marker: what `make test-fast` leaves out."""

import atexit
import os
import shutil
import socket
import tempfile
from pathlib import Path
from types import MappingProxyType

import pytest
import torch

# the folder of local corpus copies (the notebooks' kernels see it too)
os.environ.setdefault("MINIGATE_CORPORA_DIR", str(Path(__file__).parents[1].parent / "shared" / "data"))
# the token cache of this test session (and of the notebooks' kernels it starts) stays out of ~/.cache
if "MINIGATE_CACHE_DIR" not in os.environ:
    os.environ["MINIGATE_CACHE_DIR"] = tempfile.mkdtemp(prefix="minigate-cache-")
    atexit.register(shutil.rmtree, os.environ["MINIGATE_CACHE_DIR"], True)
# python-code in the tests: one small wheel of the pinned list (werkzeug, 0.75 MB of .py in 52 files), fetched once per
# test session into its cache; test_python_code.py checks that it is the lock's own entry
if "MINIGATE_CODE_LOCK" not in os.environ:
    import json

    _lock = json.loads((Path(__file__).parents[1] / "data" / "python-code.lock.json").read_text())
    _small = Path(os.environ["MINIGATE_CACHE_DIR"]) / "python-code-small.lock.json"
    _small.write_text(json.dumps(dict(_lock, wheels=[w for w in _lock["wheels"] if w["name"] == "werkzeug"])))
    os.environ["MINIGATE_CODE_LOCK"] = str(_small)
torch.set_num_threads(1)  # tests share a 2-core machine; one thread each keeps them from oversubscribing


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (tests/gpu; `python tests/gpu/check.py` runs them)")
    config.addinivalue_line("markers", "slow: over about 3 s on 2 cores (training, a subprocess, a notebook, a "
                                       "wheel); `make test-fast` leaves them out, `make test` runs them")


@pytest.fixture(scope="session")
def tiny():
    """ModelConfig fields of the tests' tiny model: 2 layers of 4 heads x 8 with 2 value heads (grouped queries),
    d_model 32, d_ff 48, 64 token ids, no gate. Read-only: a test adds its own, ModelConfig(**tiny, gate="G1")."""
    return MappingProxyType(dict(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=48))


@pytest.fixture(scope="session")
def tiny_deep(tiny):
    """The tiny model with a third layer: a first, a middle and a last layer (the per-layer measures, the sweeps over
    layers and the overrides of one layer among several)."""
    return MappingProxyType(dict(tiny, n_layers=3))


@pytest.fixture(scope="session")
def tiny_hf():
    """The tiny model as transformers' Qwen3Config fields (what a Hugging Face folder of it holds)."""
    return MappingProxyType(dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, head_dim=8))


@pytest.fixture(scope="session")
def tiny_model(tiny):
    """tiny_model(**fields) -> the tiny model with those ModelConfig fields changed (its gate, say), its weights
    seeded with 0, in eval mode."""
    from minigate import ModelConfig, Transformer

    def make(**fields):
        torch.manual_seed(0)
        return Transformer(ModelConfig(**{**tiny, **fields})).eval()

    return make


@pytest.fixture(scope="session")
def tokens():
    """tokens(n=2, t=10, vocab=50, seed=0) -> (n, t) seeded random token ids below `vocab`; t=None: a flat stream of
    n ids."""
    def make(n: int = 2, t: int | None = 10, vocab: int = 50, seed: int = 0) -> torch.Tensor:
        shape = (n,) if t is None else (n, t)
        return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed))

    return make


@pytest.fixture(scope="session")
def prose():
    """The 75 held-out WikiText-2 windows of 512 tokens the shipped models are measured on (measure.prose_windows),
    read once per test process."""
    from minigate import data, measure

    return measure.prose_windows(data.DEFAULT_TOKENIZER)


@pytest.fixture(scope="session")
def free_port():
    """free_port() -> a local TCP port nothing listens on now."""
    def pick() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    return pick


@pytest.fixture(scope="session")
def ci_args():
    """`minigate train` flags of a quiet one-thread run of the ci preset's headwise model (add --out and --steps)."""
    return ("--preset", "ci", "--variant", "headwise", "--quiet", "--threads", "1")


@pytest.fixture(scope="session")
def token_split():
    """token_split(n=3000, n_val=500, seed=0) -> (train, val): flat streams of n and n_val seeded random token ids in
    1..63, the data of a tiny training run (test_train.py; tests/gpu asks for 20_000 and 2_000)."""
    def make(n: int = 3000, n_val: int = 500, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(seed)
        return torch.randint(1, 64, (n,), generator=g), torch.randint(1, 64, (n_val,), generator=g)

    return make


@pytest.fixture(scope="session")
def train_cfg():
    """train_cfg(**fields) -> the TrainConfig of a tiny CPU run (6 steps of 4 x 16 tokens, lr 1e-2 after 2 warmup
    steps, 2 validation batches every 3 steps, no checkpoints) with those fields changed (tests/gpu: CUDA_RUN's)."""
    from minigate.presets import TrainConfig

    base = dict(steps=6, batch_size=4, seq_len=16, warmup_steps=2, lr=1e-2, eval_every=3, eval_batches=2,
                ckpt_every=0, device="cpu")

    def make(**fields):
        return TrainConfig(**{**base, **fields})

    return make


@pytest.fixture(scope="session")
def measurement():
    """measurement(excess, m_act, loss, sink_heads=4) -> the measure.Measurement of a 16-head model with that excess
    F-Attn, M-Act, validation loss and sink heads at T=64 (its other numbers None): a row of ratios and bars."""
    from minigate import measure

    def make(excess: float, m_act: float, loss: float, sink_heads: int = 4):
        return measure.Measurement.from_record({"f_attn_excess": excess, "m_act": m_act, "val_loss_code": loss,
                                                "heads": 16, "sink_heads_64": sink_heads,
                                                "sink_rate_64": sink_heads / 16})

    return make


@pytest.fixture
def close_figures():
    """Closes every matplotlib figure once the test ends (pytestmark = pytest.mark.usefixtures("close_figures"))."""
    yield
    import matplotlib.pyplot as plt

    plt.close("all")
