"""Training: AdamW, warmup + cosine, clipping, accumulation, mixed precision, resumable checkpoints.

    from minigate import Transformer
    from minigate.train import PRESETS, model_config, train
    p = PRESETS["ci"]
    model = Transformer(model_config("ci", gate="headwise"))
    history = train(model, train_tokens, val_tokens, p.train, out_dir="runs/ci-headwise")
    plt.plot(history.step, history.loss); plt.plot(history.eval_step, history.val_loss)

What `out_dir` holds:
    checkpoint.pt   all it takes to resume: model, optimizer, grad scaler, step, RNG states (torch, the
                    data sampler, python `random`, CUDA), model config, train config, history.
                    Written atomically (temp file + os.replace): a crash mid-write keeps the old one.
    history.json    the history so far (also written at every checkpoint)
    model/          the final model, config.json + model.safetensors: from_pretrained(out_dir / "model")

Determinism: on CPU, a run stopped at step k (Ctrl-C, or killed after a checkpoint) and resumed with
`resume=True` ends with weights bitwise equal to an uninterrupted run: all randomness comes from the
data sampler's generator, which is checkpointed, and the learning rate is a pure function of the step.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import math
import platform
import random
import signal
import sys
import threading
import time
import warnings
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from einops import rearrange
from tqdm.auto import tqdm

from .config import ModelConfig, is_int, is_number
from .data import check_length, eval_batches, sample_batch
from .model import check_token_ids
from .pretrained import atomic_write, save_pretrained
from .runfolder import RunLock, check_writable, remove_orphans


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
    #                          "auto": bf16 on GPUs that have it (Ampere+), fp16 on older ones (T4), else fp32
    compile: bool | str = False  # torch.compile the training forward: True, False, or "auto" (on CUDA only);
    #                              slow first steps; if compiling fails, training goes on without it (a warning)
    spike_factor: float = 1.5  # a step is a loss spike if its loss > spike_factor * running mean, where
    spike_window: int = 50  # running mean = mean train loss of the previous spike_window steps (once full)

    def __post_init__(self):
        self.betas = tuple(self.betas) if isinstance(self.betas, (list, tuple)) else self.betas  # JSON: a list

        def check(ok: bool, f: str, msg: str):
            if not ok:
                raise ValueError(f"TrainConfig.{f}={getattr(self, f)!r}: {msg}")

        for f in ("steps", "batch_size", "seq_len", "grad_accum", "eval_every", "spike_window"):
            check(is_int(getattr(self, f)) and getattr(self, f) > 0, f, "must be a positive integer")
        for f in ("eval_batches", "callback_every", "ckpt_every", "bos_id", "seed"):
            check(is_int(getattr(self, f)) and getattr(self, f) >= 0, f, "must be an integer >= 0")
        check(is_number(self.lr) and self.lr > 0, "lr", "must be a finite number > 0")
        check(is_number(self.min_lr_ratio) and 0 <= self.min_lr_ratio <= 1, "min_lr_ratio", "must be between 0 and 1")
        for f in ("weight_decay", "grad_clip", "ckpt_minutes"):
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
_MATH_FIELDS = ("steps", "batch_size", "seq_len", "grad_accum", "lr", "min_lr_ratio", "schedule", "decay_frac",
                "warmup_steps", "weight_decay", "betas", "grad_clip", "bos_id", "seed", "precision")


@dataclass
class History:
    """Everything measured during a run, as lists that plot directly: plt.plot(h.step, h.loss)."""

    step: list = field(default_factory=list)  # optimizer step, 1-based
    lr: list = field(default_factory=list)  # learning rate used at that step
    loss: list = field(default_factory=list)  # train loss (mean over the step's micro-batches)
    grad_norm: list = field(default_factory=list)  # global gradient norm, before clipping
    tokens_per_s: list = field(default_factory=list)  # training throughput of that step
    eval_step: list = field(default_factory=list)  # steps at which the validation loss was measured
    val_loss: list = field(default_factory=list)  # validation loss (mean per token)
    spikes: list = field(default_factory=list)  # steps counted as loss spikes (see TrainConfig.spike_factor)
    metrics: list = field(default_factory=list)  # the callback's dicts, each with its "step"
    info: dict = field(default_factory=dict)  # about the run: corpus, Python version, stop reason, ...

    def metric(self, name: str) -> tuple[list, list]:
        """(steps, values) of one callback metric, ready to plot."""
        rows = [m for m in self.metrics if name in m]
        return [m["step"] for m in rows], [m[name] for m in rows]

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> History:
        return cls(**d)


class _CompiledOrEager:
    """torch.compile(model), falling back to the model itself (one warning) if the first compiled call fails,
    e.g. on a GPU or platform whose compiler toolchain is missing."""

    def __init__(self, model):
        self.model, self.compiled, self.works = model, torch.compile(model), None

    def __call__(self, x):
        if self.works is False:
            return self.model(x)
        try:
            out = self.compiled(x)
        except Exception as e:
            if self.works:
                raise
            warnings.warn(f"torch.compile failed ({type(e).__name__}: {str(e).strip().splitlines()[0][:200]}); "
                          "training goes on without it", stacklevel=2)
            self.works = False
            return self.model(x)
        self.works = True
        return out


class TrainingDiverged(RuntimeError):
    """The loss (or gradient) became NaN or infinite; `.history` holds the run up to that point."""


# -- pieces that tests and lessons check on their own --------------------------------------------------
def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate of optimizer step `step` (1-based): linear warmup to cfg.lr at step warmup_steps, then
    down to cfg.lr * min_lr_ratio at step cfg.steps: a cosine over all the rest ("cosine"), or constant until
    the last decay_frac of the steps and linear from there ("wsd")."""
    if step <= cfg.warmup_steps:
        return cfg.lr * step / cfg.warmup_steps
    min_lr = cfg.lr * cfg.min_lr_ratio
    if cfg.schedule == "wsd":
        decay_start = max(cfg.warmup_steps, cfg.steps - round(cfg.decay_frac * cfg.steps))
        progress = max(0, step - decay_start) / max(1, cfg.steps - decay_start)  # 0 while stable, then (0, 1]
        return cfg.lr - (cfg.lr - min_lr) * min(progress, 1.0)
    progress = (step - cfg.warmup_steps) / (cfg.steps - cfg.warmup_steps)  # (0, 1]
    return min_lr + (cfg.lr - min_lr) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))


