"""Grow the three code models on this machine, in the background: lesson 03's GROW switch (lesson 04 measures them).

    g = Grow(seed=0)     # runs/code-seed0/{baseline,headwise,elementwise}: the `code` recipe (`code-gpu` on a GPU)
    g.estimate()         # minutes per model here, from a few timed training steps
    g.start()            # one background process trains the unfinished models one after another; finished ones stay
    g.status()           # {variant: Progress}: the step each run has reached, read from its folder and log
    g.show()             # a progress bar per model and the tracker's curves, redrawn as they arrive
    g.stop()             # checkpoints the model in training and ends the background process; start() resumes
    g.compare(prose)     # the finished trio measured here, beside the course's numbers (grow_view.py)

Each model is `minigate train --preset P --variant V --out runs/P-seedN/NAME --set seed=N --progress json` (`--resume`
when its folder has a checkpoint; runs.RunFolder: the layout and command of every preset's runs), a process of its own
writing NAME.log beside the folder: its messages, and a line of JSON every 2 s, {"step": 520, "steps": 4000, ...},
which status() reads. The background process and its `minigate train` form one process group: stop() signals the
group, so the running model checkpoints (train() stops cleanly on SIGTERM) and nothing is orphaned. The process holds
runs/P-seedN's RunLock while it works (runfolder.RunLock, waiting for it rather than losing a race); status checks
only read who holds it (runfolder.lock_holder), never take it. start() again after a restart, a stop or a closed
notebook resumes what was unfinished. With `keep=FOLDER` the finished trio (weights, run.json, history.json; not the
checkpoints) is copied there at the end: in Colab, a folder on Google Drive (drive_folder()), where lesson 04 finds it
(find_grown) after the runtime that trained it is gone.

    python -m minigate.course.grow --seed 2 [--preset code] [--root runs]   # the same, from a shell, in the foreground
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import torch

from .. import measure, runs
from ..presets import NAMES, PRESETS, VARIANTS
from ..runfolder import RunLock, lock_holder
from ..runs import RunFolder
from .grow_view import GrowView

GPU_RECIPE = "code-gpu"  # ~1.5 min per model on an H100, 265 s for three on an H200; a T4 projected at 4-15 min
CPU_RECIPE = "code"  # the shipped models' recipe (docs/gpu.md, docs/training.md: its times per machine)
RECIPES = (GPU_RECIPE, CPU_RECIPE)  # what find_grown looks for
DRIVE = Path("/content/drive")  # where Colab mounts Google Drive
KEPT = ("model", "run.json", "history.json", "measurements.json")  # what keep= copies of a finished run (not its
# checkpoint); measurements.json once compare() has measured it


def drive_folder() -> Path:
    """In Colab: mount Google Drive (Colab asks for permission once) and return MyDrive/minigate-runs, the folder
    lesson 03 copies finished models to and lesson 04 reads them from. Elsewhere a ValueError: runs/ stays on disk."""
    if "google.colab" not in sys.modules:
        raise ValueError("DRIVE = True is for Colab; on your own machine the models stay in runs/, where lesson 04 "
                         "finds them: set DRIVE = False")
    from google.colab import drive  # noqa: PLC0415 (Colab only)

    drive.mount(str(DRIVE))
    return DRIVE / "MyDrive" / "minigate-runs"


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


class Grow(GrowView):
    """The three models of one seed, grown in run folders under `root`. steps / sets: shorter runs and --set
    overrides (the tests' few steps; the course's runs use the recipe as it is). keep: a folder the finished trio is
    copied to (drive_folder() in Colab)."""

    _started: list[subprocess.Popen] = []  # the background processes this process started (start())

    def __init__(self, seed: int = 0, preset: str | None = None, root="runs", steps: int | None = None,
                 sets: dict | None = None, keep=None):
        self.preset = preset or recipe_for()
        self.seed, self.steps, self.sets = int(seed), steps, dict(sets or {})
        # the three run folders (runs.RunFolder: an unknown preset is refused there), their logs, the lock
        self.base = RunFolder(root, self.preset, "none", self.seed).base
        self.keep = None if keep is None else Path(keep) / self.base.name

    def run_folder(self, variant: str) -> RunFolder:
        """One model's run (runs.RunFolder): runs/P-seedN/NAME, its log beside it, its `minigate train` command."""
        return RunFolder(self.base.parent, self.preset, variant, self.seed)

    def folder(self, variant: str) -> Path:
        return self.run_folder(variant).path

    def log(self, variant: str) -> Path:
        return self.run_folder(variant).log

    def command(self, variant: str) -> list[str]:
        """The `minigate train` command of one model (as `python -m minigate.cli`, the same entry point)."""
        return self.run_folder(variant).command("--progress", "json", sets=self.sets, steps=self.steps)

    def done(self, variant: str) -> bool:
        return self.run_folder(variant).finished

    def finished(self) -> bool:
        return all(self.done(v) for v in VARIANTS)

    def running(self) -> bool:
        """Whether a background process holds this seed's folder (it trains, or is about to). Reads the lock's holder,
        never takes the lock: a status check cannot make the background process fail."""
        _reap()  # a dead child not yet waited for still has its pid, and would be taken for the holder
        return lock_holder(self.base) is not None

    def start(self) -> str:
        """Train the unfinished models one after another in one background process; returns what it did."""
        if self.finished():
            self.copy_kept()
            return f"all three models of seed {self.seed} are trained: {self.base}"
        if self.running():
            return f"already training in the background: {self.base}"
        self.base.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "minigate.course.grow", "--seed", str(self.seed), "--preset", self.preset,
               "--root", str(self.base.parent)] + (["--steps", str(self.steps)] if self.steps else [])
        cmd += [a for k, v in self.sets.items() for a in ("--set", f"{k}={v}")]
        cmd += ["--keep", str(self.keep.parent)] if self.keep else []
        detach = {"creationflags": subprocess.CREATE_NEW_PROCESS_GROUP} if os.name == "nt" else {
            "start_new_session": True}  # its own process group, which outlives the notebook's kernel; stop() ends it
        with open(self.base / "grow.log", "a") as log:
            process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, **detach)
        Grow._started.append(process)
        for _ in range(300):  # until it holds the lock: a start() right after this one starts nothing
            if self.running() or process.poll() is not None:
                break
            time.sleep(0.1)
        if process.poll():
            return f"the background process stopped at once (exit {process.returncode}); see {self.base / 'grow.log'}"
        todo = [NAMES[v] for v in VARIANTS if not self.done(v)]
        return f"training {', '.join(todo)} in the background, one after another: {self.base}"

    def stop(self, timeout: float = 300.0) -> str:
        """Stop the background process and the `minigate train` it runs: SIGTERM to their process group (CTRL_BREAK on
        Windows), so the model in training finishes its step and writes a checkpoint; waits until they have ended.
        start() resumes from there."""
        holder = lock_holder(self.base)
        if holder is None:
            return f"nothing is training {self.base}"
        processes = _tree(holder["pid"])  # the background process and its `minigate train`, before they end
        if os.name == "nt":
            os.kill(holder["pid"], signal.CTRL_BREAK_EVENT)  # the group started with CREATE_NEW_PROCESS_GROUP
        else:
            os.killpg(os.getpgid(holder["pid"]), signal.SIGTERM)
        t0 = time.monotonic()
        while self.running() or _any_running(processes):  # the lock goes a moment before the processes do
            if time.monotonic() - t0 > timeout:
                raise TimeoutError(f"{self.base}: process {holder['pid']} still runs {timeout:.0f} s after the stop "
                                   "signal; end it by hand")
            time.sleep(0.2)
        _reap()  # the background process, if this process started it: no zombie is left
        steps = ", ".join(f"{NAMES[v]} {p.state} at step {p.step}" for v, p in self.status().items())
        return f"stopped: {steps}; start() resumes the unfinished ones"

    def run(self) -> int:
        """The background process: each unfinished model in turn (a `minigate train` process each), holding the
        lock; then the finished trio is copied to `keep`. A stop signal (SIGTERM, Ctrl-C, CTRL_BREAK) reaches the
        `minigate train` of the model in training too, which checkpoints; then nothing more starts. Returns the
        first failing exit code, or 0."""
        stop = []
        signals = [s for s in ("SIGTERM", "SIGINT", "SIGBREAK") if hasattr(signal, s)]
        old = {s: signal.signal(getattr(signal, s), lambda n, f: stop.append(n)) for s in signals}
        try:
            with RunLock(self.base, timeout=60):  # start() may be reading who holds it at this moment: wait
                for variant in VARIANTS:
                    if self.done(variant) or stop:
                        continue
                    with open(self.log(variant), "a") as log:
                        rc = subprocess.run(self.command(variant), stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL).returncode
                    if rc != 0:
                        what = "stopped" if stop else f"minigate train exited with {rc}"
                        print(f"{NAMES[variant]}: {what}; see {self.log(variant)}", flush=True)
                        return rc
                if not stop:
                    self.copy_kept()
        finally:
            for s, handler in old.items():
                signal.signal(getattr(signal, s), handler)
        return 130 if stop else 0

    def copy_kept(self) -> Path | None:
        """Copy the finished trio's weights, run.json and history.json to `keep` (once; skipped without keep)."""
        if self.keep is None or not self.finished():
            return None
        for v in VARIANTS:
            src, dst = self.folder(v), self.keep / NAMES[v]
            if runs.finished(dst):
                continue
            part = dst.with_name(dst.name + ".part")  # a copy cut short (the runtime ended) is never taken for one
            shutil.rmtree(part, ignore_errors=True)
            part.mkdir(parents=True)
            for name in (n for n in KEPT if (src / n).exists()):
                (shutil.copytree if (src / name).is_dir() else shutil.copy2)(src / name, part / name)
            shutil.rmtree(dst, ignore_errors=True)
            part.rename(dst)
        return self.keep

    def progress(self, variant: str) -> Progress:
        """Where a run stands: the last step of its log's JSON progress lines or of its history.json, whichever is
        later."""
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
                tail = f.read().splitlines()
            last = next(filter(None, map(_progress_line, reversed(tail))), None)  # the latest one
            if last:
                step, steps = max(step, last["step"]), last["steps"]
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
        """{variant: measure.Measurement} of the three finished models on `prose` (measure.prose_windows: the windows
        the shipped models were measured on), named "yours-NAME"; None until all three are finished."""
        if not self.finished():
            return None
        return {v: measure.measure_folder(self.folder(v), prose, device, name=f"yours-{NAMES[v]}") for v in VARIANTS}

    def estimate(self, steps: int = 6, warmup: int = 3, device: str | None = None) -> dict[str, float]:
        """Minutes per model on this machine: `warmup` + `steps` training steps of each model on random tokens, with
        the configs its run will have (the recipe and this Grow's `sets`: its precision, and torch.compile where the
        recipe compiles), timed in this process; the warmup steps (allocation, bf16 kernels and the compile built on
        first use) are left out, and the median step times the recipe's steps. Evaluations and the tracker add a few
        percent. About half a minute on a CPU; run it before the models train, not beside them."""
        from ..model import Transformer
        from ..run import configs
        from ..train import train  # the library's trainer, as the runs use it

        minutes = {}
        for variant in VARIANTS:
            model_cfg, train_cfg = configs(self.preset, variant, sets={k: str(v) for k, v in self.sets.items()},
                                           steps=self.steps)
            total = warmup + steps
            timed = dataclasses.replace(train_cfg, steps=total, eval_every=total, eval_batches=1, ckpt_every=0,
                                        ckpt_minutes=0, warmup_steps=1, **({"device": device} if device else {}))
            row = train_cfg.batch_size * (train_cfg.seq_len + 1)  # the tokens of one batch
            torch.manual_seed(self.seed)
            model = Transformer(model_cfg)
            ids = torch.randint(0, model_cfg.vocab_size, (row * (total + 1),))
            h = train(model, ids, ids[: row * 2], timed, progress=False)
            tokens = train_cfg.tokens_per_step
            minutes[NAMES[variant]] = train_cfg.steps * tokens / statistics.median(h.tokens_per_s[warmup:]) / 60
        return minutes


