"""The `minigate` command: train a preset, evaluate a trained model.

    minigate train --preset ci --gate headwise --out runs/ci-headwise     # Ctrl-C: resumable checkpoint
    minigate train --preset ci --gate headwise --out runs/ci-headwise --resume
    minigate eval runs/ci-headwise                                        # validation loss, perplexity

A run folder holds checkpoint.pt, history.json, run.json (preset, gate, corpus, configs) and model/,
the final model: config.json + model.safetensors (open with minigate.from_pretrained), plus copies
of tokenizer.json and run.json so the folder is self-contained.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shutil
import sys
from pathlib import Path

PRESET_NAMES = ("ci", "code", "copy", "induction", "text")  # as train.PRESETS (checked in the tests)


TASK_ROWS = (40_000, 512)  # rows of a synthetic task (data.TASKS) for training and validation (seeds 1 and 2)


def _tokens(corpus: str, tokenizer_path, seq_len: int = 64, vocab_size: int = 130):
    from . import data

    if corpus in data.TASKS:  # rows instead of a token stream, no tokenizer
        return (None, data.task_rows(corpus, TASK_ROWS[0], seq_len, vocab_size, seed=1),
                data.task_rows(corpus, TASK_ROWS[1], seq_len, vocab_size, seed=2))
    tok = data.load_tokenizer(tokenizer_path)
    return (tok, *data.encode_corpus(corpus, tok))


def _configs(args, run: dict | None):
    """The ModelConfig and TrainConfig of this run: the preset (or, with --resume, what run.json recorded),
    then every --set applied at once (their order does not matter), then --steps/--device/--precision.
    Raises ValueError naming the flag before anything is written."""
    from .config import ModelConfig
    from .train import GATES, PRESETS, TrainConfig

    preset = PRESETS[args.preset]
    model_kw = dict(run["model"]) if run else dict(preset.model, **GATES[args.gate])
    train_kw = dict(run["train"]) if run else dataclasses.asdict(preset.train)
    overrides = dict(_parse_set(s) for s in args.set or [])
    model_fields, train_fields = ModelConfig().to_dict(), dataclasses.asdict(TrainConfig())
    for name, value in overrides.items():  # --set FIELD=VALUE: a ModelConfig or TrainConfig field
        if name in model_fields:
            model_kw[name] = _coerce(model_fields[name], value, name)
        elif name in train_fields:
            train_kw[name] = _coerce(train_fields[name], value, name)
        else:
            raise ValueError(f"--set {name}=...: no such ModelConfig or TrainConfig field; ModelConfig has "
                             f"{sorted(model_fields)}, TrainConfig has {sorted(train_fields)}")
    if args.steps is not None:  # a shorter run keeps its warmup within the first 10% of the steps
        train_kw.update(steps=args.steps, warmup_steps=min(train_kw["warmup_steps"], args.steps // 10))
    train_kw.update({k: v for k, v in (("device", args.device), ("precision", args.precision)) if v})
    try:
        model_cfg, cfg = ModelConfig.from_dict(model_kw), TrainConfig(**train_kw)
    except ValueError as e:
        field = str(e).split("=", 1)[0].split(".")[-1]
        flag = f"--set {field}={overrides[field]}: " if field in overrides else ""
        raise ValueError(f"{flag}{e}") from None
    if cfg.seq_len > model_cfg.max_seq_len:
        raise ValueError(f"seq_len={cfg.seq_len} is longer than max_seq_len={model_cfg.max_seq_len}; raise "
                         f"max_seq_len too (--set max_seq_len={cfg.seq_len}) or lower seq_len")
    return model_cfg, cfg, overrides


def cmd_train(args) -> int:
    """Every check comes before anything is written: flags and configs, the device, the output folder,
    the lock, the checkpoint's settings. run.json is written only when the run starts or resumes."""
    import torch

    from . import Transformer, data
    from .analysis import sink_tracker
    from .pretrained import atomic_write, save_tokenizer
    from .runfolder import RunLock, check_writable
    from .train import (PRESETS, Interrupted, TrainingDiverged, config_diff, load_checkpoint, pick_device,
                        pick_precision, train)

    preset, out = PRESETS[args.preset], Path(args.out)
    run_file, ckpt_file = out / "run.json", out / "checkpoint.pt"
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file, not a folder; choose a folder for the run")
    run = None
    if args.resume and run_file.exists():  # continue with exactly the settings the run started with
        try:
            run = json.loads(run_file.read_text())
            recorded = (run["preset"], run["gate"])
        except (ValueError, KeyError) as e:
            raise ValueError(f"{run_file} is not a run.json written by minigate ({e}); it was left as it is") from None
        if recorded != (args.preset, args.gate):
            raise ValueError(f"{out} holds a run of --preset {run['preset']} --gate {run['gate']}, "
                             f"not --preset {args.preset} --gate {args.gate}; resume it with those flags")
    model_cfg, cfg, overrides = _configs(args, run)
    device = pick_device(cfg.device)  # fails now if the device is not there
    pick_precision(cfg.precision, device)
    tokenizer = Path(args.tokenizer) if args.tokenizer else data.DEFAULT_TOKENIZER
    tok = None
    if preset.corpus not in data.TASKS:
        tok = data.load_tokenizer(tokenizer)
        if tok.token_to_id(data.BOS) is None and "bos_id" not in overrides:
            raise ValueError(f"--tokenizer {tokenizer} has no {data.BOS} token; add one to it, or name the id "
                             "that starts every sequence with --set bos_id=ID")
        if tok.get_vocab_size() > model_cfg.vocab_size:
            raise ValueError(f"--tokenizer {tokenizer} has {tok.get_vocab_size()} tokens but the model's vocab_size "
                             f"is {model_cfg.vocab_size}; add --set vocab_size={tok.get_vocab_size()}")
    check_writable(out)
    with RunLock(out):
        if ckpt_file.exists():
            if not args.resume:
                raise ValueError(f"{out} already has a checkpoint; add --resume to continue it, "
                                 "or pick another --out")
            diff = config_diff(load_checkpoint(ckpt_file), model_cfg)  # damaged: CheckpointError, nothing touched
            if diff:
                raise ValueError(f"{ckpt_file} was trained with another model config, {{field: (checkpoint, "
                                 f"requested)}} = {diff}; resume without those --set flags (nothing was changed)")
        _, train_ids, val_ids = _tokens(preset.corpus, tokenizer, cfg.seq_len, model_cfg.vocab_size)
        torch.manual_seed(cfg.seed)  # the model's initial weights
        model = Transformer(model_cfg)
        info = dict(preset=args.preset, gate=args.gate, gate_config=model_cfg.describe_gate(), corpus=preset.corpus,
                    tokenizer=None if tok is None else str(tokenizer),
                    train_tokens=train_ids.numel(), val_tokens=val_ids.numel())
        if "python-stdlib" in preset.corpus:
            info["python_stdlib"] = data.stdlib_info()
        if "python-code" in preset.corpus:
            info["python_code"] = data.python_code_info()
        run = dict(info, train=dataclasses.asdict(cfg), model=model.cfg.to_dict())
        atomic_write(run_file, lambda f: f.write(json.dumps(run, indent=2).encode()))  # --resume reads it back
        print(f"{args.preset} / {model_cfg.describe_gate()}: {model.num_params() / 1e6:.2f}M parameters, "
              f"{train_ids.numel():,} train and {val_ids.numel():,} validation tokens of {preset.corpus}, "
              f"{cfg.steps} steps -> {out}", flush=True)
        resume_cmd = f"minigate train --preset {args.preset} --gate {args.gate} --out {out} --resume"
        try:
            n_probe = 64 if preset.corpus in data.TASKS else 8  # held-out rows / windows
            probe_ids = _tokens(preset.probe, tokenizer)[2] if preset.probe else val_ids
            probe = data.eval_batches(probe_ids, n_probe, cfg.seq_len, cfg.bos_id, 1)
            history = train(model, train_ids, val_ids, cfg, out_dir=out, resume=args.resume, info=info,
                            progress=not args.quiet, callback=sink_tracker(next(iter(probe))[0]))
        except Interrupted as e:
            print(f"stopped ({signal_name(e.signum)}); continue with: {resume_cmd}", flush=True)
            return 128 + e.signum  # 130 for Ctrl-C, 143 for SIGTERM, as a shell reports them
        except TrainingDiverged as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        except OSError as e:  # e.g. the disk filled up: the last checkpoint is intact (atomic writes)
            print(f"error: could not write to {out} ({e.strerror or e}); the last checkpoint there is intact: "
                  f"free space or fix the folder, then {resume_cmd}", file=sys.stderr)
            return 1
        if tok is not None:
            save_tokenizer(tokenizer, out / "model")  # tokenizer.json + tokenizer_config.json (for AutoTokenizer)
        shutil.copyfile(run_file, out / "model" / "run.json")
    val = history.val_loss[-1]
    print(f"done: validation loss {val:.4f} (perplexity {math.exp(val):.1f}), {len(history.spikes)} loss "
          f"spikes. Open with minigate.from_pretrained({str(out / 'model')!r})")
    return 0