def is_spike(loss: float, previous: list, cfg: TrainConfig) -> bool:
    """Is `loss` a spike: above spike_factor times the mean of the last spike_window earlier losses?"""
    recent = previous[-cfg.spike_window:]
    return len(recent) == cfg.spike_window and loss > cfg.spike_factor * sum(recent) / len(recent)


def pick_device(name: str = "auto") -> torch.device:
    """"auto": cuda, then mps, then cpu; else the named device, checked to exist (a ValueError says why not)."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"device {name!r} is not a torch device; use auto, cpu, cuda, cuda:1 or mps") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r}: torch sees no CUDA GPU here (torch {torch.__version__}); use cpu, or "
                         "auto to take the best device there is")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"device {name!r}: there are only {torch.cuda.device_count()} CUDA devices")
    if device.type == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        raise ValueError(f"device {name!r}: Apple's MPS is not available here; use cpu or auto")
    return device


def pick_precision(precision: str, device: torch.device) -> tuple[torch.dtype | None, bool]:
    """(autocast dtype or None for fp32, whether to use a GradScaler)."""
    if precision == "auto":
        if device.type != "cuda":
            return None, False
        bf16 = torch.cuda.get_device_capability(device)[0] >= 8  # Ampere or newer; a T4 is 7.5
        return (torch.bfloat16, False) if bf16 else (torch.float16, True)
    if precision == "fp16" and device.type != "cuda":
        raise ValueError(f"precision='fp16' needs a CUDA GPU (it relies on a GradScaler); on {device.type} "
                         "use 'bf16' or 'fp32'")
    return {"fp32": (None, False), "bf16": (torch.bfloat16, False), "fp16": (torch.float16, True)}[precision]


_ALLOCATOR = {"tuned": False}


def tune_cpu_allocator() -> bool:
    """Make glibc keep freed memory for reuse instead of handing it back to the kernel. A training step frees
    and re-allocates the same large tensors (logits, attention gradients); by default glibc maps each block
    over 128 KB afresh, and the kernel zeroes every new page on first touch: a quarter of a CPU step here
    (`python -m minigate.bench train` measures it). Process-wide and lasting (the process keeps its peak
    heap); Linux with glibc only. train() calls it on CPU. Returns whether the setting is in place."""
    if not _ALLOCATOR["tuned"] and sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc":
        try:
            libc = ctypes.CDLL("libc.so.6")
        except OSError:
            return False
        M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_MAX = -1, -2, -4  # mallopt parameters, <malloc.h>
        _ALLOCATOR["tuned"] = all(libc.mallopt(k, v) == 1 for k, v in (  # mallopt returns 1 on success
            (M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, 2**31 - 1), (M_TOP_PAD, 64 << 20)))
    return _ALLOCATOR["tuned"]


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW; weight decay only on Linear matrices (not on norm weights, not on the token embedding,
    which the tied models also use as the unembedding)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (decay if p.dim() >= 2 and not name.startswith("embed.") else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, fused=device.type == "cuda")


def token_cross_entropy(logits: torch.Tensor, y: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy of logits (batch, pos, vocab) against targets y (batch, pos), in float32: the mean over
    every token, or with reduction="none" each token's own, (batch, pos). train, evaluate and ablation use it."""
    loss = F.cross_entropy(rearrange(logits.float(), "b t v -> (b t) v"), rearrange(y, "b t -> (b t)"),
                           reduction=reduction)
    return loss if reduction == "mean" else rearrange(loss, "(b t) -> b t", b=y.shape[0])


