"""What a run keeps: its History, and checkpoint.pt, written atomically and verified when read.

checkpoint.pt holds all it takes to resume: model, optimizer, grad scaler, step, RNG states (torch, the data
sampler, python `random`, CUDA), model config, train config, history, and a SHA-256 of the weights.
`check_checkpoint` is the pre-flight check of a run folder: train() runs it once per run, before it writes anything.
"""

from __future__ import annotations

import hashlib
import json
import random
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from .config import ModelConfig
from .presets import MATH_FIELDS, TrainConfig
from .runfolder import atomic_write


@dataclass
class History:
    """Everything measured during a run, as lists that plot directly: plt.plot(h.step, h.loss)."""

    step: list = field(default_factory=list)  # optimizer step, 1-based
    lr: list = field(default_factory=list)  # learning rate used at that step
    loss: list = field(default_factory=list)  # train loss (mean over the step's micro-batches)
    grad_norm: list = field(default_factory=list)  # global gradient norm, before clipping
    tokens_per_s: list = field(default_factory=list)  # training throughput of that step
    aux_loss: list = field(default_factory=list)  # MoE models: the load-balancing loss of each step (else empty)
    eval_step: list = field(default_factory=list)  # steps at which the validation loss was measured
    val_loss: list = field(default_factory=list)  # validation loss (mean per token)
    spikes: list = field(default_factory=list)  # steps counted as loss spikes (see TrainConfig.spike_factor)
    metrics: list = field(default_factory=list)  # the callback's dicts, each with its "step"
    info: dict = field(default_factory=dict)  # about the run: corpus, Python version, stop reason, ...

    def metric(self, name: str) -> tuple[list, list]:
        """(steps, values) of one callback metric, ready to plot."""
        rows = [m for m in self.metrics if name in m]
        return [m["step"] for m in rows], [m[name] for m in rows]

    def add_step(self, step: int, lr: float, loss: float, grad_norm: float, tokens_per_s: float,
                 aux_loss: float | None = None):
        """The numbers of one optimizer step (aux_loss: an MoE model's load-balancing loss)."""
        self.step.append(step)
        self.lr.append(lr)
        self.loss.append(loss)
        self.grad_norm.append(grad_norm)
        self.tokens_per_s.append(tokens_per_s)
        if aux_loss is not None:
            self.aux_loss.append(aux_loss)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> History:
        """From to_dict's dict (a history.json)."""
        return cls(**d)


# -- checkpoints ---------------------------------------------------------------------------------------
class CheckpointError(ValueError):
    """checkpoint.pt cannot be used: damaged (truncated, flipped bytes) or not a checkpoint at all."""


def train_seconds(history: dict, run_json: dict) -> float:
    """Seconds a run's steps took, evaluations and checkpoints left out: each step's tokens over its tokens/s, from
    history.json's `tokens_per_s` and run.json's train section (tokens per step, TrainConfig.tokens_per_step)."""
    t = run_json["train"]
    tokens = t["batch_size"] * t["seq_len"] * t.get("grad_accum", 1)  # a run.json may predate grad_accum
    return sum(tokens / r for r in history["tokens_per_s"])


def weights_digest(tensors: dict) -> str:
    """SHA-256 over the names and bytes of a state dict's tensors: a flipped byte anywhere changes it."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().to("cpu").contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def save_checkpoint(path: Path, model, opt, scaler, step: int, data_rng: torch.Tensor, train_cfg: TrainConfig,
                    history: History):
    weights = model.state_dict()
    state = {
        "step": step, "model": weights, "weights_sha256": weights_digest(weights), "optimizer": opt.state_dict(),
        "scaler": scaler.state_dict(),
        "rng": {"data": data_rng, "torch": torch.get_rng_state(), "python": random.getstate(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []},
        "model_config": model.cfg.to_dict(), "train_config": asdict(train_cfg), "history": history.to_dict(),
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


def check_checkpoint(out_dir, model_cfg: ModelConfig, resume: bool) -> dict | None:
    """The checkpoint a run into `out_dir` resumes from (None: it starts afresh), checked before anything is
    written: FileExistsError if there is one and resume is False, CheckpointError if it is damaged, ValueError
    if it was trained with another model config. Nothing in the folder is touched."""
    path = Path(out_dir) / "checkpoint.pt"
    if not path.exists():
        return None
    if not resume:
        raise FileExistsError(f"{out_dir} already has a checkpoint; add --resume to continue it (resume=True in "
                              "Python), or pick another --out")
    ckpt = load_checkpoint(path)
    diff = config_diff(ckpt, model_cfg)
    if diff:
        raise ValueError(f"{path} was trained with another model config, {{field: (checkpoint, requested)}} = "
                         f"{diff}; resume with the checkpoint's config: without those --set flags, or build the "
                         "model with it (nothing was changed)")
    return ckpt


def restore(ckpt: dict, model, opt, scaler, gen: torch.Generator, train_cfg: TrainConfig) -> History:
    """Load a checkpoint (from check_checkpoint) into the model, optimizer, scaler, data sampler and RNGs;
    a warning if train_cfg changes numbers the checkpoint's run was trained with. Returns its history."""
    old = TrainConfig(**ckpt["train_config"])
    changed = [f for f in MATH_FIELDS if getattr(old, f) != getattr(train_cfg, f)]
    if changed:
        warnings.warn("resuming with a changed " + ", ".join(f"{f} ({getattr(old, f)} -> {getattr(train_cfg, f)})"
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


def ckpt_step(path) -> int:
    """The step a checkpoint file was written at."""
    return load_checkpoint(Path(path))["step"]
