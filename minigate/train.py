"""Training: AdamW, warmup + cosine, clipping, accumulation, mixed precision, resumable checkpoints.

    from minigate import Transformer
    from minigate.presets import PRESETS, model_config
    from minigate.train import train
    p = PRESETS["ci"]
    model = Transformer(model_config("ci", variant="headwise"))
    history = train(model, train_tokens, val_tokens, p.train, out_dir="runs/ci-headwise")
    plt.plot(history.step, history.loss); plt.plot(history.eval_step, history.val_loss)

With `out_dir`, train() owns the run folder for the whole run and does each thing once: it checks that the
folder can be written, locks it (runfolder.RunLock), removes temp files an interrupted write left, checks the
checkpoint it resumes from, writes run.json (the `run_json` dict, if given), trains, and writes model/.
What `out_dir` holds:
    checkpoint.pt   all it takes to resume: model, optimizer, grad scaler, step, RNG states (torch, the
                    data sampler, python `random`, CUDA), model config, train config, history.
                    Written atomically (temp file + os.replace): a crash mid-write keeps the old one.
    history.json    the history so far (also written at every checkpoint)
    run.json        `run_json`, what `minigate train` records about the run (run.py builds it)
    model/          the final model, config.json + model.safetensors: from_pretrained(out_dir / "model"), and
                    copies of the tokenizer (`tokenizer`) and run.json, so the folder stands on its own

Evaluation is evaluation.py's; the configs and presets are presets.py's; History and checkpoint.pt are
checkpoint.py's. The `minigate train` command builds the configs and data (run.py) and calls train().

Across processes (`torchrun --nproc_per_node N`, distributed.py): when a process group is up, train() wraps the
model in DistributedDataParallel, each rank trains on its rows of every global batch, and only rank 0 evaluates,
calls the callback and writes out_dir; the other ranks read its checkpoint to resume.

Determinism: on CPU, a run stopped at step k (Ctrl-C, or killed after a checkpoint) and resumed with
`resume=True` ends with weights bitwise equal to an uninterrupted run: all randomness comes from the
data sampler's generator, which is checkpointed, and the learning rate is a pure function of the step.
"""

from __future__ import annotations

import ctypes
import functools
import json
import math
import platform
import signal
import sys
import threading
import time
import warnings
from contextlib import nullcontext
from pathlib import Path

import torch
from tqdm.auto import tqdm

from .checkpoint import History, check_checkpoint, ckpt_step, restore, save_checkpoint, save_history
from . import distributed
from .data import check_length, sample_batch
from .evaluation import eval_mode, evaluate, token_cross_entropy
from .model import check_token_ids
from .presets import TrainConfig, check_context
from .pretrained import save_pretrained
from .runfolder import RunLock, atomic_write, check_writable, remove_orphans


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


