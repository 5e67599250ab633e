"""minigate: gated attention (Qiu et al., 2025) in a small, readable package.

    import minigate
    cfg = minigate.ModelConfig(gate="G1", gate_granularity="headwise")
    model = minigate.Transformer(cfg)
    logits, cache = model.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_gate"))
    cache["gate", 0]   # = cache["blocks.0.attn.hook_gate"], TransformerLens style
"""

from .config import ModelConfig
from .export import export_qwen3_next
from .hooks import ActivationCache, get_act_name
from .model import Transformer
from .pretrained import from_pretrained, save_pretrained, save_tokenizer
from . import resources  # noqa: F401  minigate.resources.DATA_DIR: where the data is (the set-up cell prints it)

__all__ = ["ActivationCache", "ModelConfig", "Transformer", "export_qwen3_next", "from_pretrained", "get_act_name",
           "save_pretrained", "save_tokenizer"]
__version__ = "0.2.0"  # the one place it is written: pyproject.toml reads it ([tool.setuptools.dynamic])
