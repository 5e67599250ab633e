"""Lesson 07's checks: the 1B models' size, and a T4 time budget from FLOPs (T4_PEAK comes from
minigate.hardware; `python -m minigate.bench ablation` projects with it too)."""

from __future__ import annotations

from collections.abc import Callable

from ...hardware import T4_PEAK  # FLOP/s, a T4's fp16 tensor cores
from .engine import check

EXERCISES = ("param_count", "t4_minutes")  # its check cells, in the lesson's order


def reference_param_count(cfg):
    """Parameters of a model in the released checkpoints' format (Qwen3 blocks, no gate or a G1 gate inside
    q_proj; no sandwich norm, no gate bias), from its ModelConfig alone."""
    return _param_count(cfg)


def _param_count(cfg, *, kv="kv", gate="granularity", lm_head="if untied", norms="all", mlp=3, head_dim="cfg"):
    """Explicit count with switches for the typical mistakes."""
    d, H, V = cfg.d_model, cfg.n_heads, cfg.vocab_size
    D = cfg.head_dim if head_dim == "cfg" else d // H
    K = cfg.n_kv_heads if kv == "kv" else H
    gate_rows = 0
    if cfg.gate != "none" and gate != "ignored":
        per_head = cfg.head_dim if cfg.gate_granularity == "elementwise" else 1
        if gate == "swapped":
            per_head = 1 if cfg.gate_granularity == "elementwise" else cfg.head_dim
        gate_rows = H * per_head
    attention = d * (H * D + gate_rows) + 2 * d * K * D + H * D * d  # q_proj (with gate rows), k_proj, v_proj, o_proj
    block_norms = {"all": 2 * d + (2 * D if cfg.qk_norm else 0), "no qk": 2 * d, "none": 0}[norms]
    block = attention + mlp * d * cfg.d_ff + block_norms
    head = {"if untied": 0 if cfg.tie_embeddings else V * d, "always": V * d, "never": 0}[lm_head]
    return V * d + cfg.n_layers * block + (d if norms != "none" else 0) + head


def _paper_1b_configs():
    """The three released 1B models' ModelConfigs, from the architecture in docs (official-checkpoints.md):
    28 layers, hidden 2048, 16 query heads and 8 kv heads of 128, SwiGLU 6144 (5504 reported for the
    parameter-matched elementwise model), vocab 152064, tied embeddings, QK-norm."""
    from ...config import ModelConfig

    base = dict(vocab_size=152064, d_model=2048, n_layers=28, n_heads=16, n_kv_heads=8, head_dim=128, d_ff=6144,
                qk_norm=True, tie_embeddings=True, max_seq_len=4096)
    return {"baseline": ModelConfig(**base),
            "headwise": ModelConfig(**base, gate="G1", gate_granularity="headwise"),
            "elementwise": ModelConfig(**{**base, "d_ff": 5504}, gate="G1", gate_granularity="elementwise")}


def param_count(fn: Callable) -> Callable:
    """fn(cfg: ModelConfig) -> number of parameters (an int) of the model that config describes."""
    from ...config import ModelConfig

    paper = _paper_1b_configs()
    small = [ModelConfig(vocab_size=300, d_model=64, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=32, d_ff=96,
                         qk_norm=False, tie_embeddings=False, gate="G1", gate_granularity="headwise"),
             ModelConfig(vocab_size=500, d_model=48, n_layers=2, n_heads=6, n_kv_heads=6, head_dim=16, d_ff=80,
                         gate="G1", gate_granularity="elementwise")]
    cases = [(f"the 1B {name} model", (cfg,)) for name, cfg in paper.items()]
    cases += [("3 layers, GQA 4/2, head_dim 32 != 64/4, untied, no QK-norm, headwise", (small[0],)),
              ("2 layers, 6 heads of 16 != 48/6, tied, elementwise", (small[1],))]
    mistakes = [
        (lambda c: _param_count(c, kv="heads"),
         "k_proj and v_proj have n_kv_heads * head_dim rows each (GQA: 8 kv heads for 16 query heads), "
         "not n_heads * head_dim"),
        (lambda c: _param_count(c, gate="ignored"),
         "the G1 gate lives in extra rows of q_proj: n_heads more (headwise) or n_heads * head_dim more "
         "(elementwise) per layer; check cfg.gate and cfg.gate_granularity"),
        (lambda c: _param_count(c, gate="swapped"),
         "headwise means one gate row per head, elementwise one per head dimension (head_dim rows per head)"),
        (lambda c: _param_count(c, lm_head="always"),
         "with tied embeddings (cfg.tie_embeddings) the unembedding *is* the embedding matrix: count it once"),
        (lambda c: _param_count(c, lm_head="never"),
         "an untied model (cfg.tie_embeddings False) has its own lm_head, vocab_size x d_model"),
        (lambda c: _param_count(c, norms="none"),
         "count the RMSNorm weights too: 2 per block (d_model each), the final norm, and q_norm / k_norm "
         "(head_dim each) when cfg.qk_norm"),
        (lambda c: _param_count(c, norms="no qk"),
         "with cfg.qk_norm each block also has q_norm and k_norm, head_dim weights each"),
        (lambda c: _param_count(c, mlp=2),
         "the SwiGLU MLP has three matrices: gate_proj and up_proj (d_ff x d_model) and down_proj"),
        (lambda c: _param_count(c, head_dim="d/H"),
         "use cfg.head_dim: a head's width need not be d_model / n_heads"),
    ]
    return check("param_count", fn, reference_param_count, cases, mistakes, atol=0, rtol=0)