@functools.cache
def tune_cpu_allocator() -> bool:
    """Make glibc keep freed memory for reuse instead of handing it back to the kernel. A training step frees
    and re-allocates the same large tensors (logits, attention gradients); by default glibc maps each block
    over 128 KB afresh, and the kernel zeroes every new page on first touch: a quarter of a CPU step here
    (`python -m minigate.bench train` measures it). Process-wide and lasting (the process keeps its peak
    heap); Linux with glibc only. train() calls it on CPU. Returns whether the setting is in place."""
    if not (sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_MAX = -1, -2, -4  # mallopt parameters, <malloc.h>
    return all(libc.mallopt(k, v) == 1 for k, v in (  # mallopt returns 1 on success; once per process (cached)
        (M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, 2**31 - 1), (M_TOP_PAD, 64 << 20)))


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW; weight decay only on Linear matrices (not on norm weights, not on the token embedding,
    which the tied models also use as the unembedding)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (decay if p.dim() >= 2 and not name.startswith("embed.") else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, fused=device.type == "cuda")


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
          resume: bool = False, callback=None, progress: bool = True, info: dict | None = None,
          run_json: dict | None = None, tokenizer=None, on_start=None) -> History:
    """Train `model` on the token stream `train_data` (1-d ids), evaluating on `val_data`.

    callback(step, model, history) runs every cfg.callback_every steps, in eval mode without gradients,
    and may return a dict of numbers to store in history.metrics. With out_dir: the run folder of the module
    docstring (checkpoints, history.json, run.json from `run_json`, and the final model in out_dir/model with
    a copy of `tokenizer`, a tokenizer.json path); resume=True continues from out_dir/checkpoint.pt. Every
    input is checked before the folder is touched; on_start() is called once the folder is locked and checked,
    before the first step. Raises TrainingDiverged on a non-finite loss, keeping the last checkpoint. Ctrl-C
    (SIGINT) or SIGTERM lets the current step finish, writes a checkpoint, then raises `Interrupted` (a
    KeyboardInterrupt). While it runs, out_dir is locked: a second run into it is refused.
    """
    with _DeferStop() as stop:  # from the start: a Ctrl-C during setup also stops cleanly after a step
        trainer = Trainer(model, train_data, val_data, cfg, callback, info)  # checks the inputs; writes nothing
        if out_dir is None:
            if on_start is not None:
                on_start()
            return trainer.run(progress, stop)
        out_dir = Path(out_dir)
        if not trainer.ranks.main:  # rank 0 checks, locks and writes the folder; the others resume from what it read
            if not distributed.rank_zero_says(trainer.ranks):
                raise distributed.RankZeroStopped("rank 0 could not start the run; its error says why")
            trainer.resume_from(out_dir, check_checkpoint(out_dir, model.cfg, resume), resume, write=False)
            return trainer.run(progress=False, stop=stop)
        started = False
        try:
            with RunLock(check_writable(out_dir)):
                removed = remove_orphans(out_dir)
                if removed:
                    tqdm.write(f"removed {len(removed)} temp file(s) left by an interrupted write in {out_dir}")
                trainer.resume_from(out_dir, check_checkpoint(out_dir, model.cfg, resume), resume)
                if run_json is not None:  # written once every check passed; --resume reads it back
                    _write_json(out_dir / "run.json", run_json)
                started = distributed.rank_zero_says(trainer.ranks)  # the other ranks may read the checkpoint now
                if on_start is not None:
                    on_start()
                history = trainer.run(progress, stop)
                _save_model(out_dir / "model", model, tokenizer, run_json)
        except BaseException:
            if not started:  # a check failed: the other ranks stop too, instead of waiting
                distributed.rank_zero_says(trainer.ranks, ok=False)
            raise
        return history


def _save_model(folder: Path, model, tokenizer, run_json: dict | None):
    """All of model/: config.json and model.safetensors, the tokenizer, and run.json."""
    save_pretrained(model, folder, tokenizer=tokenizer)
    if run_json is not None:
        _write_json(folder / "run.json", run_json)


def _write_json(path: Path, d: dict):
    atomic_write(path, lambda f: f.write(json.dumps(d, indent=2).encode()))


