"""ModelConfig: every architectural choice of a minigate model, in one flat dataclass.

The same config describes the tiny models we train on a CPU and the paper's released 1B
checkpoints (`from_hf_config` reads their `config.json`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from functools import partial

GATE_POSITIONS = ("none", "G1", "G2", "G3", "G4", "G5")
# G1: on the SDPA output, before o_proj (the paper's choice)  G2: on the values  G3: on the keys
# G4: on the queries  G5: on the attention block's output, after o_proj
GATE_GRANULARITIES = ("headwise", "elementwise")
GATE_ACTIVATIONS = ("sigmoid", "silu")
GATE_MODES = ("multiplicative", "additive")

# config.json of a model transformers has no class for (gated, sandwich norms, no QK-norm): a model_type and an
# architecture no transformers class claims, so transformers fails loudly instead of re-initialising the gate
MINIGATE_MODEL_TYPE = "minigate"
MINIGATE_ARCHITECTURE = "MinigateForCausalLM"
MINIGATE_NOTE = ("a minigate model that no transformers class computes: load it with minigate.from_pretrained(folder); "
                 "an elementwise G1 model exports to Qwen3NextForCausalLM with minigate.export_qwen3_next")


class ConfigError(ValueError):
    """A config field holds a value it cannot take; `.field` names the field (the message starts with it)."""

    def __init__(self, message: str, field: str):
        super().__init__(message)
        self.field = field


def is_int(x) -> bool:
    """A whole number, not a bool (True is an int in Python, never a layer count)."""
    return isinstance(x, int) and not isinstance(x, bool)


def is_number(x) -> bool:
    """A finite real number (int or float, not a bool, not NaN or infinite)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def check_field(cfg, ok: bool, field: str, msg: str):
    """Unless ok: a ConfigError naming the config's class, the field and its value, then `msg` (what it must be)."""
    if not ok:
        raise ConfigError(f"{type(cfg).__name__}.{field}={getattr(cfg, field)!r}: {msg}", field)


# Hugging Face's Qwen3 name of each size -> the ModelConfig field: config.json both ways, Qwen3-Next's export, the
# transformers twin of the benchmarks
HF_SIZES = {"vocab_size": "vocab_size", "hidden_size": "d_model", "num_hidden_layers": "n_layers",
            "num_attention_heads": "n_heads", "num_key_value_heads": "n_kv_heads", "head_dim": "head_dim",
            "intermediate_size": "d_ff", "rms_norm_eps": "norm_eps", "tie_word_embeddings": "tie_embeddings",
            "max_position_embeddings": "max_seq_len"}