@contextmanager
def eval_mode(model):
    """Evaluation mode inside the block; the model's own mode (training or not) back after it, errors included."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


@torch.no_grad()
def evaluate(model, tokens: torch.Tensor, seq_len: int, batch_size: int = 16, bos_id: int = 0,
             max_batches: int | None = None, amp_dtype: torch.dtype | None = None) -> float:
    """Mean next-token loss over fixed, non-overlapping windows of `tokens` (see data.eval_batches)."""
    device = next(model.parameters()).device
    total, count = 0.0, 0
    with eval_mode(model):
        for x, y in eval_batches(tokens, batch_size, seq_len, bos_id, max_batches or None):
            with torch.autocast(device.type, amp_dtype) if amp_dtype else nullcontext():
                logits = model(x.to(device))
            total += token_cross_entropy(logits, y.to(device)).item() * y.numel()
            count += y.numel()
    return total / count


# -- checkpoints ---------------------------------------------------------------------------------------
class CheckpointError(ValueError):
    """checkpoint.pt cannot be used: damaged (truncated, flipped bytes) or not a checkpoint at all."""


def weights_digest(tensors: dict) -> str:
    """SHA-256 over the names and bytes of a state dict's tensors: a flipped byte anywhere changes it."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().to("cpu").contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def save_checkpoint(path: Path, model, opt, scaler, step: int, data_rng: torch.Tensor, cfg: TrainConfig,
                    history: History):
    weights = model.state_dict()
    state = {
        "step": step, "model": weights, "weights_sha256": weights_digest(weights), "optimizer": opt.state_dict(),
        "scaler": scaler.state_dict(),
        "rng": {"data": data_rng, "torch": torch.get_rng_state(), "python": random.getstate(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []},
        "model_config": model.cfg.to_dict(), "train_config": asdict(cfg), "history": history.to_dict(),
    }
    atomic_write(path, lambda f: torch.save(state, f))
    save_history(path.with_name("history.json"), history)


def save_history(path: Path, history: History):
    atomic_write(path, lambda f: f.write(json.dumps(history.to_dict()).encode()))


def load_checkpoint(path: Path) -> dict:
    """Read checkpoint.pt and verify its weights against the checksum stored with them; CheckpointError
    (a one-line message naming the file and the cause) if it is damaged."""
    path = Path(path)
    damaged = (f"{path} is damaged and cannot be resumed ({{}}). It was left as it is: move it aside "
               f"(e.g. mv {path} {path}.damaged) to start this folder afresh, or train into another --out")
    size = path.stat().st_size
    if size == 0:
        raise CheckpointError(damaged.format("the file is empty: a write was cut off"))
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(damaged.format(f"{size:,} bytes, truncated or not a checkpoint: {reason}")) from None
    if not isinstance(ckpt, dict) or not {"step", "model", "optimizer"} <= set(ckpt):
        raise CheckpointError(damaged.format("not a minigate checkpoint: it lacks step, model or optimizer"))
    if "weights_sha256" in ckpt and weights_digest(ckpt["model"]) != ckpt["weights_sha256"]:
        raise CheckpointError(damaged.format("its weights do not match the checksum written with them: the file "
                                             "was corrupted on disk or in a copy"))
    return ckpt


def config_diff(ckpt: dict, model_cfg: ModelConfig) -> dict:
    """{field: (checkpoint's value, model_cfg's)} for every ModelConfig field where they differ; a checkpoint
    written before a field existed counts as having its default."""
    saved, mine = type(model_cfg).from_dict(ckpt["model_config"]).to_dict(), model_cfg.to_dict()
    return {k: (v, mine[k]) for k, v in saved.items() if mine[k] != v}


def _restore(ckpt: dict, model, opt, scaler, gen: torch.Generator, cfg: TrainConfig) -> History:
    diff = config_diff(ckpt, model.cfg)
    if diff:
        raise ValueError(f"the checkpoint was trained with another model config, {{field: (checkpoint, "
                         f"yours)}} = {diff}; build the model with the checkpoint's config (the checkpoint was "
                         "left as it is)")
    old = TrainConfig(**ckpt["train_config"])
    changed = [f for f in _MATH_FIELDS if getattr(old, f) != getattr(cfg, f)]
    if changed:
        warnings.warn("resuming with a changed " + ", ".join(f"{f} ({getattr(old, f)} -> {getattr(cfg, f)})"
                                                             for f in changed)
                      + ": the run will not match an uninterrupted one", stacklevel=4)
    model.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["optimizer"])
    if scaler.is_enabled() and ckpt["scaler"]:
        scaler.load_state_dict(ckpt["scaler"])
    gen.set_state(ckpt["rng"]["data"])
    torch.set_rng_state(ckpt["rng"]["torch"])
    random.setstate(ckpt["rng"]["python"])
    if ckpt["rng"]["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(ckpt["rng"]["cuda"])
    return History.from_dict(ckpt["history"])


class Interrupted(KeyboardInterrupt):
    """Training stopped on Ctrl-C (SIGINT) or SIGTERM after writing a checkpoint; `.signum` says which."""

    def __init__(self, signum: int = signal.SIGINT):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class _DeferStop:
    """First Ctrl-C or SIGTERM: finish the current step, then checkpoint and stop. A second one stops at once."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.requested, self.old = None, {}

    def _handler(self, signum, frame):
        if self.requested is not None:
            raise KeyboardInterrupt
        self.requested = signum
        what = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
        tqdm.write(f"{what}: finishing this step, then writing a checkpoint (send it again to stop at once)")

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self.old = {s: signal.signal(s, self._handler) for s in self.SIGNALS}
        return self

    def __exit__(self, *exc):
        for s, old in self.old.items():
            signal.signal(s, old)


# -- the loop ------------------------------------------------------------------------------------------
def train(model, train_data: torch.Tensor, val_data: torch.Tensor, cfg: TrainConfig, out_dir=None,
          resume: bool = False, callback=None, progress: bool = True, info: dict | None = None) -> History:
    """Train `model` on the token stream `train_data` (1-d ids), evaluating on `val_data`.

    callback(step, model, history) runs every cfg.callback_every steps, in eval mode without gradients,
    and may return a dict of numbers to store in history.metrics. With out_dir: checkpoints, history.json
    and the final model in out_dir/model (see the module docstring); resume=True continues from
    out_dir/checkpoint.pt. Raises TrainingDiverged on a non-finite loss, keeping the last checkpoint.
    Ctrl-C (SIGINT) or SIGTERM lets the current step finish, writes a checkpoint, then raises `Interrupted`
    (a KeyboardInterrupt). While it runs, out_dir is locked (runfolder.RunLock): a second run into it is refused.
    """
    with _DeferStop() as stop:  # from the start: a Ctrl-C during setup also stops cleanly after a step
        if out_dir is None:
            return _train(model, train_data, val_data, cfg, None, resume, callback, progress, info, stop)
        with RunLock(check_writable(out_dir)):
            removed = remove_orphans(out_dir)
            if removed:
                tqdm.write(f"removed {len(removed)} temp file(s) left by an interrupted write in {out_dir}")
            return _train(model, train_data, val_data, cfg, out_dir, resume, callback, progress, info, stop)


def _train(model, train_data, val_data, cfg, out_dir, resume, callback, progress, info, stop) -> History:
    device = pick_device(cfg.device)
    amp_dtype, use_scaler = pick_precision(cfg.precision, device)
    check_length(train_data, cfg.seq_len, "training")
    check_length(val_data, cfg.seq_len, "validation")
    check_token_ids(train_data, model.cfg.vocab_size, "the training data")
    check_token_ids(val_data, model.cfg.vocab_size, "the validation data")
    if cfg.seq_len > model.cfg.max_seq_len:
        raise ValueError(f"TrainConfig.seq_len={cfg.seq_len} is longer than the model's max_seq_len="
                         f"{model.cfg.max_seq_len}; train at seq_len <= {model.cfg.max_seq_len}, or build the model "
                         f"with max_seq_len >= {cfg.seq_len}")
    if device.type == "cpu":
        tune_cpu_allocator()
    model.to(device).train()
    opt = make_optimizer(model, cfg, device)
    scaler = torch.amp.GradScaler(device.type, enabled=use_scaler)
    gen = torch.Generator().manual_seed(cfg.seed)
    versions = {"python": sys.version.split()[0], "torch": str(torch.__version__)}
    history, start = History(info={**(info or {}), **versions}), 0
    out_dir = Path(out_dir) if out_dir is not None else None
    ckpt_path = out_dir / "checkpoint.pt" if out_dir is not None else None
    if ckpt_path is not None and ckpt_path.exists():
        if not resume:
            raise FileExistsError(f"{out_dir} already has a checkpoint; pass resume=True (--resume) to "
                                  "continue it, or choose another output folder")
        ckpt = load_checkpoint(ckpt_path)
        history, start = _restore(ckpt, model, opt, scaler, gen, cfg), ckpt["step"]
        tqdm.write(f"resuming {out_dir} at step {start}/{cfg.steps}")
    elif resume:
        tqdm.write(f"no checkpoint in {out_dir}; starting from step 0")
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
    fwd = _CompiledOrEager(model) if cfg.compile is True or (cfg.compile == "auto" and device.type == "cuda") \
        else model
    autocast = (lambda: torch.autocast(device.type, amp_dtype)) if amp_dtype else nullcontext
    tokens_per_step = cfg.batch_size * cfg.seq_len * cfg.grad_accum
    done = {"step": start, "data_rng": gen.get_state()}  # the last completed step: what a checkpoint saves
    last_save = [time.monotonic()]

    def checkpoint():
        if ckpt_path is not None:
            save_checkpoint(ckpt_path, model, opt, scaler, done["step"], done["data_rng"], cfg, history)
            last_save[0] = time.monotonic()

    def clock_due() -> bool:
        return cfg.ckpt_minutes > 0 and time.monotonic() - last_save[0] >= 60 * cfg.ckpt_minutes

    def due(every: int, step: int) -> bool:
        return step == cfg.steps or (every > 0 and step % every == 0)

    pbar = tqdm(total=cfg.steps, initial=start, disable=not progress, desc="train", dynamic_ncols=True)
    try:
        for step in range(start + 1, cfg.steps + 1):
            lr = lr_at(step, cfg)
            for g in opt.param_groups:
                g["lr"] = lr
            t0, loss_sum = time.perf_counter(), 0.0
            for _ in range(cfg.grad_accum):
                x, y = sample_batch(train_data, cfg.batch_size, cfg.seq_len, cfg.bos_id, gen)
                with autocast():
                    loss = token_cross_entropy(fwd(x.to(device)), y.to(device))
                scaler.scale(loss / cfg.grad_accum).backward()
                loss_sum += loss.item()
            loss = loss_sum / cfg.grad_accum
            scaler.unscale_(opt)
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip or math.inf).item()
            if not math.isfinite(loss) or not (math.isfinite(grad_norm) or use_scaler):
                what = f"loss {loss}" if not math.isfinite(loss) else f"gradient norm {grad_norm}"
                kept = (f"the last checkpoint ({ckpt_path}, step {ckpt_step(ckpt_path)}) was kept"
                        if ckpt_path is not None and ckpt_path.exists() else "no checkpoint was written")
                history.info["stopped"] = f"non-finite {what} at step {step}"
                if out_dir is not None:
                    save_history(out_dir / "history.json", history)
                err = TrainingDiverged(f"training stopped: {what} at step {step}; {kept}. Try a lower lr, "
                                       "a smaller grad_clip, more warmup or precision='fp32' (resuming with "
                                       "the same config would diverge again).")
                err.history = history
                raise err
            scaler.step(opt)
            scaler.update()
            opt.zero_grad(set_to_none=True)
            done.update(step=step, data_rng=gen.get_state())
            tok_s = tokens_per_step / (time.perf_counter() - t0)

            if is_spike(loss, history.loss, cfg):
                history.spikes.append(step)
            for name, value in (("step", step), ("lr", lr), ("loss", loss), ("grad_norm", grad_norm),
                                ("tokens_per_s", tok_s)):
                getattr(history, name).append(value)
            if due(cfg.eval_every, step):
                history.eval_step.append(step)
                history.val_loss.append(evaluate(model, val_data, cfg.seq_len, cfg.batch_size, cfg.bos_id,
                                                 cfg.eval_batches, amp_dtype))
            if callback is not None and due(cfg.callback_every or cfg.eval_every, step):
                with eval_mode(model), torch.no_grad():
                    metrics = callback(step, model, history)
                if metrics:
                    history.metrics.append({"step": step, **metrics})
            if step < cfg.steps and (due(cfg.ckpt_every, step) or clock_due()):
                checkpoint()
            pbar.update(1)
            val = f"{history.val_loss[-1]:.3f}" if history.val_loss else "-"
            pbar.set_postfix(loss=f"{loss:.3f}", val=val, tok_s=f"{tok_s:,.0f}", refresh=False)
            if stop.requested is not None:
                raise Interrupted(stop.requested)
    except KeyboardInterrupt as e:
        checkpoint()
        where = f"checkpoint {ckpt_path}" if ckpt_path is not None else "nothing (no out_dir was given)"
        tqdm.write(f"interrupted after step {done['step']}: saved {where}; continue with resume=True "
                   "(--resume)")
        if isinstance(e, Interrupted):
            raise
        raise Interrupted(stop.requested or signal.SIGINT) from None
    finally:
        pbar.close()

    checkpoint()
    if out_dir is not None:
        save_pretrained(model, out_dir / "model")
    return history


def ckpt_step(path) -> int:
    """The step a checkpoint file was written at."""
    return load_checkpoint(Path(path))["step"]


# -- presets -------------------------------------------------------------------------------------------
@dataclass
class Preset:
    about: str  # what it is for and how long it takes
    corpus: str  # a corpus name for data.load_documents
    model: dict  # ModelConfig fields (the gate is chosen separately, see model_config)
    train: TrainConfig
    probe: str = ""  # corpus whose held-out windows the CLI's sink tracker measures ("": the validation split)


# the copy-task model and schedule, shared by the copy and induction presets
_COPY_MODEL = dict(vocab_size=130, d_model=64, n_layers=2, n_heads=4, n_kv_heads=4, head_dim=16, d_ff=256,
                   max_seq_len=64)
_COPY_TRAIN = TrainConfig(steps=5000, batch_size=32, seq_len=64, lr=3e-3, warmup_steps=100, eval_every=250,
                          eval_batches=0, ckpt_every=500, ckpt_minutes=5)

PRESETS: dict[str, Preset] = {
    # ~0.37M parameters; 300 steps x 2k tokens; about a minute on 2 CPU cores (data loading included)
    "ci": Preset(
        about="tests and CI: 2 CPU cores, about a minute per model",
        corpus="wikitext-2",
        model=dict(vocab_size=4096, d_model=64, n_layers=2, n_heads=4, n_kv_heads=4, head_dim=16, d_ff=192,
                   max_seq_len=128),
        train=TrainConfig(steps=300, batch_size=16, seq_len=128, lr=3e-3, warmup_steps=30, eval_every=100,
                          eval_batches=10, ckpt_every=100)),
    # ~0.1M parameters; the marked copy task (data.copy_task), where a baseline grows attention sinks;
    # 5000 steps x 2k tokens, about 5 minutes on 2 CPU cores
    "copy": Preset(
        about="the course's sink demonstration: the marked copy task, ~5 minutes on 2 CPU cores",
        corpus="copy", model=_COPY_MODEL, train=_COPY_TRAIN),
    # ~0.14M parameters; the variable-length induction copy with no <bos> (data.induction_task): baselines
    # tend to grow a sink head on the (random) first token, gated models mostly do not (3 of 4 runs against
    # 1 of 8, docs/experiments.md section 11); 15000 steps x 2k tokens, about 9 minutes on 2 CPU cores
    "induction": Preset(
        about="the sink demonstration without <bos>: the induction copy, ~9 minutes on 2 CPU cores",
        corpus="induction",  # the copy preset with 16 first-token ids more, trained three times as long
        model=dict(_COPY_MODEL, vocab_size=146), train=replace(_COPY_TRAIN, steps=15000)),
    # ~1.3M parameters; the course's natural-text checkpoints (data/checkpoints/text-*): python-stdlib +
    # WikiText-2, 1500 steps x 4k tokens, about 15 minutes per model on 2 CPU cores
    "text": Preset(
        about="the course's natural-text checkpoints: ~15 minutes per model on 2 CPU cores",
        corpus="python-stdlib+wikitext-2",
        model=dict(vocab_size=4096, d_model=128, n_layers=4, n_heads=8, n_kv_heads=8, head_dim=16, d_ff=384,
                   max_seq_len=256),
        train=TrainConfig(steps=1500, batch_size=16, seq_len=256, lr=2e-3, warmup_steps=150, eval_every=250,
                          eval_batches=20, ckpt_every=250, ckpt_minutes=5)),
    # ~6.2M parameters; the GPU recipe that shows the paper's effects on natural data (docs/gpu.md): seq_len 512
    # on python-code, read about once (it replaces the t4 preset, which over-fit its 1.9M tokens). Measured on an
    # H100 (bf16, no compile): 31 ms/step, about 1.5 minutes per model. A T4 is a projection, not a measurement:
    # 4-15 minutes per model (fp16; 1/4 to 1/10 of the H100's step rate)
    "code": Preset(
        about="the natural-data demonstration on a GPU: ~1.5 min per model on an H100, a T4 projected at 4-15 min",
        corpus="python-code", probe="wikitext-2",
        model=dict(vocab_size=4096, d_model=256, n_layers=6, n_heads=8, n_kv_heads=8, head_dim=32, d_ff=768,
                   max_seq_len=512),
        train=TrainConfig(steps=3000, batch_size=32, seq_len=512, lr=3e-3, warmup_steps=300, weight_decay=0.1,
                          eval_every=250, eval_batches=20, ckpt_every=500, ckpt_minutes=5, compile="auto")),
}
GATES = {"none": dict(gate="none"), "headwise": dict(gate="G1", gate_granularity="headwise"),
         "elementwise": dict(gate="G1", gate_granularity="elementwise")}


def model_config(preset: str, gate: str = "none") -> ModelConfig:
    """The ModelConfig of a preset with a gate: "none" (baseline), "headwise" or "elementwise" (G1)."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose from {sorted(PRESETS)}")
    if gate not in GATES:
        raise ValueError(f"unknown gate {gate!r}; choose from {sorted(GATES)}")
    return ModelConfig(**PRESETS[preset].model, **GATES[gate])
