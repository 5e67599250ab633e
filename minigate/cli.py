"""The `minigate` command: train a preset, evaluate a trained model.

    minigate train --preset ci --variant headwise --out runs/ci-headwise     # Ctrl-C: resumable checkpoint
    minigate train --preset ci --variant headwise --out runs/ci-headwise --resume
    minigate train --preset ci --variant headwise --out runs/ci-headwise --progress json  # JSON lines, for a program
    minigate eval runs/ci-headwise                                           # validation loss, perplexity
    torchrun --nproc_per_node 2 $(which minigate) train --preset ci --variant headwise --out runs/ci-ddp  # DDP

A run folder holds checkpoint.pt, history.json, run.json (preset, variant, corpus, configs) and model/,
the final model: config.json + model.safetensors (open with minigate.from_pretrained), plus copies
of tokenizer.json and run.json so the folder is self-contained.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from .presets import PRESETS, VARIANTS, check_seq_len

PRESET_NAMES = tuple(sorted(PRESETS))  # the --preset choices


def cmd_train(args) -> int:
    """Parse, call, print: run.plan_run builds the configs and tokenizer, run.execute the data, model and run."""
    from . import distributed
    from .run import CouldNotWrite, execute, plan_run
    from .train import Interrupted, TrainingDiverged

    sets = dict(_parse_set(s) for s in args.set or [])
    plan = plan_run(args.preset, args.variant, args.out, args.resume, sets, args.steps, args.device, args.precision,
                    args.tokenizer)
    ranks = distributed.setup(plan.train_cfg.device)  # under torchrun: join the other processes (DDP)
    say = print if ranks.main else (lambda *a, **k: None)  # rank 0 speaks for the run
    if ranks.world > 1:
        say(f"training data-parallel on {ranks.world} processes ({distributed.backend()}); rank 0 writes {plan.out}",
            flush=True)
    try:
        progress = not args.quiet and ranks.main and args.progress  # "bar", "json" or False: train()'s progress
        history = execute(plan, progress=progress, announce=lambda line: say(line, flush=True))
    except Interrupted as e:
        distributed.barrier(ranks)  # rank 0 has written the checkpoint: all leave together
        say(f"stopped ({signal_name(e.signum)}); continue with: {plan.resume_command}", flush=True)
        return 128 + e.signum  # 130 for Ctrl-C, 143 for SIGTERM, as a shell reports them
    except TrainingDiverged as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except CouldNotWrite as e:
        print(f"error: could not write to {plan.out} ({e.error.strerror or e.error}); the last checkpoint there is "
              f"intact: free space or fix the folder, then {plan.resume_command}", file=sys.stderr)
        return 1
    distributed.barrier(ranks)  # rank 0 has written model/: all leave the process group together
    if not ranks.main:
        return 0
    val = history.val_loss[-1]
    print(f"done: validation loss {val:.4f} (perplexity {math.exp(val):.1f}), {len(history.spikes)} loss "
          f"spikes. Open with minigate.from_pretrained({str(plan.out / 'model')!r})")
    return 0


def signal_name(signum: int) -> str:
    return {2: "Ctrl-C", 15: "SIGTERM"}.get(signum, f"signal {signum}")


def _parse_set(text: str) -> tuple[str, str]:
    if "=" not in text:
        raise ValueError(f"--set {text!r}: write FIELD=VALUE, e.g. --set lr=0.01 or --set qk_norm=false")
    name, value = text.split("=", 1)
    return name.strip(), value.strip()


def cmd_eval(args) -> int:
    import torch

    from . import data, from_pretrained
    from .evaluation import evaluate
    from .run import check_vocabulary, load_tokens
    from .runfolder import read_run_json
    from .runs import finished

    folder = Path(args.dir)
    if finished(folder):
        folder = folder / "model"  # a run folder: evaluate its final model
    if not (folder / "config.json").exists():
        raise ValueError(f"{args.dir} holds no model (no config.json, nor model/config.json); "
                         "pass a folder written by `minigate train` or minigate.save_pretrained")
    recorded = read_run_json(folder) if (folder / "run.json").exists() else {}
    corpus = args.corpus or recorded.get("corpus", "wikitext-2")
    seq_len = args.seq_len or recorded.get("train", {}).get("seq_len", 128)
    bos_id = recorded.get("train", {}).get("bos_id", 0)
    tokenizer_path = folder / "tokenizer.json" if (folder / "tokenizer.json").exists() else data.DEFAULT_TOKENIZER
    model = from_pretrained(folder)
    if not args.beyond_max_seq_len:
        check_seq_len(model.cfg, "--seq-len", seq_len, "the context it was trained for; add --beyond-max-seq-len to "
                      "measure extrapolation on purpose")
    if corpus in data.TASKS:
        val_ids = load_tokens(corpus, None, seq_len, model.cfg.vocab_size)[1]
    else:  # the held-out split only
        tokenizer = data.load_tokenizer(tokenizer_path)
        check_vocabulary(tokenizer, f"tokenizer {tokenizer_path}", model.cfg.vocab_size,
                         "is this the tokenizer the model was trained with?")
        val_ids = data.encode(data.load_documents(corpus)[1], tokenizer)
    with torch.inference_mode():
        loss = evaluate(model, val_ids, seq_len, args.batch_size, bos_id)
    n = val_ids[..., 1:].numel() if val_ids.dim() == 2 else (val_ids.numel() // seq_len) * seq_len
    print(f"{folder}: validation loss {loss:.4f}, perplexity {math.exp(loss):.2f} "
          f"({corpus} held-out split, {n:,} tokens in windows of {seq_len})")
    return 0


class _Renamed(argparse.Action):
    """A flag that has another name now: one line naming it (exit 2), before any other check."""

    def __call__(self, parser, namespace, values, option_string=None):
        parser.exit(2, f"error: {option_string} is now spelled --variant: --variant {values or 'VARIANT'} (one of "
                       f"{', '.join(VARIANTS)})\n")


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
                       description="Train a preset model. Ctrl-C writes a checkpoint; --resume continues it. Launched "
                       "with torchrun --nproc_per_node N, it trains data-parallel (DDP) on N processes.")
    t.add_argument("--preset", required=True, choices=PRESET_NAMES,
                   help="; ".join(f"{name}: {PRESETS[name].about}" for name in PRESET_NAMES))
    t.add_argument("--variant", required=True, choices=tuple(VARIANTS),
                   help="none: baseline; headwise / elementwise: the paper's G1 sigmoid output gate, one score per "
                        "head or per head dimension")
    t.add_argument("--gate", "--gates", nargs="?", action=_Renamed, help=argparse.SUPPRESS)
    t.add_argument("--out", required=True, help="run folder (checkpoint.pt, history.json, model/)")
    t.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint")
    t.add_argument("--steps", type=_positive, help="override the preset's number of steps")
    t.add_argument("--set", action="append", metavar="FIELD=VALUE",
                   help="override a ModelConfig or TrainConfig field, e.g. --set lr=0.01 --set qk_norm=false "
                        "(repeatable; recorded in run.json and reused by --resume)")
    t.add_argument("--device", help="cpu, cuda, mps (default: the best available)")
    t.add_argument("--precision", choices=("auto", "fp32", "bf16", "fp16"), help="default: auto")
    t.add_argument("--tokenizer", help="tokenizer.json (default: data/tokenizer.json)")
    t.add_argument("--quiet", action="store_true", help="no progress bar (nor JSON lines)")
    t.add_argument("--progress", choices=("bar", "json"), default="bar",
                   help="bar: a progress bar on stderr (the default); json: a line of JSON on stdout every 2 s and at "
                        'the end, {"step": 520, "steps": 4000, "loss": ..., "val_loss": ..., "tokens_per_s": ...}, '
                        "for a program to follow")
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

    from .distributed import RankZeroStopped, teardown

    try:
        return cmd_train(args) if args.cmd == "train" else cmd_eval(args)
    except RankZeroStopped:  # under torchrun: rank 0 printed the error
        return 2
    except (DataUnavailableError, FileNotFoundError, FileExistsError, ValueError, RunFolderInUse) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # before training started: nothing to save
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        teardown()  # leave the process group of a torchrun launch (a no-op otherwise)


if __name__ == "__main__":
    sys.exit(main())
