"""What a run is, with no torch import: TrainConfig, and the presets `minigate train --preset` offers.

    from minigate.presets import PRESETS, model_config
    p = PRESETS["ci"]
    model_cfg, train_cfg = model_config("ci", variant="headwise"), p.train

What each preset has shown is logged in docs/experiments.md (the research log), not here.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial

from .config import ModelConfig, check_field, is_int, is_number


@dataclass
class TrainConfig:
    steps: int = 1000  # optimizer updates in the run (also the length of the lr schedule)
    batch_size: int = 16  # sequences per micro-batch
    seq_len: int = 128  # tokens per sequence, <bos> included
    grad_accum: int = 1  # micro-batches per update: tokens per update = batch_size * seq_len * grad_accum
    lr: float = 3e-3  # peak learning rate, reached at the last warmup step
    min_lr_ratio: float = 0.1  # the schedule ends at lr * min_lr_ratio at the last step (1.0: constant lr)
    schedule: str = "cosine"  # after warmup: "cosine" down to the end, or "wsd" (warmup-stable-decay): constant,
    #                           then linear down over the last decay_frac of the steps
    decay_frac: float = 0.2  # "wsd" only: the share of all steps spent decaying
    warmup_steps: int = 100  # linear warmup: step s (1-based) of the warmup uses lr * s / warmup_steps
    weight_decay: float = 0.1  # AdamW decay on the matrices of Linear layers; none on norms or the embedding
    betas: tuple = (0.9, 0.95)  # AdamW (beta1, beta2)
    grad_clip: float = 1.0  # clip the global gradient norm to this value; 0 turns clipping off
    eval_every: int = 100  # measure the validation loss every this many steps, and at the last step
    eval_batches: int = 20  # validation batches per evaluation; 0: the whole validation set
    callback_every: int = 0  # call `callback` every this many steps (and at the last); 0: same as eval_every
    ckpt_every: int = 100  # write checkpoint.pt every this many steps (needs out_dir); 0: only at the end
    ckpt_minutes: float = 0.0  # also write one when this many minutes passed since the last; 0: off
    bos_id: int = 0  # token id put first in every sequence (<bos> is 0 in minigate's tokenizer)
    seed: int = 0  # seeds the data sampler (seed the model's init yourself, before building it)
    device: str = "auto"  # "auto": cuda, then mps, then cpu; or a torch device string like "cuda:1"
    precision: str = "auto"  # "fp32", "bf16" (autocast), "fp16" (autocast + GradScaler, CUDA only) or
    #                          "auto": bf16 on GPUs that have it (Ampere+), fp16 on older ones (T4), bf16 on CPUs
    #                          with native bf16 (AVX512-BF16, AMX), else fp32 (hardware.pick_precision)
    compile: bool | str = False  # torch.compile the training forward: True, False, or "auto" (on CUDA only);
    #                              slow first steps; if compiling fails, training goes on without it (a warning)
    spike_factor: float = 1.5  # a step is a loss spike if its loss > spike_factor * running mean, where
    spike_window: int = 50  # running mean = mean train loss of the previous spike_window steps (once full)
    router_aux_loss_coef: float = 0.001  # MoE models: weight of the load-balancing loss (the forward returns it,
    #                                      moe.py) added to the training loss, as Qwen3-MoE's default; 0: off

    @property
    def tokens_per_step(self) -> int:
        """Tokens per optimizer update, <bos> included: batch_size * seq_len * grad_accum."""
        return self.batch_size * self.seq_len * self.grad_accum

    def __post_init__(self):
        self.betas = tuple(self.betas) if isinstance(self.betas, (list, tuple)) else self.betas  # JSON: a list
        check = partial(check_field, self)

        for f in ("steps", "batch_size", "seq_len", "grad_accum", "eval_every", "spike_window"):
            check(is_int(getattr(self, f)) and getattr(self, f) > 0, f, "must be a positive integer")
        for f in ("eval_batches", "callback_every", "ckpt_every", "bos_id", "seed"):
            check(is_int(getattr(self, f)) and getattr(self, f) >= 0, f, "must be an integer >= 0")
        check(is_number(self.lr) and self.lr > 0, "lr", "must be a finite number > 0")
        check(is_number(self.min_lr_ratio) and 0 <= self.min_lr_ratio <= 1, "min_lr_ratio", "must be between 0 and 1")
        for f in ("weight_decay", "grad_clip", "ckpt_minutes", "router_aux_loss_coef"):
            check(is_number(getattr(self, f)) and getattr(self, f) >= 0, f, "must be a finite number >= 0 (0: off)")
        check(is_number(self.spike_factor) and self.spike_factor > 0, "spike_factor", "must be a finite number > 0")
        check(isinstance(self.betas, tuple) and len(self.betas) == 2
              and all(is_number(b) and 0 <= b < 1 for b in self.betas), "betas",
              "must be two numbers in [0, 1), e.g. (0.9, 0.95) (on the command line: --set betas=0.9,0.95)")
        check(is_int(self.warmup_steps) and 0 <= self.warmup_steps < self.steps, "warmup_steps",
              f"must be >= 0 and less than steps={self.steps}")
        check(self.schedule in ("cosine", "wsd"), "schedule", "use cosine or wsd")
        check(is_number(self.decay_frac) and 0 < self.decay_frac <= 1, "decay_frac", "must be in (0, 1]")
        check(self.precision in ("auto", "fp32", "bf16", "fp16"), "precision", "use auto, fp32, bf16 or fp16")
        check(isinstance(self.compile, bool) or self.compile == "auto", "compile", "must be True, False or 'auto'")
        check(isinstance(self.device, str) and bool(self.device), "device", "use auto, cpu, cuda, cuda:1 or mps")


# fields that change the numbers; resuming with other values cannot reproduce an uninterrupted run
MATH_FIELDS = ("steps", "batch_size", "seq_len", "grad_accum", "lr", "min_lr_ratio", "schedule", "decay_frac",
                "warmup_steps", "weight_decay", "betas", "grad_clip", "bos_id", "seed", "precision")


@dataclass
class Preset:
    about: str  # what it is for and how long it takes
    corpus: str  # a corpus name for data.load_documents
    model: dict  # ModelConfig fields (the gate is chosen separately, see model_config)
    train: TrainConfig
    probe: str = ""  # corpus whose held-out windows the CLI's sink tracker measures ("": the validation split)


# precision="fp32" in the presets the lessons and tests train on a CPU (ci, copy, induction) and in text: "auto" would
# train in bf16 on a CPU with native bf16 (hardware.pick_precision), and the lessons' stored outputs, the tests' exact
# comparisons and the shipped text-* and copy-* checkpoints are fp32 runs, the same on every CPU.

# the copy-task model and schedule, shared by the copy and induction presets
_COPY_MODEL = dict(vocab_size=130, d_model=64, n_layers=2, n_heads=4, n_kv_heads=4, head_dim=16, d_ff=256,
                   max_seq_len=64)
_COPY_TRAIN = TrainConfig(steps=5000, batch_size=32, seq_len=64, lr=3e-3, warmup_steps=100, eval_every=250,
                          eval_batches=0, ckpt_every=500, ckpt_minutes=5, precision="fp32")
# the code model and recipe, shared by the code and code-moe presets
_CODE_MODEL = dict(vocab_size=4096, d_model=128, n_layers=4, n_heads=4, n_kv_heads=4, head_dim=32, d_ff=384,
                   max_seq_len=512)
_CODE_TRAIN = TrainConfig(steps=4000, batch_size=8, seq_len=512, lr=3e-3, warmup_steps=100, schedule="wsd",
                          weight_decay=0.1, eval_every=250, eval_batches=10, ckpt_every=500, ckpt_minutes=5)

PRESETS: dict[str, Preset] = {
    # ~0.37M parameters; 300 steps x 2k tokens; about a minute on 2 CPU cores (data loading included)
    "ci": Preset(
        about="tests and CI: 2 CPU cores, about a minute per model", corpus="wikitext-2",
        model=dict(vocab_size=4096, d_model=64, n_layers=2, n_heads=4, n_kv_heads=4, head_dim=16, d_ff=192,
                   max_seq_len=128),
        train=TrainConfig(steps=300, batch_size=16, seq_len=128, lr=3e-3, warmup_steps=30, eval_every=100,
                          eval_batches=10, ckpt_every=100, precision="fp32")),
    # ~0.1M parameters; the marked copy task (data.copy_task); 5000 steps x 2k tokens, about 5 minutes on 2 CPU cores
    "copy": Preset(
        about="the course's sink demonstration: the marked copy task, ~5 minutes on 2 CPU cores",
        corpus="copy", model=_COPY_MODEL, train=_COPY_TRAIN),
    # ~0.14M parameters; the variable-length induction copy with no <bos> (data.induction_task), what it shows:
    # docs/experiments.md section 11; 15000 steps x 2k tokens, about 9 minutes on 2 CPU cores
    "induction": Preset(
        about="the sink demonstration without <bos>: the induction copy, ~9 minutes on 2 CPU cores",
        corpus="induction",  # the copy preset with 16 first-token ids more, trained three times as long
        model=dict(_COPY_MODEL, vocab_size=146), train=replace(_COPY_TRAIN, steps=15000)),
    # ~1.3M parameters; the course's natural-text checkpoints (data/checkpoints/text-*): python-stdlib +
    # WikiText-2, 1500 steps x 4k tokens, about 15 minutes per model on 2 CPU cores
    "text": Preset(
        about="the earlier natural-text checkpoints (text-*, lesson 08): ~15 minutes per model on 2 CPU cores",
        corpus="python-stdlib+wikitext-2",
        model=dict(vocab_size=4096, d_model=128, n_layers=4, n_heads=8, n_kv_heads=8, head_dim=16, d_ff=384,
                   max_seq_len=256),
        train=TrainConfig(steps=1500, batch_size=16, seq_len=256, lr=2e-3, warmup_steps=150, eval_every=250,
                          eval_batches=20, ckpt_every=250, ckpt_minutes=5, precision="fp32")),
    # ~1.38M parameters; the natural-data recipe for 2 CPU cores: seq_len 512 on python-code, 4000 steps x 4k tokens
    # (16M tokens, about a third of a pass); lr constant after warmup, then a linear decay over the last 20% (wsd);
    # precision "auto": bf16 on a CPU with native bf16, 22-47 minutes per model alone on 2 cores, else fp32 with
    # train()'s tuned allocator, 37-66 minutes (the first seeds' runs); about 90 minutes in fp32 at one thread beside
    # a second training on 2 AVX2 cores (the pinned seeds). The pilots that chose it and what it grows:
    # docs/experiments.md sections 13-14 and 17
    "code": Preset(
        about="the natural-data recipe for 2 CPU cores (the code-* checkpoints): 22-66 min per model alone, ~90 "
              "beside a second training",
        corpus="python-code", probe="wikitext-2", model=_CODE_MODEL, train=_CODE_TRAIN),
    # ~3.2M parameters (1.4M active per token); the code recipe with a mixture-of-experts feed-forward, as the
    # paper's headline models are MoE (15B-A2.5B): 8 experts of width 192, 2 per token, so each token runs the dense
    # model's 384 FFN units; Qwen3-MoE's balance loss at 0.001. About 40-45 minutes per model on 2 CPU cores
    "code-moe": Preset(
        about="the code recipe with an MoE feed-forward (8 experts, 2 per token; lesson 08): ~40-45 min per model",
        corpus="python-code", probe="wikitext-2",
        model=dict(_CODE_MODEL, n_experts=8, n_experts_per_token=2, d_expert=192), train=replace(_CODE_TRAIN)),
    # ~6.2M parameters; the natural-data recipe for a GPU (docs/gpu.md): seq_len 512 on python-code, read about
    # once. Measured on an H100 (bf16, no compile): 31 ms/step, about 1.5 minutes per model; on an H200, 265 s for the
    # three models of lesson 03's GROW (docs/gpu.md). A T4 is a projection,
    # not a measurement: 4-15 minutes per model (fp16; 1/4 to 1/10 of the H100's step rate)
    "code-gpu": Preset(
        about="the natural-data demonstration on a GPU: ~1.5 min per model on an H100, a T4 projected at 4-15 min",
        corpus="python-code", probe="wikitext-2",
        model=dict(vocab_size=4096, d_model=256, n_layers=6, n_heads=8, n_kv_heads=8, head_dim=32, d_ff=768,
                   max_seq_len=512),
        train=TrainConfig(steps=3000, batch_size=32, seq_len=512, lr=3e-3, warmup_steps=300, weight_decay=0.1,
                          eval_every=250, eval_batches=20, ckpt_every=500, ckpt_minutes=5, compile="auto")),
}
# a run's variant (`minigate train --variant`): the ModelConfig gate fields of the baseline and the two G1 gates
VARIANTS = {"none": dict(gate="none"), "headwise": dict(gate="G1", gate_granularity="headwise"),
            "elementwise": dict(gate="G1", gate_granularity="elementwise")}
GATED = ("headwise", "elementwise")  # the gated variants, in the order tables and figures show them
# each variant's name where a person reads it: a shipped model's folder (code-baseline), a run folder of lesson 03's
# GROW switch (runs/code-seed0/baseline), a figure's legend and colour (plots.COLORS), a table's row
NAMES = {"none": "baseline", "headwise": "headwise", "elementwise": "elementwise"}


def model_config(preset: str, variant: str = "none") -> ModelConfig:
    """The ModelConfig of a preset in one variant: "none" (baseline), "headwise" or "elementwise" (G1)."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose from {sorted(PRESETS)}")
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; choose from {sorted(VARIANTS)}")
    return ModelConfig(**PRESETS[preset].model, **VARIANTS[variant])


def check_seq_len(model_cfg: ModelConfig, what: str, seq_len: int, fix: str):
    """A ValueError if sequences of `seq_len` tokens (named `what` in the message) are longer than the context the
    model is built for, max_seq_len; `fix` says what to do instead."""
    if seq_len > model_cfg.max_seq_len:
        raise ValueError(f"{what}={seq_len} is longer than the model's max_seq_len={model_cfg.max_seq_len}; {fix}")


def check_context(model_cfg: ModelConfig, train_cfg: TrainConfig):
    """A ValueError if the training sequences are longer than the context the model is built for."""
    seq_len = train_cfg.seq_len
    check_seq_len(model_cfg, "TrainConfig.seq_len", seq_len, f"train at seq_len <= {model_cfg.max_seq_len}, or build "
                  f"the model with max_seq_len >= {seq_len} (--set max_seq_len={seq_len})")
