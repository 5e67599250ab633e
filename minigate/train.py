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

import json
import math
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
from .hardware import CompiledOrEager, pick_device, pick_precision, precision_name, tune_cpu_allocator
from .model import check_token_ids
from .presets import TrainConfig, check_context
from .pretrained import save_pretrained
from .runfolder import RunLock, atomic_write, check_writable, remove_orphans


PROGRESS = (True, "bar", "json", False)  # train(progress=...): tqdm's bar (True or "bar"), JSON lines, nothing
JSON_EVERY_S = 2.0  # progress="json": seconds between two lines (and one at the last step)


class TrainingDiverged(RuntimeError):
    """The loss (or gradient) became NaN or infinite; `.history` holds the run up to that point."""


# -- pieces that tests and lessons check on their own --------------------------------------------------
def lr_at(step: int, train_cfg: TrainConfig) -> float:
    """Learning rate of optimizer step `step` (1-based): linear warmup to train_cfg.lr at step warmup_steps, then
    down to lr * min_lr_ratio at the last step: a cosine over all the rest ("cosine"), or constant until the last
    decay_frac of the steps and linear from there ("wsd")."""
    lr, warmup, steps = train_cfg.lr, train_cfg.warmup_steps, train_cfg.steps
    if step <= warmup:
        return lr * step / warmup
    min_lr = lr * train_cfg.min_lr_ratio
    if train_cfg.schedule == "wsd":
        decay_start = max(warmup, steps - round(train_cfg.decay_frac * steps))
        progress = max(0, step - decay_start) / max(1, steps - decay_start)  # 0 while stable, then (0, 1]
        return lr - (lr - min_lr) * min(progress, 1.0)
    progress = (step - warmup) / (steps - warmup)  # (0, 1]
    return min_lr + (lr - min_lr) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))


def is_spike(loss: float, previous: list, train_cfg: TrainConfig) -> bool:
    """Is `loss` a spike: above spike_factor times the mean of the last spike_window earlier losses?"""
    recent = previous[-train_cfg.spike_window:]
    return len(recent) == train_cfg.spike_window and loss > train_cfg.spike_factor * sum(recent) / len(recent)


def make_optimizer(model: torch.nn.Module, train_cfg: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW; weight decay only on Linear matrices (not on norm weights, not on the token embedding,
    which the tied models also use as the unembedding)."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (decay if p.dim() >= 2 and not name.startswith("embed.") else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": train_cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=train_cfg.lr, betas=train_cfg.betas, fused=device.type == "cuda")