def _reap():
    """Wait for the background processes this process started that have ended (Popen.poll), so that none stays a
    zombie: an ended process that its parent has not waited for keeps its pid, and the OS still lists it."""
    for process in Grow._started:
        process.poll()


def _progress_line(line: bytes) -> dict | None:
    """A line `minigate train --progress json` wrote, {"step": 520, "steps": 4000, ...}; None for any other line of
    the log (a message, or the first line of a tail that a read cut in two)."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record if isinstance(record, dict) and {"step", "steps"} <= record.keys() else None


def _tree(pid: int) -> list[psutil.Process]:
    """Process `pid` and every process under it ([] if it has ended). The background process waits for its
    `minigate train`, so once these have ended nothing of the run is left."""
    try:
        process = psutil.Process(pid)
        return [process, *process.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _any_running(processes: list[psutil.Process]) -> bool:
    """Whether any of `processes` still runs. One that ended but its parent has not waited for yet (a zombie) has
    ended; is_running() also tells a new process that took an ended one's pid from it."""
    for process in processes:
        try:
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            continue
        except psutil.AccessDenied:  # it runs, out of this process's reach
            return True
    return False


def find_grown(seed: int = 0, roots=("runs",)) -> Grow | None:
    """The learner's finished trio of `seed`, of either recipe, in the first root that has one: runs/ (where lesson 03
    grew it) or a kept copy (drive_folder() in Colab, when another runtime grew it). None when there is none."""
    for root in roots:
        for preset in RECIPES:
            grow = Grow(seed=seed, preset=preset, root=root)
            if grow.finished():
                return grow
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m minigate.course.grow", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--preset", help=f"default: {GPU_RECIPE} on a CUDA GPU, else {CPU_RECIPE}")
    ap.add_argument("--root", default="runs")
    ap.add_argument("--steps", type=int, help="shorter runs (tests)")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE")
    ap.add_argument("--keep", help="copy the finished trio here (e.g. a Google Drive folder)")
    args = ap.parse_args(argv)
    sets = dict(s.split("=", 1) for s in args.set)
    return Grow(args.seed, args.preset, args.root, args.steps, sets, keep=args.keep).run()


if __name__ == "__main__":
    sys.exit(main())