class Trainer:
    """One run of train(): checks the inputs and builds the optimizer, resumes from a run folder's checkpoint
    (resume_from), then steps (run). `self.step` is the last completed step and `self.data_rng` the data
    sampler's state after it: what a checkpoint saves."""

    def __init__(self, model, train_data, val_data, cfg: TrainConfig, callback=None, info: dict | None = None):
        self.ranks = ranks = distributed.current()
        distributed.check_batch(cfg.batch_size, ranks)
        device = pick_device(cfg.device)
        if ranks.world > 1 and device.type == "cuda":  # one GPU per process
            device = torch.device("cuda", ranks.local)
        self.device = device
        self.amp_dtype, use_scaler = pick_precision(cfg.precision, device)
        check_length(train_data, cfg.seq_len, "training")
        check_length(val_data, cfg.seq_len, "validation")
        check_token_ids(train_data, model.cfg.vocab_size, "the training data")
        check_token_ids(val_data, model.cfg.vocab_size, "the validation data")
        check_context(model.cfg, cfg)
        self.model, self.train_data, self.val_data, self.cfg, self.callback = model, train_data, val_data, cfg, callback
        if device.type == "cpu":
            tune_cpu_allocator()
        model.to(device).train()
        self.opt = make_optimizer(model, cfg, device)
        self.scaler = torch.amp.GradScaler(device.type, enabled=use_scaler)
        self.gen = torch.Generator().manual_seed(cfg.seed)
        versions = {"python": sys.version.split()[0], "torch": str(torch.__version__), "processes": ranks.world}
        self.history, self.step = History(info={**(info or {}), **versions}), 0
        self.out_dir = self.ckpt_path = None
        self.data_rng = self.gen.get_state()
        compile_ = cfg.compile is True or (cfg.compile == "auto" and device.type == "cuda")
        self.ddp = None
        if ranks.world > 1:  # averages the gradients over the ranks; an MoE expert may get no rows on one rank
            self.ddp = torch.nn.parallel.DistributedDataParallel(
                model, device_ids=[device.index] if device.type == "cuda" else None,
                find_unused_parameters=model.cfg.n_experts > 0)
        self.forward = _CompiledOrEager(self.ddp or model) if compile_ else (self.ddp or model)
        self.last_save = time.monotonic()

    def resume_from(self, out_dir: Path, ckpt: dict | None, resume: bool, write: bool = True):
        """Checkpoint into out_dir from now on (write=False: only read it, as ranks other than 0 do), continuing
        `ckpt` (checkpoint.check_checkpoint's) if there is one."""
        if write:
            self.out_dir, self.ckpt_path = out_dir, out_dir / "checkpoint.pt"
        if ckpt is not None:
            self.history, self.step = restore(ckpt, self.model, self.opt, self.scaler, self.gen, self.cfg), ckpt["step"]
            self.data_rng = self.gen.get_state()
            before = self.history.info.get("processes", 1)
            if before != self.ranks.world and write:
                warnings.warn(f"resuming on {self.ranks.world} process(es) a run checkpointed on {before}: it follows "
                              "the uninterrupted run's curve to float tolerance, not bitwise", stacklevel=3)
            self.history.info["processes"] = self.ranks.world
            if write:
                tqdm.write(f"resuming {out_dir} at step {self.step}/{self.cfg.steps}")
        elif resume and write:
            tqdm.write(f"no checkpoint in {out_dir}; starting from step 0")

    def run(self, progress: bool = True, stop: _DeferStop | None = None) -> History:
        """Step to cfg.steps, checkpointing as configured and at the end."""
        cfg, history = self.cfg, self.history
        pbar = tqdm(total=cfg.steps, initial=self.step, disable=not (progress and self.ranks.main), desc="train",
                    dynamic_ncols=True)
        try:
            for step in range(self.step + 1, cfg.steps + 1):
                lr, loss, grad_norm, tok_s, aux = self.train_step(step)
                if is_spike(loss, history.loss, cfg):
                    history.spikes.append(step)
                history.add_step(step, lr, loss, grad_norm, tok_s, aux)
                self.track(step)
                if step < cfg.steps and (self.due(cfg.ckpt_every, step) or self.clock_due()):
                    self.checkpoint()
                pbar.update(1)
                val = f"{history.val_loss[-1]:.3f}" if history.val_loss else "-"
                pbar.set_postfix(loss=f"{loss:.3f}", val=val, tok_s=f"{tok_s:,.0f}", refresh=False)
                if distributed.any_rank(stop is not None and stop.requested is not None, self.ranks, self.device):
                    raise Interrupted((stop and stop.requested) or signal.SIGTERM)  # every rank, after this step
        except KeyboardInterrupt as e:
            self.checkpoint()
            where = f"checkpoint {self.ckpt_path}" if self.ckpt_path is not None else "nothing (no out_dir was given)"
            if self.ranks.main:
                tqdm.write(f"interrupted after step {self.step}: saved {where}; continue with resume=True (--resume)")
            if isinstance(e, Interrupted):
                raise
            raise Interrupted((stop and stop.requested) or signal.SIGINT) from None
        finally:
            pbar.close()
        self.checkpoint()
        return history
    def train_step(self, step: int) -> tuple[float, float, float, float, float | None]:
        """One optimizer update over grad_accum micro-batches: (lr, mean loss, gradient norm, tokens/s, the MoE
        load-balancing loss or None). An MoE model minimises loss + router_aux_loss_coef * its aux_loss."""
        cfg, opt, scaler = self.cfg, self.opt, self.scaler
        lr = lr_at(step, cfg)
        for g in opt.param_groups:
            g["lr"] = lr
        moe = self.model.cfg.n_experts > 0
        t0, loss_sum, aux_sum = time.perf_counter(), 0.0, 0.0
        for i in range(cfg.grad_accum):
            x, y = sample_batch(self.train_data, cfg.batch_size, cfg.seq_len, cfg.bos_id, self.gen)  # global batch
            x, y = distributed.my_rows(x, self.ranks), distributed.my_rows(y, self.ranks)  # this rank's rows
            sync = self.ddp is None or i == cfg.grad_accum - 1  # DDP averages the gradients once, at the last
            with nullcontext() if sync else self.ddp.no_sync():
                with torch.autocast(self.device.type, self.amp_dtype) if self.amp_dtype else nullcontext():
                    loss = token_cross_entropy(self.forward(x.to(self.device)), y.to(self.device))
                    aux = self.model.aux_loss if moe else None  # set by that forward
                scaler.scale((loss + cfg.router_aux_loss_coef * aux if moe else loss) / cfg.grad_accum).backward()
            loss_sum += loss.item()
            aux_sum += aux.item() if moe else 0.0
        loss = distributed.mean(loss_sum / cfg.grad_accum, self.ranks, self.device)  # the global batch's loss
        scaler.unscale_(opt)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip or math.inf).item()
        if not math.isfinite(loss) or not (math.isfinite(grad_norm) or scaler.is_enabled()):
            raise self.diverged(step, f"loss {loss}" if not math.isfinite(loss) else f"gradient norm {grad_norm}")
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        self.step, self.data_rng = step, self.gen.get_state()
        tok_s = cfg.batch_size * cfg.seq_len * cfg.grad_accum / (time.perf_counter() - t0)
        aux = distributed.mean(aux_sum / cfg.grad_accum, self.ranks, self.device) if moe else None
        return lr, loss, grad_norm, tok_s, aux

    def track(self, step: int):
        """The validation loss every eval_every steps, the callback's metrics every callback_every steps (rank 0)."""
        cfg, history = self.cfg, self.history
        if not self.ranks.main:
            return
        if self.due(cfg.eval_every, step):
            history.eval_step.append(step)
            history.val_loss.append(evaluate(self.model, self.val_data, cfg.seq_len, cfg.batch_size, cfg.bos_id,
                                             cfg.eval_batches, self.amp_dtype))
        if self.callback is not None and self.due(cfg.callback_every or cfg.eval_every, step):
            with eval_mode(self.model), torch.no_grad():
                metrics = self.callback(step, self.model, history)
            if metrics:
                history.metrics.append({"step": step, **metrics})

    def due(self, every: int, step: int) -> bool:
        return step == self.cfg.steps or (every > 0 and step % every == 0)

    def clock_due(self) -> bool:
        return self.cfg.ckpt_minutes > 0 and time.monotonic() - self.last_save >= 60 * self.cfg.ckpt_minutes

    def checkpoint(self):
        if self.ckpt_path is not None:
            save_checkpoint(self.ckpt_path, self.model, self.opt, self.scaler, self.step, self.data_rng, self.cfg,
                            self.history)
            self.last_save = time.monotonic()

    def diverged(self, step: int, what: str) -> TrainingDiverged:
        """The error for a non-finite loss or gradient at `step`, after writing the history so far."""
        path = self.ckpt_path
        kept = (f"the last checkpoint ({path}, step {ckpt_step(path)}) was kept" if path is not None and path.exists()
                else "no checkpoint was written")
        self.history.info["stopped"] = f"non-finite {what} at step {step}"
        if self.out_dir is not None:
            save_history(self.out_dir / "history.json", self.history)
        err = TrainingDiverged(f"training stopped: {what} at step {step}; {kept}. Try a lower lr, a smaller "
                               "grad_clip, more warmup or precision='fp32' (resuming with the same config would "
                               "diverge again).")
        err.history = self.history
        return err