def reference_t4_minutes(params, n_layers, n_heads, head_dim, n_chunks, chunk_len, n_passes, utilisation):
    """Projected minutes on a T4 for n_passes forward passes over n_chunks x chunk_len tokens: 2 FLOPs per
    parameter per token plus causal attention (q.k and pattern.v, 2 FLOPs per multiply-add, chunk_len / 2
    keys per query on average), at `utilisation` x the T4's fp16 peak (T4_PEAK, 65 TFLOP/s)."""
    return _t4_minutes(params, n_layers, n_heads, head_dim, n_chunks, chunk_len, n_passes, utilisation)


def _t4_minutes(params, n_layers, n_heads, head_dim, n_chunks, chunk_len, n_passes, utilisation, *,
                per_param=2, per_mac=2, matmuls=2, keys="causal", attention=True, unit=60, rate="peak x u",
                passes=True):
    n_keys = chunk_len / 2 if keys == "causal" else chunk_len
    attn = per_mac * matmuls * n_layers * n_heads * head_dim * n_keys if attention else 0
    flops = (n_passes if passes else 1) * n_chunks * chunk_len * (per_param * params * per_mac / 2 + attn)
    speed = T4_PEAK * utilisation if rate == "peak x u" else T4_PEAK / utilisation
    return flops / speed / unit


def t4_minutes(fn: Callable) -> Callable:
    """fn(params, n_layers, n_heads, head_dim, n_chunks, chunk_len, n_passes, utilisation) -> projected minutes."""
    paper = (1.7e9, 28, 16, 128, 50, 512)
    cases = [("the 1B ablation set: 117 passes of 50 x 512 at 35%", (*paper, 117, 0.35)),
             ("the 1B model, 3 passes of 20 x 1024 at 15%", (1.7e9, 28, 16, 128, 20, 1024, 3, 0.15)),
             ("a tiny text model, 36 passes of 16 x 256 at 5%", (1.38e6, 4, 8, 16, 16, 256, 36, 0.05))]
    mistakes = [
        (lambda *a: _t4_minutes(*a, unit=1), "return minutes: the seconds divided by 60"),
        (lambda *a: _t4_minutes(*a, unit=3600), "return minutes, not hours"),
        (lambda *a: _t4_minutes(*a, rate="peak / u"),
         "the T4 delivers utilisation x its peak: divide the FLOPs by T4_PEAK * utilisation"),
        (lambda *a: _t4_minutes(*a, passes=False),
         "every pass (one per condition) runs the model over all the chunks again: multiply by n_passes"),
        (lambda *a: _t4_minutes(*a, per_param=6),
         "forward passes only: 2 FLOPs per parameter per token (6 counts the backward pass of training too)"),
        (lambda *a: _t4_minutes(*a, per_mac=1), "a multiply-add is 2 FLOPs: 2 per parameter per token"),
        (lambda *a: _t4_minutes(*a, attention=False),
         "add the attention: per token and layer, 2 x 2 x n_heads x head_dim FLOPs per key (q.k and pattern.v), "
         "over chunk_len / 2 keys"),
        (lambda *a: _t4_minutes(*a, keys="all"),
         "attention is causal: a query sees chunk_len / 2 keys on average, not chunk_len"),
        (lambda *a: _t4_minutes(*a, matmuls=1), "attention has two matmuls per head: q.k (scores) and pattern.v"),
    ]
    return check("t4_minutes", fn, reference_t4_minutes, cases, mistakes, atol=0, rtol=1e-9)
