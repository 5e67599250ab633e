"""A preset run into a run folder: what `minigate train` does, from its flags to the finished folder.

    run = plan_run("ci", "headwise", "runs/ci-headwise", sets={"lr": "0.01"})  # every check, nothing written
    history = execute(run)                                                     # lock, data, run.json, train()

A run folder holds checkpoint.pt, history.json, run.json (preset, gate, corpus, configs) and model/,
the final model: config.json + model.safetensors (open with minigate.from_pretrained), plus copies
of tokenizer.json and run.json so the folder is self-contained. `--resume` (resume=True) rebuilds the
configs from run.json, so a run continues with exactly the settings it started with.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from . import data
from .analysis import sink_tracker
from .checkpoint import History, check_checkpoint
from .config import ConfigError, ModelConfig
from .model import Transformer
from .presets import GATES, PRESETS, TrainConfig, check_context
from .pretrained import atomic_write, save_tokenizer
from .resources import DATA_DIR
from .runfolder import RunLock, check_writable
from .train import pick_device, pick_precision, train

TASK_ROWS = (40_000, 512)  # rows of a synthetic task (data.TASKS) for training and validation (seeds 1 and 2)


class CouldNotWrite(Exception):
    """Training stopped because the run folder could not be written (e.g. a full disk); `.error` is the OSError.
    The last checkpoint there is intact (every write is atomic)."""

    def __init__(self, error: OSError):
        super().__init__(str(error))
        self.error = error


@dataclass
class PresetRun:
    preset: str  # a name in PRESETS
    gate: str  # a name in GATES: none, headwise, elementwise
    out: Path  # the run folder
    resume: bool  # continue the checkpoint in `out` (with the settings run.json recorded)
    model_cfg: ModelConfig
    cfg: TrainConfig
    overrides: dict  # the --set fields, {name: value as given}
    tokenizer: Path  # tokenizer.json (unused by the synthetic tasks)
    tok: object  # the loaded tokenizer, None for a synthetic task

    @property
    def corpus(self) -> str:
        return PRESETS[self.preset].corpus

    @property
    def resume_command(self) -> str:
        return f"minigate train --preset {self.preset} --gate {self.gate} --out {self.out} --resume"


def load_tokens(corpus: str, tokenizer_path, seq_len: int = 64, vocab_size: int = 130):
    """(tokenizer or None, train ids, validation ids) of a corpus, or of a synthetic task's rows (no tokenizer)."""
    if corpus in data.TASKS:
        return (None, data.task_rows(corpus, TASK_ROWS[0], seq_len, vocab_size, seed=1),
                data.task_rows(corpus, TASK_ROWS[1], seq_len, vocab_size, seed=2))
    tok = data.load_tokenizer(tokenizer_path)
    return (tok, *data.encode_corpus(corpus, tok))


def _shown_path(path: Path) -> str:
    """A path as run.json records it: relative to the course folder when inside it (no path of this machine)."""
    try:
        return Path(path).resolve().relative_to(DATA_DIR.parent.resolve()).as_posix()
    except ValueError:
        return str(path)


def _recorded_run(out: Path, preset: str, gate: str) -> dict:
    """run.json of the run in `out`, checked to be a run of this preset and gate."""
    run_file = out / "run.json"
    try:
        run = json.loads(run_file.read_text())
        recorded = (run["preset"], run["gate"])
    except (ValueError, KeyError) as e:
        raise ValueError(f"{run_file} is not a run.json written by minigate ({e}); it was left as it is") from None
    if recorded != (preset, gate):
        raise ValueError(f"{out} holds a run of --preset {run['preset']} --gate {run['gate']}, "
                         f"not --preset {preset} --gate {gate}; resume it with those flags")
    return run


def _coerce(default, value: str, name: str):
    """Turn the text of --set into the type of the field's current value."""
    if isinstance(default, bool):
        if value.lower() not in ("true", "false", "1", "0"):
            raise ValueError(f"--set {name}={value}: expected true or false")
        return value.lower() in ("true", "1")
    if isinstance(default, tuple):
        return tuple(float(v) for v in value.split(","))
    try:
        return type(default)(value)
    except ValueError:
        kind = {int: "an integer", float: "a number"}.get(type(default), type(default).__name__)
        raise ValueError(f"--set {name}={value}: expected {kind}") from None


