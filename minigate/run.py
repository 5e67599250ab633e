"""A preset run: what `minigate train` does, from its flags to the call of train().

    plan = plan_run("ci", "headwise", "runs/ci-headwise", sets={"lr": "0.01"})  # configs, tokenizer; nothing written
    history = execute(plan)                                                      # data, model, run.json's dict, train()

run.py builds: the configs (a preset and its variant, or, resuming, what run.json recorded, then --set), the
tokenizer (loaded once), the data and the model. train() owns the run folder (train.py's docstring): it checks,
locks and writes it, each once, and writes run.json and all of model/. `--resume` (resume=True) rebuilds the
configs from run.json, so a run continues with exactly the settings it started with.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from dataclasses import dataclass
from pathlib import Path

import torch

from . import data
from .analysis import sink_tracker
from .checkpoint import History
from .config import ConfigError, ModelConfig
from .model import Transformer
from .presets import PRESETS, VARIANTS, TrainConfig
from .resources import DATA_DIR
from .runfolder import read_run_json
from .train import train

TASK_ROWS = (40_000, 512)  # rows of a synthetic task (data.TASKS) for training and validation (seeds 1 and 2)


class CouldNotWrite(Exception):
    """Training stopped because the run folder could not be written (e.g. a full disk); `.error` is the OSError.
    The last checkpoint there is intact (every write is atomic)."""

    def __init__(self, error: OSError):
        super().__init__(str(error))
        self.error = error


@dataclass
class RunPlan:
    preset: str  # a name in PRESETS
    variant: str  # a name in VARIANTS: none, headwise, elementwise
    out: Path  # the run folder
    resume: bool  # continue the checkpoint in `out` (with the settings run.json recorded)
    model_cfg: ModelConfig
    train_cfg: TrainConfig
    overrides: dict  # the --set fields, {name: value as given}
    tokenizer_path: Path | None  # tokenizer.json; None for a synthetic task (data.TASKS), which has no text

    @property
    def corpus(self) -> str:
        return PRESETS[self.preset].corpus

    @functools.cached_property
    def tokenizer(self):
        """The tokenizer of tokenizer_path, loaded once (None for a synthetic task)."""
        return None if self.tokenizer_path is None else data.load_tokenizer(self.tokenizer_path)

    @property
    def resume_command(self) -> str:
        return f"minigate train --preset {self.preset} --variant {self.variant} --out {self.out} --resume"


def load_tokens(corpus: str, tokenizer, seq_len: int, vocab_size: int):
    """(train ids, validation ids) of a corpus, encoded with the loaded `tokenizer`, or of a synthetic task's rows
    (data.TASKS) of seq_len tokens over the model's vocab_size ids (`tokenizer` unused)."""
    if corpus in data.TASKS:
        return (data.task_rows(corpus, TASK_ROWS[0], seq_len, vocab_size, seed=1),
                data.task_rows(corpus, TASK_ROWS[1], seq_len, vocab_size, seed=2))
    return data.encode_corpus(corpus, tokenizer)


def check_vocabulary(tokenizer, what: str, vocab_size: int, fix: str):
    """A ValueError if the loaded tokenizer (named `what` in the message) has more tokens than the model has ids;
    `fix` says what to do."""
    if tokenizer.get_vocab_size() > vocab_size:
        raise ValueError(f"{what} has {tokenizer.get_vocab_size()} tokens but the model's vocab_size is "
                         f"{vocab_size}; {fix}")


def _shown_path(path: Path) -> str:
    """A path as run.json records it: relative to the course folder when inside it (no path of this machine)."""
    try:
        return Path(path).resolve().relative_to(DATA_DIR.parent.resolve()).as_posix()
    except ValueError:
        return str(path)


def _recorded_run(out: Path, preset: str, variant: str) -> dict:
    """run.json of the run in `out`, checked to be a run of this preset and variant."""
    try:
        run_json = read_run_json(out / "run.json")
        recorded = (run_json["preset"], run_json["variant"])
    except (ValueError, KeyError) as e:
        raise ValueError(f"{out / 'run.json'} is not a run.json written by minigate ({e}); it was left as it is") \
            from None
    if recorded != (preset, variant):
        raise ValueError(f"{out} holds a run of --preset {recorded[0]} --variant {recorded[1]}, "
                         f"not --preset {preset} --variant {variant}; resume it with those flags")
    return run_json


_EXPECTED = {bool: "true or false", int: "an integer", float: "a number", tuple: "numbers separated by commas"}


def _read(kind: type, text: str):
    """`text` as a value of type `kind`; a ValueError if it is not one."""
    if kind is bool:
        if text.lower() not in ("true", "false", "1", "0"):
            raise ValueError(text)
        return text.lower() in ("true", "1")
    if kind is tuple:
        return tuple(float(v) for v in text.split(","))
    return kind(text)


def _coerce(kind, value: str, name: str):
    """The text of --set NAME=VALUE as the field's declared type (a union, e.g. `bool | str`: the first that reads
    it); a ValueError saying what it expected."""
    kinds = typing.get_args(kind) or (kind,)
    for k in kinds:
        try:
            return _read(k, value)
        except ValueError:
            pass
    raise ValueError(f"--set {name}={value}: expected " + " or ".join(_EXPECTED.get(k, k.__name__) for k in kinds))


