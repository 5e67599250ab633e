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

PRESET_NAMES = ("ci", "t4", "copy", "induction", "text")  # kept in sync with train.PRESETS (checked in the tests)


TASK_ROWS = (40_000, 512)  # rows of a synthetic task (data.TASKS) for training and validation (seeds 1 and 2)


def _tokens(corpus: str, tokenizer_path, seq_len: int = 64, vocab_size: int = 130):
    from . import data

    if corpus in data.TASKS:  # rows instead of a token stream, no tokenizer
        return (None, data.task_rows(corpus, TASK_ROWS[0], seq_len, vocab_size, seed=1),
                data.task_rows(corpus, TASK_ROWS[1], seq_len, vocab_size, seed=2))
    tok = data.load_tokenizer(tokenizer_path)
    train_docs, val_docs = data.load_documents(corpus)
    return tok, data.encode(train_docs, tok), data.encode(val_docs, tok)


def cmd_train(args) -> int:
    import torch

    from . import ModelConfig, Transformer, data
    from .analysis import sink_tracker
    from .pretrained import atomic_write
    from .train import PRESETS, TrainConfig, TrainingDiverged, model_config, train

    preset, out = PRESETS[args.preset], Path(args.out)
    cfg = preset.train
    run_file = out / "run.json"
    if args.resume and run_file.exists():  # continue with exactly the settings the run started with
        run = json.loads(run_file.read_text())
        if (run["preset"], run["gate"]) != (args.preset, args.gate):
            raise SystemExit(f"error: {out} holds a run of --preset {run['preset']} --gate {run['gate']}, "
                             f"not --preset {args.preset} --gate {args.gate}")
        cfg = TrainConfig(**run["train"])
    model_cfg = model_config(args.preset, args.gate)
    if args.resume and run_file.exists():
        model_cfg = ModelConfig.from_dict(run["model"])
    overrides = dict(_parse_set(s) for s in args.set or [])
    for name, value in overrides.items():  # --set FIELD=VALUE: a ModelConfig or TrainConfig field
        if hasattr(model_cfg, name):
            model_cfg = dataclasses.replace(model_cfg, **{name: _coerce(getattr(model_cfg, name), value, name)})
        elif hasattr(cfg, name):
            cfg = dataclasses.replace(cfg, **{name: _coerce(getattr(cfg, name), value, name)})
        else:
            raise ValueError(f"--set {name}=...: no such ModelConfig or TrainConfig field; ModelConfig has "
                             f"{sorted(model_cfg.to_dict())}, TrainConfig has {sorted(dataclasses.asdict(cfg))}")
    if args.steps is not None:  # a shorter run keeps its warmup within the first 10% of the steps
        cfg = dataclasses.replace(cfg, steps=args.steps, warmup_steps=min(cfg.warmup_steps, args.steps // 10))
    if args.device or args.precision:
        cfg = dataclasses.replace(cfg, device=args.device or cfg.device,
                                  precision=args.precision or cfg.precision)
    if (out / "checkpoint.pt").exists() and not args.resume:
        raise SystemExit(f"error: {out} already has a checkpoint; add --resume to continue it, "
                         "or pick another --out")

    tokenizer = Path(args.tokenizer) if args.tokenizer else data.DEFAULT_TOKENIZER
    _, train_ids, val_ids = _tokens(preset.corpus, tokenizer, cfg.seq_len, model_cfg.vocab_size)
    torch.manual_seed(cfg.seed)  # the model's initial weights
    model = Transformer(model_cfg)
    info = dict(preset=args.preset, gate=args.gate, corpus=preset.corpus,
                tokenizer=None if preset.corpus in data.TASKS else str(tokenizer),
                train_tokens=train_ids.numel(), val_tokens=val_ids.numel())
    if "python-stdlib" in preset.corpus:
        info["python_stdlib"] = data.stdlib_info()
    out.mkdir(parents=True, exist_ok=True)
    run = dict(info, train=dataclasses.asdict(cfg), model=model.cfg.to_dict())
    atomic_write(run_file, lambda f: f.write(json.dumps(run, indent=2).encode()))  # --resume reads it back
    print(f"{args.preset} / {args.gate}: {model.num_params() / 1e6:.2f}M parameters, "
          f"{train_ids.numel():,} train and {val_ids.numel():,} validation tokens of {preset.corpus}, "
          f"{cfg.steps} steps -> {out}", flush=True)
    try:
        n_probe = 64 if preset.corpus in data.TASKS else 8  # held-out rows / windows
        probe = data.eval_batches(val_ids, n_probe, cfg.seq_len, cfg.bos_id, 1)
        history = train(model, train_ids, val_ids, cfg, out_dir=out, resume=args.resume, info=info,
                        progress=not args.quiet, callback=sink_tracker(next(iter(probe))[0]))
    except KeyboardInterrupt:
        print("stopped; continue with: "
              f"minigate train --preset {args.preset} --gate {args.gate} --out {out} --resume")
        return 130
    except TrainingDiverged as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if preset.corpus not in data.TASKS:
        shutil.copyfile(tokenizer, out / "model" / "tokenizer.json")
    shutil.copyfile(run_file, out / "model" / "run.json")
    val = history.val_loss[-1]
    print(f"done: validation loss {val:.4f} (perplexity {math.exp(val):.1f}), {len(history.spikes)} loss "
          f"spikes. Open with minigate.from_pretrained({str(out / 'model')!r})")
    return 0


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


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="minigate",
                                 description="Train and evaluate tiny gated-attention models.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train", help="train a preset model",
                       description="Train a preset model. Ctrl-C writes a checkpoint; --resume continues it.")
    t.add_argument("--preset", required=True, choices=PRESET_NAMES,
                   help="ci: 2 CPU cores, ~1 min; t4: Colab T4, <=15 min; copy: the sink demonstration "
                        "(copy task, ~5 min); induction: the same without <bos> (~9 min); "
                        "text: the natural-text checkpoints (~15 min)")
    t.add_argument("--gate", required=True, choices=("none", "headwise", "elementwise"),
                   help="none: baseline; headwise / elementwise: the paper's G1 sigmoid output gate")
    t.add_argument("--out", required=True, help="run folder (checkpoint.pt, history.json, model/)")
    t.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint")
    t.add_argument("--steps", type=int, help="override the preset's number of steps")
    t.add_argument("--set", action="append", metavar="FIELD=VALUE",
                   help="override a ModelConfig or TrainConfig field, e.g. --set lr=0.01 --set qk_norm=false "
                        "(repeatable; recorded in run.json and reused by --resume)")
    t.add_argument("--device", help="cpu, cuda, mps (default: the best available)")
    t.add_argument("--precision", choices=("auto", "fp32", "bf16", "fp16"), help="default: auto")
    t.add_argument("--tokenizer", help="tokenizer.json (default: data/tokenizer.json)")
    t.add_argument("--quiet", action="store_true", help="no progress bar")
    t.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    e = sub.add_parser("eval", help="validation loss and perplexity of a trained model")
    e.add_argument("dir", help="a run folder (from minigate train) or a model folder")
    e.add_argument("--corpus", help="default: the corpus it was trained on (run.json), else wikitext-2")
    e.add_argument("--seq-len", type=int, help="default: the training seq_len (run.json), else 128")
    e.add_argument("--batch-size", type=int, default=16)
    e.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.cmd == "train" and args.steps is not None and args.steps < 1:
        raise SystemExit("error: --steps must be at least 1")
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from .data import DataUnavailableError

    try:
        return cmd_train(args) if args.cmd == "train" else cmd_eval(args)
    except (DataUnavailableError, FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # before training started: nothing to save
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