def configs(preset: str, gate: str, run: dict | None = None, sets: dict | None = None, steps: int | None = None,
            device: str | None = None, precision: str | None = None) -> tuple[ModelConfig, TrainConfig]:
    """The ModelConfig and TrainConfig of a run: the preset's (or, resuming, what run.json recorded), then every
    --set FIELD=VALUE of `sets` ({field: text}) at once (their order does not matter), then steps, device and
    precision. A ValueError naming the --set flag that is wrong."""
    model_kw = dict(run["model"]) if run else dict(PRESETS[preset].model, **GATES[gate])
    train_kw = dict(run["train"]) if run else dataclasses.asdict(PRESETS[preset].train)
    sets = sets or {}
    model_fields, train_fields = ModelConfig().to_dict(), dataclasses.asdict(TrainConfig())
    for name, value in sets.items():  # a ModelConfig or TrainConfig field
        if name in model_fields:
            model_kw[name] = _coerce(model_fields[name], value, name)
        elif name in train_fields:
            train_kw[name] = _coerce(train_fields[name], value, name)
        else:
            raise ValueError(f"--set {name}=...: no such ModelConfig or TrainConfig field; ModelConfig has "
                             f"{sorted(model_fields)}, TrainConfig has {sorted(train_fields)}")
    if steps is not None:  # a shorter run keeps its warmup within the first 10% of the steps
        train_kw.update(steps=steps, warmup_steps=min(train_kw["warmup_steps"], steps // 10))
    train_kw.update({k: v for k, v in (("device", device), ("precision", precision)) if v})
    try:
        model_cfg, cfg = ModelConfig.from_dict(model_kw), TrainConfig(**train_kw)
    except ConfigError as e:
        flag = f"--set {e.field}={sets[e.field]}: " if e.field in sets else ""
        raise ValueError(f"{flag}{e}") from None
    check_context(model_cfg, cfg)
    return model_cfg, cfg


def plan_run(preset: str, gate: str, out, resume: bool = False, sets: dict | None = None, steps: int | None = None,
             device: str | None = None, precision: str | None = None, tokenizer=None) -> PresetRun:
    """Every check that needs no lock, before anything is written: run.json (resuming), the configs, the device,
    the tokenizer. ValueError (or FileNotFoundError for a missing tokenizer) saying what to change."""
    out = Path(out)
    run = _recorded_run(out, preset, gate) if resume and (out / "run.json").exists() else None
    model_cfg, cfg = configs(preset, gate, run, sets, steps, device, precision)
    pick_precision(cfg.precision, pick_device(cfg.device))  # fails now if the device is not there
    tokenizer = Path(tokenizer) if tokenizer else data.DEFAULT_TOKENIZER
    tok = None
    if PRESETS[preset].corpus not in data.TASKS:
        tok = data.load_tokenizer(tokenizer)
        if tok.token_to_id(data.BOS) is None and "bos_id" not in (sets or {}):
            raise ValueError(f"--tokenizer {tokenizer} has no {data.BOS} token; add one to it, or name the id "
                             "that starts every sequence with --set bos_id=ID")
        if tok.get_vocab_size() > model_cfg.vocab_size:
            raise ValueError(f"--tokenizer {tokenizer} has {tok.get_vocab_size()} tokens but the model's vocab_size "
                             f"is {model_cfg.vocab_size}; add --set vocab_size={tok.get_vocab_size()}")
    return PresetRun(preset, gate, out, resume, model_cfg, cfg, dict(sets or {}), tokenizer, tok)


def execute(run: PresetRun, progress: bool = True, announce=print) -> History:
    """Hold the folder's lock, check its checkpoint, load the data, build the model, write run.json, train (with a
    sink tracker), and copy the tokenizer and run.json next to the final model. `announce(line)` gets one line
    before training starts. Raises train()'s Interrupted and TrainingDiverged, and CouldNotWrite."""
    preset, out, cfg, model_cfg = PRESETS[run.preset], run.out, run.cfg, run.model_cfg
    check_writable(out)
    with RunLock(out):
        check_checkpoint(out, model_cfg, run.resume)  # damaged or another config: nothing touched
        _, train_ids, val_ids = load_tokens(preset.corpus, run.tokenizer, cfg.seq_len, model_cfg.vocab_size)
        torch.manual_seed(cfg.seed)  # the model's initial weights
        model = Transformer(model_cfg)
        info = dict(preset=run.preset, gate=run.gate, gate_config=model_cfg.describe_gate(), corpus=preset.corpus,
                    tokenizer=None if run.tok is None else _shown_path(run.tokenizer),
                    train_tokens=train_ids.numel(), val_tokens=val_ids.numel())
        if "python-stdlib" in preset.corpus:
            info["python_stdlib"] = data.stdlib_info()
        if "python-code" in preset.corpus:
            info["python_code"] = data.python_code_info()
        record = dict(info, train=dataclasses.asdict(cfg), model=model.cfg.to_dict())
        atomic_write(out / "run.json", lambda f: f.write(json.dumps(record, indent=2).encode()))  # resume reads it
        announce(f"{run.preset} / {model_cfg.describe_gate()}: {model.num_params() / 1e6:.2f}M parameters, "
                 f"{train_ids.numel():,} train and {val_ids.numel():,} validation tokens of {preset.corpus}, "
                 f"{cfg.steps} steps -> {out}")
        n_probe = 64 if preset.corpus in data.TASKS else 8  # held-out rows / windows
        probe_ids = load_tokens(preset.probe, run.tokenizer)[2] if preset.probe else val_ids
        probe = next(iter(data.eval_batches(probe_ids, n_probe, cfg.seq_len, cfg.bos_id, 1)))[0]
        try:
            history = train(model, train_ids, val_ids, cfg, out_dir=out, resume=run.resume, info=info,
                            progress=progress, callback=sink_tracker(probe))
        except OSError as e:  # e.g. the disk filled up: the last checkpoint is intact (atomic writes)
            raise CouldNotWrite(e) from e
        if run.tok is not None:
            save_tokenizer(run.tokenizer, out / "model")  # tokenizer.json + tokenizer_config.json (for AutoTokenizer)
        shutil.copyfile(out / "run.json", out / "model" / "run.json")
    return history