def configs(preset: str, variant: str, recorded: dict | None = None, sets: dict | None = None,
            steps: int | None = None, device: str | None = None,
            precision: str | None = None) -> tuple[ModelConfig, TrainConfig]:
    """The ModelConfig and TrainConfig of a run: the preset's (or, resuming, what run.json recorded), then every
    --set FIELD=VALUE of `sets` ({field: text}) at once (their order does not matter), then steps, device and
    precision. A ValueError naming the --set flag that is wrong. How the two fit each other and the machine
    (context length, device, precision) is train()'s check."""
    model_kw = dict(recorded["model"]) if recorded else dict(PRESETS[preset].model, **VARIANTS[variant])
    train_kw = dict(recorded["train"]) if recorded else dataclasses.asdict(PRESETS[preset].train)
    sets = sets or {}
    model_fields, train_fields = typing.get_type_hints(ModelConfig), typing.get_type_hints(TrainConfig)  # name: type
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
        model_cfg, train_cfg = ModelConfig.from_dict(model_kw), TrainConfig(**train_kw)
    except ConfigError as e:
        flag = f"--set {e.field}={sets[e.field]}: " if e.field in sets else ""
        raise ValueError(f"{flag}{e}") from None
    return model_cfg, train_cfg


def plan_run(preset: str, variant: str, out, resume: bool = False, sets: dict | None = None,
             steps: int | None = None, device: str | None = None, precision: str | None = None,
             tokenizer=None) -> RunPlan:
    """What can be checked before any data is loaded: run.json (resuming), the configs, the tokenizer (loaded
    here, once). ValueError (or FileNotFoundError for a missing tokenizer) saying what to change."""
    out = Path(out)
    recorded = _recorded_run(out, preset, variant) if resume and (out / "run.json").exists() else None
    model_cfg, train_cfg = configs(preset, variant, recorded, sets, steps, device, precision)
    path = None if PRESETS[preset].corpus in data.TASKS else Path(tokenizer or data.DEFAULT_TOKENIZER)
    plan = RunPlan(preset, variant, out, resume, model_cfg, train_cfg, dict(sets or {}), path)
    if plan.tokenizer is not None:
        if plan.tokenizer.token_to_id(data.BOS) is None and "bos_id" not in plan.overrides:
            raise ValueError(f"--tokenizer {path} has no {data.BOS} token; add one to it, or name the id "
                             "that starts every sequence with --set bos_id=ID")
        check_vocabulary(plan.tokenizer, f"--tokenizer {path}", model_cfg.vocab_size,
                         f"add --set vocab_size={plan.tokenizer.get_vocab_size()}")
    return plan


def execute(plan: RunPlan, progress: bool | str = True, announce=print) -> History:
    """Load the data, build the model and the run.json record, and train (with a sink tracker): train() checks,
    locks and writes the run folder. `announce(line)` gets one line once train() holds the folder, before the
    first step. Raises train()'s Interrupted and TrainingDiverged, its ValueErrors for inputs that do not fit,
    and CouldNotWrite."""
    preset, train_cfg, model_cfg = PRESETS[plan.preset], plan.train_cfg, plan.model_cfg
    train_ids, val_ids = load_tokens(preset.corpus, plan.tokenizer, train_cfg.seq_len, model_cfg.vocab_size)
    torch.manual_seed(train_cfg.seed)  # the model's initial weights
    model = Transformer(model_cfg)
    info = dict(preset=plan.preset, variant=plan.variant, gate_config=model_cfg.describe_gate(),
                corpus=preset.corpus, tokenizer=plan.tokenizer_path and _shown_path(plan.tokenizer_path),
                train_tokens=train_ids.numel(), val_tokens=val_ids.numel())
    if "python-stdlib" in preset.corpus:
        info["python_stdlib"] = data.stdlib_info()
    if "python-code" in preset.corpus:
        info["python_code"] = data.python_code_info()
    if "python-site" in preset.corpus:
        info["python_site"] = data.python_site_info()
    record = dict(info, train=dataclasses.asdict(train_cfg), model=model.cfg.to_dict())
    n_probe = 64 if preset.corpus in data.TASKS else 8  # held-out rows / windows
    probe_ids = (load_tokens(preset.probe, plan.tokenizer, train_cfg.seq_len, model_cfg.vocab_size)[1]
                 if preset.probe else val_ids)
    probe = next(iter(data.eval_batches(probe_ids, n_probe, train_cfg.seq_len, train_cfg.bos_id, 1)))[0]
    line = (f"{plan.preset} / {model_cfg.describe_gate()}: {model.num_params() / 1e6:.2f}M parameters, "
            f"{train_ids.numel():,} train and {val_ids.numel():,} validation tokens of {preset.corpus}, "
            f"{train_cfg.steps} steps -> {plan.out}")
    try:
        return train(model, train_ids, val_ids, train_cfg, out_dir=plan.out, resume=plan.resume, info=info,
                     progress=progress, callback=sink_tracker(probe), run_json=record,
                     tokenizer=plan.tokenizer_path, on_start=lambda: announce(line))
    except (FileExistsError, FileNotFoundError):  # bad input found by train()'s checks: nothing was written
        raise
    except OSError as e:  # e.g. the disk filled up: the last checkpoint is intact (atomic writes)
        raise CouldNotWrite(e) from e