def signal_name(signum: int) -> str:
    return {2: "Ctrl-C", 15: "SIGTERM"}.get(signum, f"signal {signum}")


def _parse_set(text: str) -> tuple[str, str]:
    if "=" not in text:
        raise ValueError(f"--set {text!r}: write FIELD=VALUE, e.g. --set lr=0.01 or --set qk_norm=false")
    name, value = text.split("=", 1)
    return name.strip(), value.strip()


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


def cmd_eval(args) -> int:
    import torch

    from . import data, from_pretrained
    from .train import evaluate

    folder = Path(args.dir)
    if (folder / "model" / "config.json").exists():
        folder = folder / "model"  # a run folder: evaluate its final model
    if not (folder / "config.json").exists():
        raise SystemExit(f"error: {args.dir} holds no model (no config.json, nor model/config.json); "
                         "pass a folder written by `minigate train` or minigate.save_pretrained")
    run = json.loads((folder / "run.json").read_text()) if (folder / "run.json").exists() else {}
    corpus = args.corpus or run.get("corpus", "wikitext-2")
    seq_len = args.seq_len or run.get("train", {}).get("seq_len", 128)
    bos_id = run.get("train", {}).get("bos_id", 0)
    tokenizer = folder / "tokenizer.json" if (folder / "tokenizer.json").exists() else data.DEFAULT_TOKENIZER
    model = from_pretrained(folder)
    if seq_len > model.cfg.max_seq_len and not args.beyond_max_seq_len:
        raise ValueError(f"--seq-len {seq_len} is longer than the model's max_seq_len={model.cfg.max_seq_len}, the "
                         "context it was trained for; add --beyond-max-seq-len to measure extrapolation on purpose")
    if corpus in data.TASKS:
        val_ids = _tokens(corpus, None, seq_len, model.cfg.vocab_size)[2]
    else:
        tok = data.load_tokenizer(tokenizer)
        if tok.get_vocab_size() > model.cfg.vocab_size:
            raise SystemExit(f"error: tokenizer {tokenizer} has {tok.get_vocab_size()} tokens but the model only "
                             f"{model.cfg.vocab_size}; is this the tokenizer the model was trained with?")
        val_ids = data.encode(data.load_documents(corpus)[1], tok)
    with torch.inference_mode():
        loss = evaluate(model, val_ids, seq_len, args.batch_size, bos_id)
    n = val_ids[..., 1:].numel() if val_ids.dim() == 2 else (val_ids.numel() // seq_len) * seq_len
    print(f"{folder}: validation loss {loss:.4f}, perplexity {math.exp(loss):.2f} "
          f"({corpus} held-out split, {n:,} tokens in windows of {seq_len})")
    return 0


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="minigate",
                                 description="Train and evaluate tiny gated-attention models.")
    from . import __version__

    ap.add_argument("--version", action="version", version=f"minigate {__version__}")
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train", help="train a preset model",
                       description="Train a preset model. Ctrl-C writes a checkpoint; --resume continues it.")
    t.add_argument("--preset", required=True, choices=PRESET_NAMES,
                   help="ci: 2 CPU cores, ~1 min; code: the natural-data recipe for a GPU (~1.5 min on an "
                        "H100); copy: the sink demonstration (copy task, ~5 min); "
                        "induction: the same without <bos> (~9 min); text: the CPU natural-text checkpoints (~15 min)")
    t.add_argument("--gate", required=True, choices=("none", "headwise", "elementwise"),
                   help="none: baseline; headwise / elementwise: the paper's G1 sigmoid output gate")
    t.add_argument("--out", required=True, help="run folder (checkpoint.pt, history.json, model/)")
    t.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint")
    t.add_argument("--steps", type=_positive, help="override the preset's number of steps")
    t.add_argument("--set", action="append", metavar="FIELD=VALUE",
                   help="override a ModelConfig or TrainConfig field, e.g. --set lr=0.01 --set qk_norm=false "
                        "(repeatable; recorded in run.json and reused by --resume)")
    t.add_argument("--device", help="cpu, cuda, mps (default: the best available)")
    t.add_argument("--precision", choices=("auto", "fp32", "bf16", "fp16"), help="default: auto")
    t.add_argument("--tokenizer", help="tokenizer.json (default: data/tokenizer.json)")
    t.add_argument("--quiet", action="store_true", help="no progress bar")
    t.add_argument("--threads", type=_positive, help="torch CPU threads (default: torch's choice)")
    e = sub.add_parser("eval", help="validation loss and perplexity of a trained model")
    e.add_argument("dir", help="a run folder (from minigate train) or a model folder")
    e.add_argument("--corpus", help="default: the corpus it was trained on (run.json), else wikitext-2")
    e.add_argument("--seq-len", type=_positive, help="default: the training seq_len (run.json), else 128")
    e.add_argument("--beyond-max-seq-len", action="store_true",
                   help="allow --seq-len above the model's max_seq_len (measures RoPE extrapolation)")
    e.add_argument("--batch-size", type=_positive, default=16)
    e.add_argument("--threads", type=_positive, help="torch CPU threads (default: torch's choice)")
    return ap


def main(argv=None) -> int:
    """Exit codes: 0 done, 1 the run failed (diverged, disk), 2 bad input (one line `error: ...` on stderr),
    130 / 143 stopped by Ctrl-C / SIGTERM after writing a checkpoint."""
    args = build_parser().parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from .data import DataUnavailableError
    from .runfolder import RunFolderInUse

    try:
        return cmd_train(args) if args.cmd == "train" else cmd_eval(args)
    except (DataUnavailableError, FileNotFoundError, ValueError, RunFolderInUse) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # before training started: nothing to save
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
