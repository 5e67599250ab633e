"""Grow the three code models on this machine, in the background: lesson 03's GROW switch (lesson 04 measures them).

    g = Grow(seed=0)     # runs/code-seed0/{baseline,headwise,elementwise}: the `code` recipe (`code-gpu` on a GPU)
    g.estimate()         # minutes per model here, from a few timed training steps
    g.start()            # one background process trains the unfinished models one after another; finished ones stay
    g.status()           # {variant: Progress}: the step each run has reached, read from its folder and log
    g.show()             # a progress bar per model and the tracker's curves, redrawn as they arrive

Each model is `minigate train --preset P --variant V --out runs/P-seedN/NAME --set seed=N` (`--resume` when its
folder has a checkpoint), a process of its own writing NAME.log beside the folder: start() again after a restart, a
kill or a closed notebook resumes what was unfinished. The background process holds runs/P-seedN/.lock while it
works (runfolder.RunLock), so a second start() while it runs starts nothing.

    python -m minigate.course.grow --seed 2 [--preset code] [--root runs]   # the same, from a shell, in the foreground
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..measure import NAMES
from ..presets import PRESETS, VARIANTS, model_config
from ..runfolder import RunFolderInUse, RunLock

GPU_RECIPE = "code-gpu"  # ~1.5 min per model on an H100, 265 s for three on an H200; a T4 projected at 4-15 min
CPU_RECIPE = "code"  # the shipped models' recipe: 20-40 minutes per model on 2 CPU cores
TRACKED = {"sink_rate_64": "sink heads at T=64 (share)", "f_attn_excess": "F-Attn above uniform", "m_act": "M-Act"}


def recipe_for(device: str | None = None) -> str:
    """The preset the switch trains: `code-gpu` on a CUDA GPU, `code` anywhere else."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    return GPU_RECIPE if str(device).startswith("cuda") else CPU_RECIPE


@dataclass
class Progress:
    """Where one model's run stands."""
    variant: str
    step: int  # the last step its log or history shows (0: not started)
    steps: int  # the run's length
    state: str  # "waiting", "training", "stopped" (unfinished, nothing training it) or "done"