@dataclass
class ModelConfig:
    vocab_size: int = 4096  # number of token ids
    d_model: int = 128  # width of the residual stream
    n_layers: int = 4  # number of transformer blocks
    n_heads: int = 4  # query heads per layer
    n_kv_heads: int = 4  # key/value heads (GQA when < n_heads; must divide n_heads)
    head_dim: int = 32  # width of one head, TransformerLens' d_head (comments and hooks say d_head); need not be
    #                     d_model / n_heads; even, for RoPE
    d_ff: int = 384  # hidden width of the SwiGLU MLP
    n_experts: int = 0  # mixture-of-experts feed-forward (moe.py): number of experts; 0: the dense SwiGLU MLP
    n_experts_per_token: int = 2  # MoE: how many experts each token goes to (top-k)
    d_expert: int = 0  # MoE: hidden width of one expert (transformers' moe_intermediate_size); 0: d_ff
    norm_topk_prob: bool = True  # MoE: rescale the k chosen experts' router probabilities to sum to 1
    rope_theta: float = 10000.0  # RoPE base frequency
    norm_eps: float = 1e-6  # epsilon of every RMSNorm
    qk_norm: bool = True  # RMSNorm over d_head on q and k (per head, before RoPE), as in Qwen3
    tie_embeddings: bool = True  # unembedding shares the token-embedding matrix
    sandwich_norm: bool = False  # extra RMSNorm on each block's attention and MLP output
    max_seq_len: int = 512  # context length the model is trained for (RoPE extrapolates past it)
    gate: str = "none"  # gate position: one of GATE_POSITIONS
    gate_granularity: str = "elementwise"  # "headwise": one gate score per head; "elementwise": one per d_head
    gate_head_specific: bool = True  # False: one gate projection (one score) shared by all heads
    gate_activation: str = "sigmoid"  # "sigmoid" or "silu", applied to the gate logits
    gate_mode: str = "multiplicative"  # "multiplicative": y * act(s); "additive": y + act(s)
    gate_layers: int = 0  # gate only the first this many layers (0: every layer); later layers are ungated
    gate_bias: float = 0.0  # a learnable bias on the gate logits, initialised to this value (0: no bias, as in
    #                         the paper; -2.0 starts a sigmoid gate near 0.12, the paper's trained mean)

    def __post_init__(self):
        check = partial(check_field, self)

        for f in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "d_ff", "max_seq_len"):
            check(is_int(getattr(self, f)) and getattr(self, f) > 0, f, "must be a positive integer")
        for f in ("n_experts", "d_expert"):
            check(is_int(getattr(self, f)) and getattr(self, f) >= 0, f, "must be a whole number >= 0 (0: off)")
        check(is_int(self.n_experts_per_token) and (self.n_experts == 0 or 1 <= self.n_experts_per_token
                                                    <= self.n_experts), "n_experts_per_token",
              f"must be between 1 and n_experts={self.n_experts}")
        for f in ("rope_theta", "norm_eps"):
            check(is_number(getattr(self, f)) and getattr(self, f) > 0, f, "must be a finite number > 0")
        check(is_number(self.gate_bias), "gate_bias", "must be a finite number (0: no bias)")
        for f in ("qk_norm", "tie_embeddings", "sandwich_norm", "gate_head_specific", "norm_topk_prob"):
            check(isinstance(getattr(self, f), bool), f, "must be True or False")
        check(self.n_heads % self.n_kv_heads == 0, "n_kv_heads",
              f"n_heads={self.n_heads} must be divisible by n_kv_heads; allowed values are the divisors "
              f"of n_heads: {[d for d in range(1, self.n_heads + 1) if self.n_heads % d == 0]}")
        check(self.head_dim % 2 == 0, "head_dim", "RoPE rotates pairs of dimensions, so head_dim must be even")
        check(self.gate in GATE_POSITIONS, "gate", f"unknown gate position; allowed: {GATE_POSITIONS}")
        check(self.gate_granularity in GATE_GRANULARITIES, "gate_granularity", f"allowed: {GATE_GRANULARITIES}")
        check(self.gate_activation in GATE_ACTIVATIONS, "gate_activation", f"allowed: {GATE_ACTIVATIONS}")
        check(self.gate_mode in GATE_MODES, "gate_mode", f"allowed: {GATE_MODES}")
        check(not (self.gate == "G5" and self.gate_granularity == "headwise"), "gate_granularity",
              "G5 gates the output of o_proj, which has no heads; use gate_granularity='elementwise' with G5")
        check(not (self.gate == "G5" and not self.gate_head_specific), "gate_head_specific",
              "G5 has no heads to share a gate between; use gate_head_specific=True with G5")
        check(is_int(self.gate_layers) and 0 <= self.gate_layers <= self.n_layers, "gate_layers",
              f"must be between 0 (every layer) and n_layers={self.n_layers}")
        check(self.gate != "none" or (self.gate_layers == 0 and self.gate_bias == 0), "gate",
              "gate_layers and gate_bias need a gate; set gate='G1' (or another position)")

    def describe_gate(self) -> str:
        """A short name of the gate: "none", "G1 headwise", "G5 elementwise", "G1 elementwise silu additive"."""
        if self.gate == "none":
            return "none"
        extra = [x for x, default in ((self.gate_activation, "sigmoid"), (self.gate_mode, "multiplicative"))
                 if x != default]
        shared = [] if self.gate_head_specific else ["head-shared"]
        return " ".join([self.gate, self.gate_granularity, *shared, *extra])

    def layer_config(self, layer: int) -> "ModelConfig":
        """The config of block `layer`: ungated past gate_layers, else this config."""
        if self.gate_layers and layer >= self.gate_layers:
            return replace(self, gate="none", gate_layers=0, gate_bias=0.0)
        return self

    def is_gated(self, layer: int) -> bool:
        return self.layer_config(layer).gate != "none"

    # -- derived sizes ---------------------------------------------------------------------------------
    @property
    def group_size(self) -> int:
        """Query heads per key/value head."""
        return self.n_heads // self.n_kv_heads

    @property
    def expert_width(self) -> int:
        """Hidden width of one MoE expert: d_expert, or d_ff when d_expert is 0."""
        return self.d_expert or self.d_ff

    @property
    def released_g1(self) -> bool:
        """The released checkpoints' gate: G1, head-specific, sigmoid, multiplicative, no gate bias."""
        # its weights are extra rows of q_proj; attention.Attention computes it (and no gate), every other gate
        # is a study gate, attention.GatePositionAttention's
        return (self.gate == "G1" and self.gate_head_specific and self.gate_activation == "sigmoid"
                and self.gate_mode == "multiplicative" and not self.gate_bias)

    @property
    def n_gate_heads(self) -> int:
        """How many heads the gate acts on: kv heads for G2/G3, query heads otherwise."""
        return self.n_kv_heads if self.gate in ("G2", "G3") else self.n_heads

    @property
    def gate_width_per_head(self) -> int:
        """Gate scores per head: 1 (headwise) or head_dim (elementwise)."""
        return 1 if self.gate_granularity == "headwise" else self.head_dim

    # -- official config.json keys ---------------------------------------------------------------------
    def hf_sizes(self) -> dict:
        """The sizes under Hugging Face's Qwen3 names (HF_SIZES): what config.json, Qwen3-Next's and transformers'
        Qwen3Config share."""
        return {hf: getattr(self, name) for hf, name in HF_SIZES.items()}

    def to_hf_config(self) -> dict:
        """The config.json of the official checkpoints (Qwen3 keys), plus minigate's own gate keys."""
        official_gate = self.released_g1 and not self.gate_layers  # the official flags say: released G1, every layer
        # transformers' Qwen3ForCausalLM computes exactly a plain model (no gate, QK-norm, no sandwich norms); for any
        # other it would drop or re-initialise weights (the gate rows of q_proj, sandwich norms) without a word, so
        # those declare a model_type that no transformers class claims: AutoConfig/AutoModelForCausalLM refuse them.
        plain = self.gate == "none" and self.qk_norm and not self.sandwich_norm
        qwen3 = ("Qwen3MoeForCausalLM", "qwen3_moe") if self.n_experts else ("Qwen3ForCausalLM", "qwen3")
        moe = {"num_experts": self.n_experts, "num_experts_per_tok": self.n_experts_per_token,
               "moe_intermediate_size": self.expert_width, "norm_topk_prob": self.norm_topk_prob,
               "decoder_sparse_step": 1, "mlp_only_layers": []} if self.n_experts else {}
        d = {
            "architectures": [qwen3[0] if plain else MINIGATE_ARCHITECTURE],
            "model_type": qwen3[1] if plain else MINIGATE_MODEL_TYPE,
            **self.hf_sizes(),
            **moe,
            "rope_theta": self.rope_theta,
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},  # transformers 5.x
            "use_qk_norm": self.qk_norm,
            "hidden_act": "silu",
            "attention_bias": False,
            "headwise_attn_output_gate": official_gate and self.gate_granularity == "headwise",
            "elementwise_attn_output_gate": official_gate and self.gate_granularity == "elementwise",
            **({} if plain else {"minigate_note": MINIGATE_NOTE}),
            "minigate": {f: getattr(self, f) for f in ("sandwich_norm", "gate", "gate_granularity",
                                                       "gate_head_specific", "gate_activation", "gate_mode",
                                                       "gate_layers", "gate_bias")},
        }
        return d

    @classmethod
    def from_hf_config(cls, d: dict) -> "ModelConfig":
        """Read an official (or minigate-written) config.json dict."""
        # attention_bias / qkv_bias are ignored: the released configs disagree on them, the authors say no
        # bias is used, and a checkpoint that does hold bias tensors fails to load with their names.
        if d.get("model_type") == "qwen3_next":  # its norms hold w - 1 and its q_proj interleaves [q_h | gate_h]
            raise ValueError("this is a Qwen3-Next folder (minigate.export_qwen3_next writes them for transformers): "
                             "load it with transformers.Qwen3NextForCausalLM, or load the minigate folder it came from")
        required = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
        if missing := [k for k in required if k not in d]:
            raise ValueError(f"config.json lacks the key {missing[0]!r}; is this a Qwen3-style config?")
        d = {"num_key_value_heads": d["num_attention_heads"], "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
             "max_position_embeddings": 2048, **d}  # the defaults of keys a config may leave out
        d["head_dim"] = d.get("head_dim") or d["hidden_size"] // d["num_attention_heads"]
        kw = {name: d[hf] for hf, name in HF_SIZES.items()}
        kw.update(rope_theta=float(d.get("rope_theta", 10000.0)), qk_norm=d.get("use_qk_norm", True))
        n_experts = d.get("num_experts") or d.get("num_local_experts") or 0  # Qwen3-MoE (saved as the latter)
        if n_experts:
            if d.get("decoder_sparse_step", 1) != 1 or d.get("mlp_only_layers"):
                raise ValueError("config.json mixes dense and MoE layers (decoder_sparse_step / mlp_only_layers); "
                                 "minigate makes every layer's feed-forward MoE")
            kw.update(n_experts=n_experts, n_experts_per_token=d.get("num_experts_per_tok", 2),
                      d_expert=d.get("moe_intermediate_size", kw["d_ff"]),
                      norm_topk_prob=d.get("norm_topk_prob", False))  # transformers' default
        rope = d.get("rope_parameters") or d.get("rope_scaling") or {}  # transformers 5.x / 4.x spelling
        if rope.get("rope_type", rope.get("type", "default")) != "default":
            raise ValueError(f"config.json asks for RoPE scaling {rope}; minigate implements plain RoPE only")
        if "rope_theta" not in d and "rope_theta" in rope:
            kw["rope_theta"] = float(rope["rope_theta"])
        if "minigate" in d:
            allowed = {f.name for f in fields(cls)} - set(kw)
            unknown = sorted(set(d["minigate"]) - allowed)
            if unknown:
                raise ValueError(f"config.json: unknown key(s) {unknown} under \"minigate\"; allowed: "
                                 f"{sorted(allowed)} (written by a newer minigate? upgrade, or remove the key)")
            kw.update(d["minigate"])
        elif d.get("headwise_attn_output_gate") or d.get("elementwise_attn_output_gate"):
            kw.update(gate="G1", gate_granularity="headwise" if d.get("headwise_attn_output_gate") else "elementwise")
        return cls(**kw)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ModelConfig":
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown ModelConfig fields {sorted(unknown)}; allowed: {sorted(known)}")
        return cls(**d)