class Interrupted(KeyboardInterrupt):
    """Training stopped on Ctrl-C (SIGINT) or SIGTERM after writing a checkpoint; `.signum` says which."""

    def __init__(self, signum: int = signal.SIGINT):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class _DeferStop:
    """First Ctrl-C or SIGTERM: finish the current step, then checkpoint and stop. A second one stops at once. On
    Windows also CTRL_BREAK (SIGBREAK): what a process group started with CREATE_NEW_PROCESS_GROUP is stopped with."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM) + ((signal.SIGBREAK,) if hasattr(signal, "SIGBREAK") else ())

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
def train(model, train_data: torch.Tensor, val_data: torch.Tensor, train_cfg: TrainConfig, out_dir=None,
          resume: bool = False, callback=None, progress: bool = True, info: dict | None = None,
          run_json: dict | None = None, tokenizer=None, on_start=None) -> History:
    """Train `model` on the token stream `train_data` (1-d ids), evaluating on `val_data`.

    progress: True or "bar", tqdm's bar on stderr; "json", a line of JSON on stdout every JSON_EVERY_S seconds and
    at the last step, {"step": 520, "steps": 4000, "loss": 3.1, "val_loss": 3.2 or null, "tokens_per_s": 5123}, for
    a program to follow (`minigate train --progress json`; lesson 03's GROW reads it); False, nothing.

    callback(step, model, history) runs every train_cfg.callback_every steps, in eval mode without gradients,
    and may return a dict of numbers to store in history.metrics. With out_dir: the run folder of the module
    docstring (checkpoints, history.json, run.json from `run_json` and the precision used, and the final model in
    out_dir/model with a copy of `tokenizer`, a tokenizer.json path); resume=True continues from
    out_dir/checkpoint.pt. Every input is checked before the folder is touched; on_start() is called once the folder
    is locked and checked, before the first step. Raises TrainingDiverged on a non-finite loss, keeping the last
    checkpoint. Ctrl-C (SIGINT) or SIGTERM lets the current step finish, writes a checkpoint, then raises
    `Interrupted` (a KeyboardInterrupt). While it runs, out_dir is locked: a second run into it is refused.
    """
    if progress not in PROGRESS:
        raise ValueError(f"progress={progress!r}: True or 'bar' (a progress bar), 'json' (JSON lines) or False")
    with _DeferStop() as stop:  # from the start: a Ctrl-C during setup also stops cleanly after a step
        trainer = Trainer(model, train_data, val_data, train_cfg, callback, info)  # checks the inputs; writes nothing
        if out_dir is None:
            if on_start is not None:
                on_start()
            return trainer.loop(progress, stop)
        out_dir = Path(out_dir)
        with distributed.rank_zero_first(trainer.ranks) as checked:
            if not trainer.ranks.main:  # rank 0 checked and locked the folder: read the checkpoint it resumes
                trainer.resume(check_checkpoint(out_dir, model.cfg, resume), asked=resume)
                return trainer.loop(progress=False, stop=stop)
            with RunLock(check_writable(out_dir)):
                removed = remove_orphans(out_dir)
                if removed:
                    tqdm.write(f"removed {len(removed)} temp file(s) left by an interrupted write in {out_dir}")
                trainer.keep_folder(out_dir)
                trainer.resume(check_checkpoint(out_dir, model.cfg, resume), asked=resume)
                if run_json is not None:  # written once every check passed; --resume reads it back
                    run_json = dict(run_json, precision_used=trainer.precision)
                    _write_json(out_dir / "run.json", run_json)
                checked()  # the other ranks start now
                if on_start is not None:
                    on_start()
                history = trainer.loop(progress, stop)
                _save_model(out_dir / "model", model, tokenizer, run_json)
        return history


def _save_model(folder: Path, model, tokenizer, run_json: dict | None):
    """All of model/: config.json and model.safetensors, the tokenizer, and run.json."""
    save_pretrained(model, folder, tokenizer=tokenizer)
    if run_json is not None:
        _write_json(folder / "run.json", run_json)


def _write_json(path: Path, d: dict):
    atomic_write(path, lambda f: f.write(json.dumps(d, indent=2).encode()))


class Trainer:
    """One run of train(): checks the inputs, picks the device and precision and builds the optimizer; continues a
    checkpoint (resume), on rank 0 into a run folder (keep_folder); then steps (loop). `self.step` is the last
    completed step and `self.data_rng` the data sampler's state after it: what a checkpoint saves."""

    def __init__(self, model, train_data, val_data, train_cfg: TrainConfig, callback=None, info: dict | None = None):
        self.ranks = ranks = distributed.current()
        distributed.check_batch(train_cfg.batch_size, ranks)
        device = pick_device(train_cfg.device)
        if ranks.world > 1 and device.type == "cuda":  # one GPU per process
            device = torch.device("cuda", ranks.local)
        self.device = device
        self.amp_dtype, use_scaler = pick_precision(train_cfg.precision, device)
        self.precision = precision_name(self.amp_dtype)  # what "auto" chose: recorded in history.json and run.json
        check_length(train_data, train_cfg.seq_len, "training")
        check_length(val_data, train_cfg.seq_len, "validation")
        check_token_ids(train_data, model.cfg.vocab_size, "the training data")
        check_token_ids(val_data, model.cfg.vocab_size, "the validation data")
        check_context(model.cfg, train_cfg)
        self.model, self.train_data, self.val_data, self.callback = model, train_data, val_data, callback
        self.train_cfg = train_cfg
        if device.type == "cpu":
            tune_cpu_allocator()
        model.to(device).train()
        self.opt = make_optimizer(model, train_cfg, device)
        self.scaler = torch.amp.GradScaler(device.type, enabled=use_scaler)
        self.gen = torch.Generator().manual_seed(train_cfg.seed)
        versions = {"python": sys.version.split()[0], "torch": str(torch.__version__), "processes": ranks.world,
                    "precision_used": self.precision}
        self.history, self.step = History(info={**(info or {}), **versions}), 0
        self.out_dir = self.ckpt_path = None
        self.data_rng = self.gen.get_state()
        compile_ = train_cfg.compile is True or (train_cfg.compile == "auto" and device.type == "cuda")
        self.ddp = None
        if ranks.world > 1:  # averages the gradients over the ranks; an MoE expert may get no rows on one rank
            self.ddp = torch.nn.parallel.DistributedDataParallel(
                model, device_ids=[device.index] if device.type == "cuda" else None,
                find_unused_parameters=model.cfg.n_experts > 0)
        self.forward = CompiledOrEager(self.ddp or model) if compile_ else (self.ddp or model)
        self.last_save = time.monotonic()

    def keep_folder(self, out_dir: Path):
        """Rank 0: checkpoint into out_dir from now on."""
        self.out_dir, self.ckpt_path = out_dir, out_dir / "checkpoint.pt"

    def resume(self, ckpt: dict | None, asked: bool = True):
        """Continue `ckpt` (checkpoint.check_checkpoint's; None: start afresh): the weights, optimizer, data sampler,
        random states and history. Rank 0 says which (with a run folder) and warns where the process count or the
        precision used changed: the run then matches an uninterrupted one to float tolerance, not bitwise."""
        if ckpt is None:
            if asked and self.out_dir is not None:
                tqdm.write(f"no checkpoint in {self.out_dir}; starting from step 0")
            return
        self.history = restore(ckpt, self.model, self.opt, self.scaler, self.gen, self.train_cfg)
        self.step, self.data_rng = ckpt["step"], self.gen.get_state()
        info = self.history.info
        processes, precision = info.get("processes", 1), info.get("precision_used", self.precision)
        if self.ranks.main and processes != self.ranks.world:
            warnings.warn(f"resuming on {self.ranks.world} process(es) a run checkpointed on {processes}: it follows "
                          "the uninterrupted run's curve to float tolerance, not bitwise", stacklevel=3)
        if self.ranks.main and precision != self.precision:
            warnings.warn(f"resuming in {self.precision} a run checkpointed in {precision} (precision 'auto' chooses "
                          "by machine): it follows the uninterrupted run's curve to float tolerance, not bitwise",
                          stacklevel=3)
        info.update(processes=self.ranks.world, precision_used=self.precision)
        if self.out_dir is not None:
            tqdm.write(f"resuming {self.out_dir} at step {self.step}/{self.train_cfg.steps}")

    def loop(self, progress: bool | str = True, stop: _DeferStop | None = None) -> History:
        """Step to train_cfg.steps, checkpointing as configured and at the end; `progress` as train()'s."""
        train_cfg, history = self.train_cfg, self.history
        bar = progress in (True, "bar") and self.ranks.main
        pbar = tqdm(total=train_cfg.steps, initial=self.step, disable=not bar, desc="train", dynamic_ncols=True)
        json_lines, said = progress == "json" and self.ranks.main, -math.inf  # said: when the last line was written
        try:
            for step in range(self.step + 1, train_cfg.steps + 1):
                lr, loss, grad_norm, tok_s, aux = self.train_step(step)
                if is_spike(loss, history.loss, train_cfg):
                    history.spikes.append(step)
                history.add_step(step, lr, loss, grad_norm, tok_s, aux)
                self.track(step)
                if step < train_cfg.steps and (self.due(train_cfg.ckpt_every, step) or self.clock_due()):
                    self.checkpoint()
                pbar.update(1)
                val = f"{history.val_loss[-1]:.3f}" if history.val_loss else "-"
                pbar.set_postfix(loss=f"{loss:.3f}", val=val, tok_s=f"{tok_s:,.0f}", refresh=False)
                if json_lines and (step == train_cfg.steps or time.monotonic() - said >= JSON_EVERY_S):
                    print(json.dumps({"step": step, "steps": train_cfg.steps, "loss": round(loss, 4),
                                      "val_loss": round(history.val_loss[-1], 4) if history.val_loss else None,
                                      "tokens_per_s": round(tok_s)}), flush=True)
                    said = time.monotonic()
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
        load-balancing loss or None). An MoE model minimises loss + router_aux_loss_coef * its aux_loss, which its
        forward returns with the logits."""
        train_cfg, opt, scaler = self.train_cfg, self.opt, self.scaler
        lr = lr_at(step, train_cfg)
        for g in opt.param_groups:
            g["lr"] = lr
        moe, accum = self.model.cfg.n_experts > 0, train_cfg.grad_accum
        t0, loss_sum, aux_sum = time.perf_counter(), 0.0, 0.0
        for i in range(accum):
            x, y = sample_batch(self.train_data, train_cfg.batch_size, train_cfg.seq_len, train_cfg.bos_id,
                                self.gen)  # the global batch
            x, y = distributed.my_rows(x, self.ranks), distributed.my_rows(y, self.ranks)  # this rank's rows
            sync = self.ddp is None or i == accum - 1  # DDP averages the gradients once, at the last
            with nullcontext() if sync else self.ddp.no_sync():
                with torch.autocast(self.device.type, self.amp_dtype) if self.amp_dtype else nullcontext():
                    if moe:
                        logits, aux = self.forward(x.to(self.device), return_aux_loss=True)
                    else:
                        logits, aux = self.forward(x.to(self.device)), None
                    loss = token_cross_entropy(logits, y.to(self.device))
                scaler.scale((loss + train_cfg.router_aux_loss_coef * aux if moe else loss) / accum).backward()
            loss_sum += loss.item()
            aux_sum += aux.item() if moe else 0.0
        loss = distributed.mean(loss_sum / accum, self.ranks, self.device)  # the global batch's loss
        scaler.unscale_(opt)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), train_cfg.grad_clip or math.inf).item()
        if not math.isfinite(loss) or not (math.isfinite(grad_norm) or scaler.is_enabled()):
            raise self.diverged(step, f"loss {loss}" if not math.isfinite(loss) else f"gradient norm {grad_norm}")
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        self.step, self.data_rng = step, self.gen.get_state()
        tok_s = train_cfg.tokens_per_step / (time.perf_counter() - t0)
        aux = distributed.mean(aux_sum / accum, self.ranks, self.device) if moe else None
        return lr, loss, grad_norm, tok_s, aux

    def track(self, step: int):
        """The validation loss every eval_every steps, the callback's metrics every callback_every steps (rank 0)."""
        train_cfg, history = self.train_cfg, self.history
        if not self.ranks.main:
            return
        if self.due(train_cfg.eval_every, step):
            history.eval_step.append(step)
            history.val_loss.append(evaluate(self.model, self.val_data, train_cfg.seq_len, train_cfg.batch_size,
                                             train_cfg.bos_id, train_cfg.eval_batches, self.amp_dtype))
        if self.callback is not None and self.due(train_cfg.callback_every or train_cfg.eval_every, step):
            with eval_mode(self.model), torch.no_grad():
                metrics = self.callback(step, self.model, history)
            if metrics:
                history.metrics.append({"step": step, **metrics})

    def due(self, every: int, step: int) -> bool:
        return step == self.train_cfg.steps or (every > 0 and step % every == 0)

    def clock_due(self) -> bool:
        minutes = self.train_cfg.ckpt_minutes
        return minutes > 0 and time.monotonic() - self.last_save >= 60 * minutes

    def checkpoint(self):
        if self.ckpt_path is not None:
            save_checkpoint(self.ckpt_path, self.model, self.opt, self.scaler, self.step, self.data_rng,
                            self.train_cfg, self.history)
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