class Grow:
    """The three models of one seed, grown in run folders under `root`. steps / sets: shorter runs and --set
    overrides (the tests' few steps; the course's runs use the recipe as it is)."""

    def __init__(self, seed: int = 0, preset: str | None = None, root="runs", steps: int | None = None,
                 sets: dict | None = None):
        self.preset = preset or recipe_for()
        if self.preset not in PRESETS:
            raise ValueError(f"unknown preset {self.preset!r}; use one of {', '.join(PRESETS)}")
        self.seed, self.steps, self.sets = int(seed), steps, dict(sets or {})
        self.base = Path(root) / f"{self.preset}-seed{self.seed}"  # the three run folders, their logs, the lock

    def folder(self, variant: str) -> Path:
        return self.base / NAMES[variant]

    def log(self, variant: str) -> Path:
        return self.base / f"{NAMES[variant]}.log"

    def command(self, variant: str) -> list[str]:
        """The `minigate train` command of one model (as `python -m minigate.cli`, the same entry point)."""
        out = self.folder(variant)
        cmd = [sys.executable, "-m", "minigate.cli", "train", "--preset", self.preset, "--variant", variant,
               "--out", str(out), "--set", f"seed={self.seed}"]
        cmd += [a for k, v in self.sets.items() for a in ("--set", f"{k}={v}")]
        cmd += ["--steps", str(self.steps)] if self.steps else []
        return cmd + (["--resume"] if (out / "checkpoint.pt").is_file() else [])

    def done(self, variant: str) -> bool:
        return (self.folder(variant) / "model" / "config.json").is_file()

    def finished(self) -> bool:
        return all(self.done(v) for v in VARIANTS)

    def running(self) -> bool:
        """Whether a background process holds this seed's folder (it trains, or is about to)."""
        if not self.base.is_dir():
            return False
        try:
            with RunLock(self.base):
                return False
        except RunFolderInUse:
            return True

    def start(self) -> str:
        """Train the unfinished models one after another in one background process; returns what it did."""
        if self.finished():
            return f"all three models of seed {self.seed} are trained: {self.base}"
        if self.running():
            return f"already training in the background: {self.base}"
        self.base.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "minigate.course.grow", "--seed", str(self.seed), "--preset", self.preset,
               "--root", str(self.base.parent)] + (["--steps", str(self.steps)] if self.steps else [])
        cmd += [a for k, v in self.sets.items() for a in ("--set", f"{k}={v}")]
        detach = {"creationflags": subprocess.CREATE_NEW_PROCESS_GROUP} if os.name == "nt" else {
            "start_new_session": True}  # survives the notebook's kernel: read on, restart, come back
        with open(self.base / "grow.log", "a") as log:
            subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, **detach)
        for _ in range(100):  # until it holds the lock: a start() right after this one starts nothing
            if self.running():
                break
            time.sleep(0.1)
        todo = [NAMES[v] for v in VARIANTS if not self.done(v)]
        return f"training {', '.join(todo)} in the background, one after another: {self.base}"

    def run(self) -> int:
        """The background process: each unfinished model in turn (a `minigate train` process each), holding the
        lock. Returns the first failing exit code, or 0."""
        with RunLock(self.base):
            for variant in VARIANTS:
                if self.done(variant):
                    continue
                with open(self.log(variant), "a") as log:
                    rc = subprocess.run(self.command(variant), stdout=log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, env=dict(os.environ, TQDM_MININTERVAL="2")).returncode
                if rc != 0:
                    print(f"{NAMES[variant]}: minigate train exited with {rc}; see {self.log(variant)}", flush=True)
                    return rc
        return 0

    def progress(self, variant: str) -> Progress:
        """Where a run stands: the last step of its log's progress bar or of its history.json, whichever is later."""
        steps = self.steps or PRESETS[self.preset].train.steps
        if self.done(variant):
            return Progress(variant, steps, steps, "done")
        step = 0
        history = self.folder(variant) / "history.json"
        if history.is_file():
            try:
                step = json.loads(history.read_text())["step"][-1]
            except (ValueError, KeyError, IndexError):
                pass  # being written: the log says where it is
        if self.log(variant).is_file():
            with open(self.log(variant), "rb") as f:
                f.seek(max(0, f.seek(0, 2) - 4096))
                bars = re.findall(rb"(\d+)/(\d+) \[", f.read())
            if bars:
                step, steps = max(step, int(bars[-1][0])), int(bars[-1][1])
        training = self.running() and (step > 0 or self.log(variant).is_file())
        return Progress(variant, step, steps, "training" if training else "stopped" if step else "waiting")

    def status(self) -> dict[str, Progress]:
        return {v: self.progress(v) for v in VARIANTS}

    def histories(self) -> dict[str, dict]:
        """{name: history.json} of the runs that have written one (every checkpoint and at the end)."""
        out = {}
        for v in VARIANTS:
            path = self.folder(v) / "history.json"
            try:
                out[NAMES[v]] = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
        return out

    def measure(self, prose: torch.Tensor, device="cpu") -> dict | None:
        """{variant: measure.Shipped} of the three finished models on `prose` (measure.prose_windows: the windows the
        shipped models were measured on), named "yours-NAME"; None until all three are finished."""
        from ..measure import measure_folder

        if not self.finished():
            return None
        return {v: measure_folder(self.folder(v), prose, device, name=f"yours-{NAMES[v]}") for v in VARIANTS}

    def estimate(self, steps: int = 6, warmup: int = 3, device: str | None = None) -> dict[str, float]:
        """Minutes per model on this machine: `warmup` + `steps` training steps of each model on random tokens, timed
        in this process (the first steps allocate, and bf16 kernels are built on first use: left out), the median
        step times the recipe's steps. Evaluations and the tracker add a few percent. About half a minute on a CPU;
        run it before the models train, not beside them."""
        from ..model import Transformer
        from ..train import train  # the library's trainer, as the runs use it

        cfg = PRESETS[self.preset].train
        n, total = self.steps or cfg.steps, warmup + steps
        timed = dataclasses.replace(cfg, steps=total, eval_every=total, eval_batches=1, ckpt_every=0, ckpt_minutes=0,
                                    warmup_steps=1, compile=False, **({"device": device} if device else {}))
        tokens = cfg.batch_size * cfg.seq_len * cfg.grad_accum
        minutes = {}
        for variant in VARIANTS:
            torch.manual_seed(self.seed)
            model = Transformer(model_config(self.preset, variant))
            ids = torch.randint(0, model.cfg.vocab_size, (cfg.batch_size * (cfg.seq_len + 1) * (total + 1),))
            h = train(model, ids, ids[: cfg.batch_size * (cfg.seq_len + 1) * 2], timed, progress=False)
            minutes[NAMES[variant]] = n * tokens / statistics.median(h.tokens_per_s[warmup:]) / 60
        return minutes

    def show(self, every: float = 30.0):
        """A progress bar per model and the tracker's curves, redrawn every `every` seconds by a background thread
        until the three are done or nothing trains them (the notebook stays free). Returns the widget."""
        import ipywidgets as W
        from IPython.display import display

        bars = {v: W.IntProgress(min=0, max=1, description=NAMES[v], layout=W.Layout(width="60%")) for v in VARIANTS}
        labels = {v: W.Label() for v in VARIANTS}
        out = W.Output()
        box = W.VBox([W.HBox([bars[v], labels[v]]) for v in VARIANTS] + [out])
        drawn = {"steps": None}

        def redraw():
            for v, p in self.status().items():
                bars[v].max, bars[v].value = p.steps, p.step
                labels[v].value = f"{p.step} / {p.steps} steps, {p.state}"
            histories = self.histories()
            seen = {name: [m["step"] for m in h.get("metrics", [])] for name, h in histories.items()}
            if seen != drawn["steps"]:
                drawn["steps"] = seen
                with out:
                    out.clear_output(wait=True)
                    display(self.curves(histories))

        def loop():
            while True:
                redraw()
                if self.finished() or not self.running():
                    redraw()
                    return
                time.sleep(every)

        display(box)
        redraw()
        if not self.finished() and self.running():
            threading.Thread(target=loop, daemon=True).start()
        return box

    def curves(self, histories: dict | None = None):
        """The tracker's sink heads at T=64, F-Attn above uniform and M-Act (8 held-out code windows, every
        eval_every steps) of each model against the step: one figure, three panels."""
        import matplotlib.pyplot as plt

        histories = self.histories() if histories is None else histories
        fig, axes = plt.subplots(1, 3, figsize=(13, 3.4), layout="constrained")
        for ax, (key, title) in zip(axes, TRACKED.items(), strict=True):
            for name, h in histories.items():
                rows = [m for m in h.get("metrics", []) if key in m]
                ax.plot([m["step"] for m in rows], [m[key] for m in rows], "o-", ms=3, label=name)
            ax.set(title=title, xlabel="step")
        axes[0].legend(fontsize=8)
        fig.suptitle(f"{self.preset}, seed {self.seed}: the tracker's numbers as the runs write them")
        plt.close(fig)
        return fig


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m minigate.course.grow", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--preset", help=f"default: {GPU_RECIPE} on a CUDA GPU, else {CPU_RECIPE}")
    ap.add_argument("--root", default="runs")
    ap.add_argument("--steps", type=int, help="shorter runs (tests)")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE")
    args = ap.parse_args(argv)
    sets = dict(s.split("=", 1) for s in args.set)
    return Grow(args.seed, args.preset, args.root, args.steps, sets).run()


if __name__ == "__main__":
    sys.exit(main())
